"""caffe_py.pycaffe's solvers over caffe-py's Solver: step, updates in the diffs, the TEST
nets' weights, snapshots and restore, get_solver, random_seed."""
from __future__ import annotations

import struct

import numpy as np
import pytest

import caffe_py.pycaffe as caffe
from caffe_py.tools.convert import convert_idx

NET = """
layer {{ name: "data" type: "Data" top: "data" top: "label"
  transform_param {{ scale: 0.00390625 }}
  data_param {{ source: "{source}" batch_size: {batch} backend: LMDB }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  param {{ lr_mult: 1 }} param {{ lr_mult: 2 }}
  inner_product_param {{ num_output: 3 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "drop" type: "Dropout" bottom: "ip" top: "ip"
  dropout_param {{ dropout_ratio: 0.25 }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""
SOLVER = """
train_net: "train.prototxt"
test_net: "test.prototxt"
test_iter: 2
test_interval: 3
base_lr: 0.1
momentum: 0.9
lr_policy: "fixed"
max_iter: 6
display: 0
snapshot_prefix: "snap/run"
random_seed: 7
type: "{kind}"
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    rng = np.random.RandomState(0)
    images = rng.randint(0, 256, (40, 4, 4)).astype(np.uint8)
    labels = rng.randint(0, 3, 40).astype(np.uint8)
    (tmp_path / "img").write_bytes(struct.pack(">IIII", 2051, 40, 4, 4) + images.tobytes())
    (tmp_path / "lbl").write_bytes(struct.pack(">II", 2049, 40) + labels.tobytes())
    convert_idx(tmp_path / "img", tmp_path / "lbl", tmp_path / "db")
    (tmp_path / "train.prototxt").write_text(NET.format(source="db", batch=8))
    (tmp_path / "test.prototxt").write_text(NET.format(source="db", batch=5))
    (tmp_path / "snap").mkdir()
    for kind in ("SGD", "Adam"):
        (tmp_path / f"{kind}.prototxt").write_text(SOLVER.format(kind=kind))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_step_leaves_the_update_in_the_diffs_and_the_last_batch_in_the_blobs(workdir):
    solver = caffe.SGDSolver("SGD.prototxt")
    before = solver.net.params["ip"][0].data.copy()
    solver.step(1)
    assert solver.iter == 1
    np.testing.assert_allclose(solver.net.params["ip"][0].diff,
                               before - solver.net.params["ip"][0].data, atol=1e-7)
    assert solver.net.blobs["data"].data.shape == (8, 1, 4, 4)
    assert solver.net.blobs["loss"].data.shape == ()
    assert float(solver.net.blobs["loss"].data) > 0
    assert solver.lr == pytest.approx(0.1)


def test_test_nets_have_their_own_weights_until_the_first_test(workdir):
    solver = caffe.SGDSolver("SGD.prototxt")
    train, test = solver.net.params["ip"][0].data, solver.test_nets[0].params["ip"][0].data
    assert not np.array_equal(train, test)  # each drew its own fillers, as in Caffe
    solver.step(1)  # iteration 0 tests (test_initialization): the weights are shared since
    np.testing.assert_array_equal(solver.test_nets[0].params["ip"][0].data,
                                  solver.net.params["ip"][0].data)
    solver.test_nets[0].forward()
    assert solver.test_nets[0].blobs["data"].data.shape == (5, 1, 4, 4)


def test_explicit_share_with_shares_a_test_net(workdir):
    solver = caffe.SGDSolver("SGD.prototxt")
    solver.test_nets[0].share_with(solver.net)
    solver.net.params["ip"][1].data[...] = 4
    assert solver.test_nets[0].params["ip"][1].data[0] == 4


def test_random_seed_repeats_the_weights_and_the_run(workdir):
    """Fillers and Dropout masks come from Caffe's one random stream, which a solver's
    random_seed seeds: a second solver made after the first trained repeats it exactly."""
    one = caffe.SGDSolver("SGD.prototxt")
    start = one.net.params["ip"][0].data.copy()
    one.step(2)
    two = caffe.SGDSolver("SGD.prototxt")
    np.testing.assert_array_equal(two.net.params["ip"][0].data, start)
    two.step(2)
    np.testing.assert_array_equal(one.net.params["ip"][0].data, two.net.params["ip"][0].data)


def test_get_solver_follows_the_file_and_the_classes_force_their_rule(workdir):
    assert type(caffe.get_solver("Adam.prototxt")).__name__ == "AdamSolver"
    assert type(caffe.get_solver("SGD.prototxt")).__name__ == "SGDSolver"
    sgd = caffe.SGDSolver("Adam.prototxt")
    assert sgd.param.type == "SGD" and isinstance(sgd, caffe.Solver)


def test_snapshot_writes_caffes_files_and_restore_resumes(workdir):
    solver = caffe.SGDSolver("SGD.prototxt")
    solver.step(2)
    solver.snapshot()
    assert sorted(p.name for p in (workdir / "snap").iterdir()) == [
        "run_iter_2.caffemodel", "run_iter_2.solverstate"]
    other = caffe.SGDSolver("SGD.prototxt")
    other.restore("snap/run_iter_2.solverstate")
    assert other.iter == 2
    np.testing.assert_array_equal(other.net.params["ip"][0].data,
                                  solver.net.params["ip"][0].data)


def test_solve_trains_to_max_iter(workdir):
    solver = caffe.SGDSolver("SGD.prototxt")
    solver.solve()
    assert solver.iter == 6
    assert (workdir / "snap" / "run_iter_6.caffemodel").exists()


def test_an_uncovered_solver_attribute_is_one_line(workdir):
    solver = caffe.SGDSolver("SGD.prototxt")
    with pytest.raises(AttributeError, match=r"^caffe.Solver.stepp is not covered by "
                                             r"caffe-py's pycaffe; the nearest covered name "
                                             r"is caffe.Solver.step "):
        solver.stepp(1)
