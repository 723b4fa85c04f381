"""The run layer: one train() for every kind of run, the checks made once, the strategy picked."""
from __future__ import annotations

import logging

import pytest
import torch

from caffe_py.errors import SolverError
from caffe_py.options import TrainOptions
from caffe_py.parallel.multihost import MultiHost
from caffe_py.parallel.replicated import Replicated
from caffe_py.solver.solver import Solver
from caffe_py.spec.solver_spec import load_solver
from caffe_py.train import SingleDevice, choose_strategy, prepared, train

SOLVER = """
net_param:
  name: dummy
  layer:
    - {name: data, type: DummyData, top: [data, label],
       dummy_data_param: {shape: [{dim: [4, 3]}, {dim: [4]}],
                          data_filler: [{type: gaussian}, {type: constant}]}}
    - {name: ip, type: InnerProduct, bottom: data, top: ip,
       inner_product_param: {num_output: 2, weight_filler: {type: xavier}}}
    - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
base_lr: 0.1
max_iter: 3
random_seed: SEED
snapshot_after_train: false
snapshot_prefix: snaps/s
"""

CPU = torch.device("cpu")


@pytest.fixture
def solver_file(tmp_path):
    def make(seed=3):
        path = tmp_path / f"s{seed}.yaml"
        path.write_text(SOLVER.replace("SEED", str(seed)))
        return load_solver(path)
    return make


def test_the_strategy_follows_the_devices_and_the_launcher(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert isinstance(choose_strategy([CPU], TrainOptions()), SingleDevice)
    assert isinstance(choose_strategy([CPU, CPU], TrainOptions()), Replicated)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    hosts = choose_strategy([CPU], TrainOptions())
    assert isinstance(hosts, MultiHost) and hosts.leads is False


def test_graphs_on_cpu_are_turned_off_with_one_note(monkeypatch, caplog):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    caplog.set_level(logging.INFO, logger="caffe_py")
    strategy = choose_strategy([CPU, CPU], TrainOptions(graphs="on"))
    assert strategy.options.graphs == "off"
    assert caplog.messages == ["Note: --graphs on applies to CUDA devices only; training on "
                               "cpu without graphs"]
    caplog.clear()
    assert choose_strategy([CPU], TrainOptions()).options.graphs == "off"
    assert caplog.messages == []


def test_prepared_fixes_a_clock_seed_once_and_applies_the_precision(solver_file):
    param = prepared(solver_file(seed=-1), TrainOptions(precision="BF16"))
    assert 0 <= param.random_seed < 2**31 and param.precision == "BF16"
    kept = prepared(solver_file(seed=11), TrainOptions())
    assert (kept.random_seed, kept.precision) == (11, "FLOAT32")


def test_one_and_two_replicas_train_through_the_same_entry_point(solver_file, monkeypatch,
                                                                 tmp_path):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.chdir(tmp_path)
    one = train(solver_file(), ["cpu"])
    two = train(solver_file(), ["cpu", "cpu"])
    assert isinstance(one, Solver) and isinstance(two, Solver)
    assert (one.iter, two.iter) == (3, 3)
    assert not one.net.layer_by_name("ip").blobs()[0].equal(
        two.net.layer_by_name("ip").blobs()[0])  # a batch of 8 is not a batch of 4


def test_bad_options_are_refused_when_made():
    with pytest.raises(SolverError, match="^reduction 'ring' is not one of tree, nccl$"):
        TrainOptions(reduction="ring")
    with pytest.raises(SolverError, match="^sigint_effect 'kill' is not one of stop, snapshot, "
                                          "snapshot-stop, none$"):
        TrainOptions(sigint_effect="kill")
    with pytest.raises(SolverError, match="^dist_backend 'mpi' is not one of nccl, gloo$"):
        TrainOptions(dist_backend="mpi")


def test_deterministic_sets_cudnn_and_torch_and_the_cli_takes_both_flags(solver_file, tmp_path,
                                                                        monkeypatch):
    from click.testing import CliRunner

    from caffe_py.cli import cli
    from caffe_py.train import make_deterministic

    saved = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.are_deterministic_algorithms_enabled())
    try:
        make_deterministic()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert torch.are_deterministic_algorithms_enabled()
        monkeypatch.chdir(tmp_path)
        solver_file(seed=4)
        result = CliRunner().invoke(cli, ["train", "--solver", "s4.yaml", "--deterministic"])
        assert result.exit_code == 0, result.output
        assert "Optimization Done." in result.output
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved[:2]
        torch.use_deterministic_algorithms(saved[2])


@pytest.mark.slow
def test_a_compiled_step_trains_as_the_eager_one(solver_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    eager = train(solver_file(seed=6), ["cpu"])
    compiled = train(solver_file(seed=6), ["cpu"], TrainOptions(compile=True))
    for a, b in zip(eager.net.learnable_params(), compiled.net.learnable_params(), strict=True):
        torch.testing.assert_close(a.param, b.param, rtol=1e-5, atol=1e-6)
