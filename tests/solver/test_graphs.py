"""CUDA graphs for a replica's step: when a step cannot be captured it says why and stays eager
(CPU); on a GPU the captured step gives the eager step's weights (test_gpu.py)."""
from __future__ import annotations

import logging

import torch

from caffe_py.options import TrainOptions
from caffe_py.parallel import ReplicatedRun
from caffe_py.solver.graphs import uncapturable_reason
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
    assert uncapturable_reason(solver) == "the replica runs on cpu, not CUDA"
    solver.device = torch.device("cuda", 0)   # only the reason is asked: nothing runs there
    # the net was built on the CPU: its DummyData draws from a host generator (on a GPU the
    # generator lives there and each replay draws anew)
    assert uncapturable_reason(solver) == "layer 'data' draws from a host generator (_gen)"
    solver = Solver(_param(tmp_path, "constant"))
    solver.device = torch.device("cuda", 0)
    assert uncapturable_reason(solver) is None


def test_cpu_replicas_fall_back_to_eager_and_train_the_same(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")
    with ReplicatedRun(_param(tmp_path, "uniform"), ["cpu"] * 2,
                       TrainOptions(cuda_graphs=True)) as run:
        run.run()
        graphed = [lp.param.detach().clone() for lp in run.root.net.learnable_params()]
    assert sorted(m for m in caplog.messages if m.startswith("CUDA graphs")) == [
        f"CUDA graphs off for replica {i} (cpu): the replica runs on cpu, not CUDA; running "
        "eagerly" for i in (0, 1)]
    with ReplicatedRun(_param(tmp_path, "uniform"), ["cpu"] * 2) as run:
        run.run()
        eager = [lp.param.detach() for lp in run.root.net.learnable_params()]
    assert all(torch.equal(a, b) for a, b in zip(graphed, eager, strict=True))


def test_options_field_turns_graphs_on(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")
    with ReplicatedRun(_param(tmp_path, "constant"), ["cpu"] * 2,
                       TrainOptions(cuda_graphs=True)) as run:
        assert len(run.graphs) == 2
        run.run()
    assert sum(m.startswith("CUDA graphs off for replica") for m in caplog.messages) == 2
    with ReplicatedRun(_param(tmp_path, "constant"), ["cpu"] * 2, TrainOptions()) as run:
        assert run.graphs == []


def test_cpy_train_cuda_graphs_flag_is_ignored_on_cpu_with_a_note(tmp_path):
    from click.testing import CliRunner

    from caffe_py.cli import cli

    _param(tmp_path, "constant")
    solver = str(tmp_path / "constant.yaml")
    for gpus in ("cpu", "cpu:2"):
        result = CliRunner().invoke(cli, ["train", "--solver", solver, "--gpus", gpus,
                                          "--cuda-graphs"])
        assert result.exit_code == 0, result.output
        assert ("Note: --cuda-graphs applies to CUDA devices only; training on cpu without "
                "graphs") in result.output
        assert "CUDA graphs off" not in result.output
        assert "Optimization Done." in result.output
    result = CliRunner().invoke(cli, ["train", "--solver", solver, "--no-cuda-graphs"])
    assert result.exit_code == 0, result.output
    assert "--cuda-graphs" not in result.output


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
