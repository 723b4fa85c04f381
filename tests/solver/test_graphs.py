"""CUDA graphs for a replica's step: when a step cannot be captured it says why and stays eager
(CPU); on a GPU the captured step gives the eager step's weights (test_gpu.py)."""
from __future__ import annotations

import logging

import pytest
import torch

from caffe_py.errors import SolverError
from caffe_py.options import TrainOptions
from caffe_py.parallel import ReplicatedRun
from caffe_py.solver.graphs import GraphedStep, capture_blocker
from caffe_py.solver.solver import Solver
from caffe_py.spec.solver_spec import load_solver

DUMMY = """
net_param:
  name: dummy
  layer:
    - {{name: data, type: DummyData, top: [data, label],
       dummy_data_param: {{shape: [{{dim: [4, 3]}}, {{dim: [4]}}],
                          data_filler: [{{type: {filler}}}, {{type: constant}}]}}}}
    - {{name: ip, type: InnerProduct, bottom: data, top: ip,
       inner_product_param: {{num_output: 2, weight_filler: {{type: xavier}}}}}}
    - {{name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}}
base_lr: 0.1
max_iter: 3
random_seed: 3
solver_mode: CPU
snapshot_after_train: false
snapshot_prefix: {prefix}
"""


def _param(tmp_path, filler):
    path = tmp_path / f"{filler}.yaml"
    path.write_text(DUMMY.format(filler=filler, prefix=tmp_path / "s"))
    return load_solver(path)


def test_reasons_a_step_cannot_be_captured(tmp_path):
    solver = Solver(_param(tmp_path, "gaussian"))
    assert capture_blocker(solver) == "the net runs on cpu, not CUDA"
    solver.device = torch.device("cuda", 0)   # only the reason is asked: nothing runs there
    # the net was built on the CPU: its DummyData draws from a host generator (on a GPU the
    # generator lives there and each replay draws anew)
    assert capture_blocker(solver) == "layer 'data' draws from a host generator (_gen)"
    solver = Solver(_param(tmp_path, "constant"))
    solver.device = torch.device("cuda", 0)
    assert capture_blocker(solver) is None


def test_a_step_that_cannot_be_captured_says_why_and_trains_as_the_eager_one(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")
    with Solver(_param(tmp_path, "uniform"), step=GraphedStep()) as solver:
        solver.solve()
        graphed = [lp.param.detach().clone() for lp in solver.net.learnable_params()]
    assert [m for m in caplog.messages if m.startswith("CUDA graphs")] == [
        "CUDA graphs off for replica 0 (cpu): the net runs on cpu, not CUDA; running "
        "eagerly"]
    with Solver(_param(tmp_path, "uniform")) as solver:
        solver.solve()
        eager = [lp.param.detach() for lp in solver.net.learnable_params()]
    assert all(torch.equal(a, b) for a, b in zip(graphed, eager, strict=True))
    with pytest.raises(SolverError, match=r"^--graphs on: replica 0 \(cpu\) cannot be captured: "
                                          r"the net runs on cpu, not CUDA; use --graphs "
                                          r"auto to run it eagerly$"):
        with Solver(_param(tmp_path, "uniform"), step=GraphedStep(required=True)) as solver:
            solver.solve()


def test_cpu_replicas_make_no_graphs_whatever_the_option(tmp_path):
    for graphs in ("auto", "on", "off"):
        with ReplicatedRun(_param(tmp_path, "constant"), ["cpu"] * 2,
                           TrainOptions(graphs=graphs)) as run:
            assert run.graphs == []


def test_cpy_train_graphs_on_is_ignored_on_cpu_with_a_note(tmp_path):
    from click.testing import CliRunner

    from caffe_py.cli import cli

    _param(tmp_path, "constant")
    solver = str(tmp_path / "constant.yaml")
    for gpus in ("cpu", "cpu:2"):
        for flag in (["--graphs", "on"], ["--cuda-graphs"]):
            result = CliRunner().invoke(cli, ["train", "--solver", solver, "--gpus", gpus, *flag])
            assert result.exit_code == 0, result.output
            assert ("Note: --graphs on applies to CUDA devices only; training on cpu without "
                    "graphs") in result.output
            assert "CUDA graphs off" not in result.output
            assert "Optimization Done." in result.output
    for flag in (["--no-cuda-graphs"], ["--graphs", "off"], []):
        result = CliRunner().invoke(cli, ["train", "--solver", solver, *flag])
        assert result.exit_code == 0, result.output
        assert "--graphs" not in result.output and "CUDA graphs" not in result.output
    result = CliRunner().invoke(cli, ["train", "--solver", solver, "--graphs", "off",
                                      "--cuda-graphs"])
    assert result.exit_code == 1
    assert "--graphs off and --cuda-graphs disagree; give --graphs alone" in result.output


def test_start_files_are_checked_before_a_graphed_run(tmp_path):
    import pytest

    from caffe_py.errors import SolverError
    from caffe_py.train import check_start_files

    with pytest.raises(SolverError, match=r"^x\.solverstate\.pt is a solver state, not weights"):
        check_start_files(TrainOptions(weights=["x.solverstate.pt"]))
    with pytest.raises(SolverError, match=r"^w\.pt is not a solver state"):
        check_start_files(TrainOptions(snapshot="w.pt"))
    missing = tmp_path / "m.caffemodel"
    with pytest.raises(SolverError, match=f"^{missing}: file not found; check the path$"):
        check_start_files(TrainOptions(weights=[str(missing)]))


def test_a_python_layer_keeps_the_step_eager():
    from caffe_py.layers.python import Python

    assert Python.capturable is False
