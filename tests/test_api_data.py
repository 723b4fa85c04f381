"""The user's own data from Python: ``train_solver(..., inputs={"data": x, "label": y})``
(a MemoryData layer) and a torch-native dataset layer (caffe_py.layers.python.DatasetLayer),
each trained as a user would, resumed exactly, and shared by replicas as Caffe's DataReader
shares a database."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from support import error_line

import caffe_py
from caffe_py.errors import NetError, SolverError

MEMORY_NET = """\
name: memory
layer:
  - {name: data, type: MemoryData, top: [data, label],
     memory_data_param: {batch_size: BATCH, channels: 3, height: 2, width: 1}}
  - {name: ip, type: InnerProduct, bottom: data, top: ip,
     inner_product_param: {num_output: 3, weight_filler: {type: xavier}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
"""
SOLVER = """\
net: net.yaml
base_lr: 0.1
momentum: 0.9
max_iter: MAX
snapshot: SNAP
snapshot_prefix: PREFIX
random_seed: 5
"""


@pytest.fixture
def arrays():
    rng = np.random.default_rng(1)
    return rng.normal(size=(24, 3, 2, 1)).astype(np.float32), rng.integers(0, 3, 24)


def write(tmp_path, net, batch=4, max_iter=6, snapshot=0, prefix="snaps/m"):
    (tmp_path / "net.yaml").write_text(net.replace("BATCH", str(batch)))
    (tmp_path / "solver.yaml").write_text(SOLVER.replace("MAX", str(max_iter)).replace(
        "SNAP", str(snapshot)).replace("PREFIX", prefix))
    return tmp_path / "solver.yaml"


def weights(solver):
    return [lp.param.detach().clone() for lp in solver.net.learnable_params()]


def test_train_solver_takes_numpy_arrays(tmp_path, monkeypatch, arrays):
    """inputs= feeds the MemoryData layer: the numbers of the Solver fed by hand, a resume
    that reads on from the saved row, and 2 replicas x 4 rows = 1 replica x 8."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    x, y = arrays
    solver = write(tmp_path, MEMORY_NET, snapshot=3)
    trained = caffe_py.train_solver(solver, inputs={"data": x, "label": y})
    assert trained.iter == 6 and trained.net.layer_by_name("data").position == 0  # 6 x 4 = 24

    from caffe_py.solver.solver import Solver
    from caffe_py.spec.solver_spec import load_solver

    with Solver(load_solver(write(tmp_path, MEMORY_NET, prefix="by_hand/m"))) as by_hand:
        by_hand.net.set_input_arrays(x, y)  # the internal path: pycaffe's name
        by_hand.solve()
    assert all(a.equal(b) for a, b in zip(weights(trained), weights(by_hand), strict=True))

    resumed = caffe_py.train_solver(solver, inputs={"data": x, "label": y},
                                    snapshot="snaps/m_iter_3.solverstate.pt")
    assert all(a.equal(b) for a, b in zip(weights(trained), weights(resumed), strict=True))
    first = caffe_py.train_solver(write(tmp_path, MEMORY_NET, max_iter=3, prefix="cut/m"),
                                  inputs={"data": x, "label": y})
    assert not all(a.equal(b) for a, b in zip(weights(first), weights(trained), strict=True))
    state = torch.load("snaps/m_iter_3.solverstate.pt", weights_only=True)
    assert state["sources"]["train"] == {"data": {"position": 12}}

    one = caffe_py.train_solver(write(tmp_path, MEMORY_NET, batch=8, max_iter=3,
                                      prefix="one/m"), inputs={"data": x, "label": y})
    two = caffe_py.train_solver(write(tmp_path, MEMORY_NET, batch=4, max_iter=3,
                                      prefix="two/m"), devices="cpu:2",
                                inputs={"data": x, "label": y})
    for a, b in zip(weights(one), weights(two), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_inputs_for_a_net_without_a_memory_layer_are_one_line(tmp_path, monkeypatch, arrays):
    monkeypatch.chdir(tmp_path)
    x, y = arrays
    solver = write(tmp_path, MEMORY_NET)
    with pytest.raises(SolverError) as err:
        caffe_py.train_solver(solver, inputs={"images": x, "label": y})
    assert str(err.value) == ("inputs images, label: the TRAIN net 'memory' has no MemoryData "
                              "layer with exactly those tops; its MemoryData layers: 'data' "
                              "(data, label)")
    with pytest.raises(NetError) as err:
        caffe_py.train_solver(solver, inputs={"data": x[:18], "label": y[:18]})
    assert str(err.value) == (f"{tmp_path / 'net.yaml'}:3: layer[0]: layer 'data' (MemoryData): "
                              "was given 18 rows, not a multiple of batch_size 4; pass a "
                              "multiple of 4 rows")


DATASET_MODULE = """\
import torch
from torch.utils.data import TensorDataset

from caffe_py.layers.python import DatasetLayer


class Points(DatasetLayer):
    batch_size = 4

    def dataset(self):
        g = torch.Generator().manual_seed(2)
        x = torch.randn(18, 3, generator=g)
        return TensorDataset(x, (x.sum(1) > 0).long() + (x[:, 0] > 1).long())
"""
DATASET_NET = """\
name: points
layer:
  - {name: data, type: Python, top: [data, label],
     python_param: {module: api_points, layer: Points, param_str: "PARAMS"}}
  - {name: ip, type: InnerProduct, bottom: data, top: ip,
     inner_product_param: {num_output: 3, weight_filler: {type: xavier}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
"""


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_dataset_layer_resumes_exactly_and_shards_over_replicas(tmp_path, monkeypatch,
                                                                  shuffle):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "api_points.py").write_text(DATASET_MODULE)
    net = DATASET_NET.replace("PARAMS", f"{{batch_size: BATCH, shuffle: {str(shuffle).lower()}}}")
    straight = caffe_py.train_solver(write(tmp_path, net, max_iter=10, snapshot=5))
    state = torch.load("snaps/m_iter_5.solverstate.pt", weights_only=True)
    assert state["sources"]["train"] == {"data": {"position": 20}}  # 5 x 4: into epoch 2
    resumed = caffe_py.train_solver(write(tmp_path, net, max_iter=10, snapshot=5),
                                    snapshot="snaps/m_iter_5.solverstate.pt")
    assert all(a.equal(b) for a, b in zip(weights(straight), weights(resumed), strict=True))

    one = caffe_py.train_solver(write(tmp_path, net, batch=8, max_iter=4, prefix="one/m"))
    two = caffe_py.train_solver(write(tmp_path, net, batch=4, max_iter=4, prefix="two/m"),
                                devices="cpu:2")
    for a, b in zip(weights(one), weights(two), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_a_dataset_layer_reads_in_order_or_one_permutation_per_epoch(tmp_path, monkeypatch):
    from caffe_py.net import Net
    from caffe_py.spec.net_spec import load_net

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "api_ordered.py").write_text(DATASET_MODULE.replace(
        "TensorDataset(x, (x.sum(1) > 0).long() + (x[:, 0] > 1).long())",
        "TensorDataset(x, torch.arange(18))"))
    def labels(shuffle, seed=0, replica=0, replicas=1, batches=9):
        (tmp_path / "net.yaml").write_text(DATASET_NET.replace(
            "PARAMS", f"{{shuffle: {shuffle}}}").replace("module: api_points",
                                                          "module: api_ordered"))
        net = Net(load_net(tmp_path / "net.yaml"), "TRAIN")
        net.bind_sources(seed, replica, replicas)
        source = net.layers[0]
        return [int(v) for _ in range(batches) for v in source()[1].tolist()]

    in_order = labels("false")
    assert in_order == [i % 18 for i in range(36)]
    shuffled = labels("true", seed=7)
    assert sorted(shuffled[:18]) == list(range(18)) and sorted(shuffled[18:]) == list(range(18))
    assert shuffled[:18] != list(range(18)) and shuffled[:18] != shuffled[18:]
    assert labels("true", seed=7) == shuffled and labels("true", seed=8) != shuffled
    halves = [labels("true", seed=7, replica=r, replicas=2, batches=2) for r in (0, 1)]
    assert halves[0] == shuffled[0:16:2] and halves[1] == shuffled[1:16:2]


def test_a_dataset_layer_without_a_batch_size_is_one_line(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from caffe_py.cli import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "api_unsized.py").write_text(DATASET_MODULE.replace("    batch_size = 4\n", ""))
    write(tmp_path, DATASET_NET.replace("PARAMS", "shuffle: true").replace(
        "module: api_points", "module: api_unsized"))
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml"])
    assert result.exit_code == 1
    assert error_line(result.stderr) == (
        f"Error: {tmp_path / 'net.yaml'}:3: layer[0]: layer 'data' (Python): "
        "api_unsized.Points.setup raised ValueError: batch_size is 0; set it (a class "
        "attribute, or param_str 'batch_size: 64') to a number >= 1")
