"""caffe-py's data layers against the genuine Caffe 1.0 (fixtures by make_data_golden.py): the
same records, in the same order, with the same transforms, from the same inputs and seed;
databases and mean files that Caffe's tools wrote read here, and ones caffe-py wrote read by
Caffe (and still written the same way today)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from data_cases import CASES, FIXTURE, INPUTS, net_dict

from caffe_py.io import ReaderPool, attach_feeds
from caffe_py.net import Net
from caffe_py.spec.net_spec import parse_net
from caffe_py.spec.schema import Source

pytest.importorskip("plyvel")
pytest.importorskip("h5py")


@pytest.fixture(scope="module")
def caffe():
    with np.load(FIXTURE) as f:
        return dict(f)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A copy of the inputs (opening a LevelDB writes its LOG and MANIFEST)."""
    copy = tmp_path_factory.mktemp("golden") / "inputs"
    shutil.copytree(INPUTS, copy)
    return copy


def caffe_py_batches(case: dict, inputs, device: str = "cpu") -> dict[str, np.ndarray]:
    spec = parse_net(net_dict(case), Source(str(inputs / "net.yaml"), inputs))
    net = Net(spec, case["phase"], seed=case["seed"], device=device)
    tops: dict[str, list[np.ndarray]] = {top: [] for top in case["layer"]["top"]}
    with ReaderPool() as pool:
        attach_feeds(net, pool, seed=case["seed"], device=device)
        pool.start()
        for _ in range(case["forwards"]):
            out = net().outputs
            for top in tops:
                tops[top].append(out[top].to("cpu", torch.float32).numpy())
    return {top: np.stack(values) for top, values in tops.items()}


def assert_caffes(name: str, caffe: dict, inputs, device: str = "cpu") -> None:
    case = CASES[name]
    ours = caffe_py_batches(case, inputs, device)
    for top in case["compare"]:
        theirs = caffe[f"{name}/{top}"]
        assert ours[top].shape == theirs.shape, top
        np.testing.assert_array_equal(ours[top], theirs, err_msg=f"{name}: {top}")


@pytest.mark.parametrize("name", list(CASES))
def test_data_layer_gives_caffes_batches(name, caffe, inputs):
    assert_caffes(name, caffe, inputs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", list(CASES))
def test_data_layer_gives_caffes_batches_on_cuda(name, caffe, inputs):
    """The same batches through the CUDA feeds (pinned staging, transforms on the device)."""
    assert_caffes(name, caffe, inputs, "cuda")


def test_databases_caffe_py_writes_are_the_ones_caffe_read(tmp_path):
    """cpy convert imageset and compute-mean write today what the committed files (which Caffe
    read into the data_ours_* batches) hold, record for record."""
    from caffe_py.io.db.db import open_db
    from caffe_py.tools.convert import ImagesetOptions, convert_imageset
    from caffe_py.tools.mean import compute_mean

    for backend in ("lmdb", "leveldb"):
        convert_imageset(INPUTS, INPUTS / "images.txt", tmp_path / backend,
                         ImagesetOptions(resize_height=6, resize_width=8), backend=backend)
        shutil.copytree(INPUTS / f"ours_{backend}", tmp_path / f"committed_{backend}")
        with open_db(tmp_path / backend, backend) as now, \
                open_db(tmp_path / f"committed_{backend}", backend) as then:
            assert list(now.records()) == list(then.records())
    compute_mean(tmp_path / "lmdb", tmp_path / "mean.binaryproto")
    assert (tmp_path / "mean.binaryproto").read_bytes() == \
        (INPUTS / "ours_mean.binaryproto").read_bytes()


def test_caffes_and_caffe_py_s_databases_hold_the_same_records(inputs):
    """convert_imageset and cpy convert imageset: the same keys and Datum bytes."""
    from caffe_py.io.db.db import open_db

    for backend in ("lmdb", "leveldb"):
        with open_db(inputs / f"images_{backend}", backend) as caffe_db, \
                open_db(inputs / f"ours_{backend}", backend) as ours:
            assert list(caffe_db.records()) == list(ours.records())


def test_hdf5_output_writes_caffes_file_and_appends_later_forwards(inputs):
    import h5py
    from data_cases import HDF5_OUTPUT_NET

    spec = parse_net(HDF5_OUTPUT_NET, Source(str(inputs / "net.yaml"), inputs))
    net = Net(spec, "TEST")
    with ReaderPool() as pool:
        attach_feeds(net, pool, seed=1)
        pool.start()
        net()
        with h5py.File(inputs / "hdf5_output.h5") as ours, \
                h5py.File(inputs / "hdf5_output_caffe.h5") as theirs:
            assert sorted(ours) == sorted(theirs) == ["data", "label"]
            for name in ours:
                assert ours[name].dtype == theirs[name].dtype == np.float32
                np.testing.assert_array_equal(ours[name][()], theirs[name][()])
        net()  # Caffe 1.0 fails here (its datasets exist); caffe-py appends
        with h5py.File(inputs / "hdf5_output.h5") as ours:
            assert ours["data"].shape == (6, 2, 3, 1) and ours["label"].shape == (6, 1, 1, 1)
