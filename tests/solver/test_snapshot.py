"""Snapshot files: names, atomic writes, safe loads, and clear errors for the wrong file."""
from __future__ import annotations

import os
import pickle

import pytest
import torch

from caffe_py.errors import SolverError
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
        raise OSError("disk full")

    monkeypatch.setattr(snap.torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        snap.save_weights({"ip": [torch.zeros(2)]}, path)
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
