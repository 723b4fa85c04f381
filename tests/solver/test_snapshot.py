"""Snapshot files: names, atomic writes, safe loads, and clear errors for the wrong file."""
from __future__ import annotations

import errno
import os
import pickle

import pytest
import torch

from caffe_py.errors import SolverError, WriteError
from caffe_py.solver import snapshot as snap


def test_paths_have_no_zero_padding():
    assert snap.snapshot_paths("out/lenet", 5000) == (
        snap.Path("out/lenet_iter_5000.pt"), snap.Path("out/lenet_iter_5000.solverstate.pt"))
    assert snap.is_state_path("a_iter_1.solverstate.pt")
    assert snap.is_state_path("a_iter_1.solverstate")
    assert not snap.is_state_path("a_iter_1.pt")


def test_weights_round_trip_by_layer(tmp_path):
    blobs = {"conv1": [torch.arange(6.0).reshape(2, 3), torch.ones(2)], "ip": [torch.zeros(1)]}
    path = tmp_path / "w.pt"
    snap.save_weights(blobs, path)
    back = snap.load_weights(path)
    assert list(back) == ["conv1", "ip"]
    assert torch.equal(back["conv1"][0], blobs["conv1"][0])
    assert not list(tmp_path.glob("*.tmp"))


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "w.pt"
    snap.save_weights({"ip": [torch.ones(2)]}, path)

    def broken_save(obj, f):
        f.write(b"PK\x03\x04 half a zip")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(snap.torch, "save", broken_save)
    with pytest.raises(WriteError) as err:
        snap.save_weights({"ip": [torch.zeros(2)]}, path)
    assert str(err.value) == (f"no space left on device writing {path}; free space or write "
                              "elsewhere (nothing was replaced)")
    assert torch.equal(snap.load_weights(path)["ip"][0], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["w.pt"]


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch EXPLOITED",))


def test_loading_never_runs_code_from_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "evil.pt"
    torch.save({"caffe_py": "weights", "version": 1, "layers": {"x": [Exploit()]}}, path)
    with pytest.raises(SolverError) as err:
        snap.load_weights(path)
    assert str(err.value).startswith(f"{path}: not a caffe-py snapshot that loads safely (")
    assert not (tmp_path / "EXPLOITED").exists()
    path.write_bytes(pickle.dumps(Exploit()))
    with pytest.raises(SolverError, match="not a caffe-py snapshot that loads safely"):
        snap.load_weights(path)
    assert not (tmp_path / "EXPLOITED").exists()


def test_truncated_file_is_a_one_line_error(tmp_path):
    path = tmp_path / "w.pt"
    snap.save_weights({"ip": [torch.ones(100)]}, path)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(SolverError, match=r"not a caffe-py snapshot that loads safely \("):
        snap.load_weights(path)


def test_a_truncated_zip_names_its_first_sentence_only(tmp_path):
    path = tmp_path / "w_iter_9.solverstate.pt"
    snap.save_state({"iter": 9, "current_step": 0, "history": []}, path)
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(SolverError) as err:
        snap.load_state(path)
    assert str(err.value) == (f"{path}: not a caffe-py snapshot that loads safely "
                              "(PytorchStreamReader failed reading zip archive: failed finding "
                              "central directory); give a file written by cpy train")


def test_swapped_files_say_which_flag_takes_them(tmp_path):
    weights, state = tmp_path / "a_iter_1.pt", tmp_path / "a_iter_1.solverstate.pt"
    snap.save_weights({"ip": [torch.ones(1)]}, weights)
    snap.save_state({"iter": 1, "current_step": 0, "history": []}, state)
    with pytest.raises(SolverError) as err:
        snap.load_weights(state)
    assert str(err.value) == (f"{state} is a solver state, not weights; pass it to --snapshot "
                              "to resume training, or give the matching weights file to "
                              "--weights")
    with pytest.raises(SolverError) as err:
        snap.load_state(weights)
    assert str(err.value).startswith(f"{weights} is not a solver state")
    renamed = tmp_path / "b.solverstate.pt"
    renamed.write_bytes(weights.read_bytes())
    with pytest.raises(SolverError) as err:
        snap.load_state(renamed)
    assert str(err.value) == (f"{renamed}: holds weights, which --snapshot does not take; pass "
                              "weights to --weights and <prefix>_iter_<N>.solverstate.pt to "
                              "--snapshot")


def test_missing_file(tmp_path):
    with pytest.raises(SolverError) as err:
        snap.load_weights(tmp_path / "nope.pt")
    assert str(err.value) == f"{tmp_path / 'nope.pt'}: file not found; check the path"


def test_check_writable_creates_the_directory_and_fails_on_a_file(tmp_path):
    snap.check_writable(str(tmp_path / "new" / "dir" / "lenet"))
    assert (tmp_path / "new" / "dir").is_dir()
    assert not list((tmp_path / "new" / "dir").iterdir())
    (tmp_path / "f").write_text("")
    with pytest.raises(SolverError, match=r"^cannot write snapshots to '.*f/d' \(snapshot_prefix"):
        snap.check_writable(str(tmp_path / "f" / "d" / "p"))


def test_caffemodel_round_trip_and_caffe_names(tmp_path):
    assert snap.snapshot_paths("p", 7, "caffemodel") == (
        snap.Path("p_iter_7.caffemodel"), snap.Path("p_iter_7.solverstate"))
    blobs = {"conv1": [torch.randn(2, 1, 3, 3), torch.randn(2)], "ip": [torch.randn(3, 4)]}
    path = tmp_path / "m.caffemodel"
    snap.save_weights(blobs, path, {"conv1": "Convolution", "ip": "InnerProduct"}, "net")
    back = snap.load_weights(path)
    assert list(back) == ["conv1", "ip"]
    assert all(torch.equal(a, b) for k in blobs for a, b in zip(blobs[k], back[k], strict=True))
    state = {"iter": 12, "current_step": 2, "learned_net": "m.caffemodel", "type": "Adam",
             "history": [torch.randn(3), torch.randn(2, 2)],
             "rng": {"torch": torch.get_rng_state()}}
    spath = tmp_path / "m.solverstate"
    snap.save_state(state, spath)
    loaded = snap.load_state(spath)
    assert (loaded["iter"], loaded["current_step"], loaded["learned_net"], loaded["type"]) == (
        12, 2, "m.caffemodel", "Adam")
    assert torch.equal(loaded["history"][1], state["history"][1])
    assert torch.equal(loaded["rng"]["torch"], state["rng"]["torch"])


def test_reads_caffe_written_protobuf_by_hand():
    """A NetParameter as Caffe writes it: layer (100) {name, type, bottom, blobs {shape, data}}
    plus a legacy V1 'layers' (2) {name = 4, blobs = 6 with num/channels/height/width}."""
    import struct

    from caffe_py.io.formats.wire import len_field, tag, varint

    data = struct.pack("<3f", 1.0, 2.0, 3.0)
    shape = len_field(7, len_field(1, varint(1) + varint(3)))
    v2 = len_field(100, len_field(1, b"fc") + len_field(2, b"InnerProduct")
                   + len_field(3, b"data") + len_field(7, shape + len_field(5, data)))
    legacy = b"".join(tag(n, 0) + varint(v) for n, v in ((1, 1), (2, 1), (3, 1), (4, 2)))
    v1 = len_field(2, len_field(4, b"old") + len_field(6, legacy + len_field(5, data[:8])))
    layers = snap.caffemodel.decode_net(len_field(1, b"net") + v2 + v1, "x.caffemodel")
    assert layers["fc"][0].tolist() == [[1.0, 2.0, 3.0]]
    assert layers["old"][0].shape == (1, 1, 1, 2)


def test_garbage_caffemodel_is_a_one_line_error(tmp_path):
    path = tmp_path / "bad.caffemodel"
    path.write_bytes(b"\x0a\xff\xff\xff")
    with pytest.raises(SolverError, match=r"bad.caffemodel: not a Caffe NetParameter"):
        snap.load_weights(path)
    h5 = tmp_path / "w.caffemodel.h5"
    h5.write_bytes(b"")
    with pytest.raises(SolverError, match=r"w.caffemodel.h5: not an HDF5 file \(no HDF5 "
                                          r"signature\); give a Caffe .caffemodel.h5"):
        snap.load_weights(h5)


def test_hdf5_snapshots_get_a_plain_files_mode_and_no_temporary(tmp_path):
    """HDF5 files were 0600 (HDF5 wrote the mkstemp temporary); every other file caffe-py
    writes gets 0666 less the umask."""
    pytest.importorskip("h5py")
    from caffe_py.solver import hdf5_snapshot

    umask = os.umask(0o022)
    try:
        hdf5_snapshot.save_weights({"ip": [torch.ones(2, 3)]}, tmp_path / "w.caffemodel.h5")
    finally:
        os.umask(umask)
    assert oct((tmp_path / "w.caffemodel.h5").stat().st_mode & 0o777) == oct(0o644)
    assert [p.name for p in tmp_path.iterdir()] == ["w.caffemodel.h5"]
    assert torch.equal(hdf5_snapshot.load_weights(tmp_path / "w.caffemodel.h5")["ip"][0],
                       torch.ones(2, 3))


@pytest.mark.parametrize("field,value,shown", [
    ("iter", -5, "'iter' is -5, not an iteration count"),
    ("iter", True, "'iter' is True, not an iteration count"),
    ("iter", 2.5, "'iter' is 2.5, not an iteration count"),
    ("random_seed", 2**70, "'random_seed' is 1180591620717411303424, not a 64-bit integer"),
    ("seconds", float("nan"), "'seconds' is nan, not a time"),
    ("learned_net_file", {"size": "x", "crc32": None},
     "'learned_net_file' is {'size': 'x', 'crc32': None}, not a size and a CRC"),
])
def test_a_hand_edited_solver_state_is_refused_naming_the_entry(tmp_path, field, value, shown):
    """Each was re-saved whole (its checksums valid): a seed past 64 bits and a fingerprint of
    strings were tracebacks; a negative or boolean iteration and a NaN time trained on."""
    path = tmp_path / "s_iter_1.solverstate.pt"
    snap.save_state({"iter": 1, "current_step": 0, "history": [], field: value}, path)
    with pytest.raises(SolverError) as err:
        snap.load_state(path)
    assert str(err.value) == (f"{path}: the solver state is damaged ({shown}); resume from "
                              "another state")


@pytest.mark.parametrize("case,reason", [
    ("strings", "its values are |S3"),
    ("complex", "its values are complex64"),
    ("link", "'Unable to synchronously open object (component not found)'"),
])
def test_hdf5_weights_whose_blob_is_no_array_of_numbers_are_one_line(tmp_path, case, reason):
    """A dataset of strings or complex values, or a link to nothing: OSError and KeyError
    tracebacks from h5py before."""
    h5py = pytest.importorskip("h5py")
    import numpy as np

    from caffe_py.solver import hdf5_snapshot

    path = tmp_path / "w.caffemodel.h5"
    hdf5_snapshot.save_weights({"conv1": [torch.ones(2, 3)]}, path)
    with h5py.File(path, "a") as h5:
        del h5["data/conv1/0"]
        h5["data/conv1/0"] = {"strings": np.array([b"abc"]), "complex": np.ones(3, np.complex64),
                              "link": h5py.SoftLink("/nowhere")}[case]
    with pytest.raises(SolverError) as err:
        hdf5_snapshot.load_weights(path)
    assert str(err.value) == (f"{path}: layer 'conv1' blob 0 is not an array of numbers "
                              f"({reason}); the file is damaged: use another copy")
