"""The run layer: one train() for every kind of run, the checks made once, the strategy picked."""
from __future__ import annotations

import logging

import pytest
import torch
import yaml

from caffe_py.errors import SolverError
from caffe_py.options import TrainOptions
from caffe_py.solver.solver import Solver
from caffe_py.spec.solver_spec import load_solver
from caffe_py.strategies import MultiHost, Replicated, SingleDevice, choose_strategy
from caffe_py.train import prepared, train

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


LMDB_SOLVER = """
net_param:
  name: lmdb
  layer:
    - {name: data, type: Data, top: [data, label],
       data_param: {source: DB, batch_size: BATCH}, transform_param: {scale: 0.0625}}
    - {name: ip, type: InnerProduct, bottom: data, top: ip,
       inner_product_param: {num_output: 3, weight_filler: {type: xavier}}}
    - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
base_lr: 0.1
momentum: 0.9
max_iter: 4
random_seed: 5
snapshot_after_train: false
snapshot_prefix: PREFIX
"""


def test_one_and_two_replicas_train_through_the_same_entry_point(monkeypatch, tmp_path):
    """2 replicas x batch 4 through train() give the weights of 1 replica x batch 8."""
    import numpy as np
    from support import write_records

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    rng = np.random.default_rng(0)
    db = write_records(tmp_path / "db", [(rng.integers(0, 16, (1, 2, 3)).astype(np.uint8), i % 3)
                                         for i in range(40)])

    def solver(batch, name):
        path = tmp_path / f"{name}.yaml"
        path.write_text(LMDB_SOLVER.replace("DB", db).replace("BATCH", str(batch))
                        .replace("PREFIX", str(tmp_path / name / "s")))
        return load_solver(path)

    one = train(solver(8, "one"), ["cpu"])
    two = train(solver(4, "two"), ["cpu", "cpu"])
    assert isinstance(one, Solver) and isinstance(two, Solver)
    assert (one.iter, two.iter) == (4, 4)
    for a, b in zip(one.net.learnable_params(), two.net.learnable_params(), strict=True):
        torch.testing.assert_close(b.param, a.param, rtol=1e-5, atol=1e-6)
    assert not one.net.layer_by_name("ip").blobs()[0].equal(
        train(solver(4, "half"), ["cpu"]).net.layer_by_name("ip").blobs()[0])


def test_bad_options_are_refused_when_made():
    with pytest.raises(SolverError, match="^reduction 'ring' is not one of auto, tree, nccl$"):
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
        weights = []
        for run in ("a", "b"):
            result = CliRunner().invoke(cli, ["train", "--solver", "s4.yaml", "--deterministic",
                                              "--set", f"snapshot_prefix={run}/s",
                                              "--set", "snapshot_after_train=true"])
            assert result.exit_code == 0, result.output
            assert "Optimization Done." in result.output
            weights.append(torch.load(tmp_path / run / "s_iter_3.pt")["layers"]["ip"])
        assert all(a.equal(b) for a, b in zip(*weights, strict=True))
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


# --- cpy train and caffe_py.train_solver: one run layer -------------------------------------
TINY_NET = """\
name: tiny
layer:
  - {name: data, type: DummyData, top: [data, label],
     dummy_data_param: {shape: [{dim: [4, 6]}, {dim: [4]}],
                        data_filler: [{type: gaussian}, {type: uniform, min: 0, max: 2.99}]}}
  - {name: ip, type: InnerProduct, bottom: data, top: ip,
     inner_product_param: {num_output: 3, weight_filler: {type: xavier}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
"""
TINY_SOLVER = """\
net: net.yaml
base_lr: 0.05
max_iter: MAX
display: 2
snapshot: 2
snapshot_prefix: snaps/tiny
random_seed: SEED
"""


def _timeless(lines):
    """Log lines without what differs between two runs: rates and times."""
    import re

    return [re.sub(r"\(\S+ iter/s, \S+s/\d+ iters\)", "(rate)", line) for line in lines]


class _Both:
    """One solver run through ``cpy train`` in ``cli/`` and ``train_solver`` in ``api/``."""

    def __init__(self, root, monkeypatch, caplog):
        self.root, self.monkeypatch, self.caplog = root, monkeypatch, caplog
        caplog.set_level(logging.INFO, logger="caffe_py")
        for way in ("cli", "api"):
            (root / way).mkdir()
            (root / way / "net.yaml").write_text(TINY_NET)
        self.solver(max_iter=4)

    def solver(self, max_iter):
        for way in ("cli", "api"):
            (self.root / way / "solver.yaml").write_text(
                TINY_SOLVER.replace("MAX", str(max_iter)).replace("SEED", "7"))

    def cli(self, *args):
        """(exit status, lines, error) of ``cpy train --solver solver.yaml ARGS``."""
        from click.testing import CliRunner

        from caffe_py.cli import cli

        self.monkeypatch.chdir(self.root / "cli")
        result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml", *args])
        lines = result.stderr.strip().splitlines()
        error = lines.pop().removeprefix("Error: ") if result.exit_code else ""
        return result.exit_code, lines, error

    def api(self, **options):
        """(exit status, lines, error) of ``train_solver("solver.yaml", **options)``."""
        import caffe_py
        from caffe_py.errors import CaffePyError

        self.monkeypatch.chdir(self.root / "api")
        self.caplog.clear()
        try:
            caffe_py.train_solver("solver.yaml", **options)
            code, error = 0, ""
        except CaffePyError as exc:
            code, error = 1, str(exc)
        return code, "\n".join(self.caplog.messages).splitlines(), error

    def same(self, cli_args, **api_options):
        got_cli, got_api = self.cli(*cli_args), self.api(**api_options)
        assert got_cli[0] == got_api[0]
        assert _timeless(got_cli[1]) == [line.replace(str(self.root / "api"),
                                                      str(self.root / "cli"))
                                         for line in _timeless(got_api[1])]
        assert got_cli[2] == got_api[2].replace(str(self.root / "api"), str(self.root / "cli"))
        return got_cli

    def files(self, way):
        return sorted(p.relative_to(self.root / way).as_posix()
                      for p in (self.root / way).rglob("*") if p.is_file())


def test_cpy_train_and_train_solver_run_the_same_policies(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    both = _Both(tmp_path, monkeypatch, caplog)
    code, lines, _ = both.same(["--gpus", "cpu"], devices="cpu")
    assert code == 0 and lines[0] == "Using cpu" and lines[-1] == "Optimization Done."
    assert both.files("cli") == both.files("api") == [
        "net.yaml", "snaps/tiny_iter_2.pt", "snaps/tiny_iter_2.solverstate.pt",
        "snaps/tiny_iter_4.pt", "snaps/tiny_iter_4.solverstate.pt", "snaps/tiny_metrics.csv",
        "snaps/tiny_net.yaml", "snaps/tiny_solver.yaml", "solver.yaml"]
    # a new run over the snapshots: refused alike
    code, _, error = both.same([])
    assert code == 1 and error == (
        f"snapshot_prefix {tmp_path / 'cli' / 'snaps' / 'tiny'} already has snapshots (the "
        "newest: tiny_iter_4.solverstate.pt); resume with --snapshot latest, start over with "
        "--overwrite, or change snapshot_prefix")
    # resume the newest state: the first run's files stay, the resume writes its own
    both.solver(max_iter=6)
    code, lines, _ = both.same(["--snapshot", "latest"], snapshot="latest")
    assert code == 0 and "Iteration 6, loss = " in " ".join(lines)
    assert f"--snapshot latest: {tmp_path / 'cli' / 'snaps' / 'tiny_iter_4.solverstate.pt'}" \
        in lines
    for way in ("cli", "api"):
        first = yaml.safe_load((tmp_path / way / "snaps/tiny_solver.yaml").read_text())
        resumed = yaml.safe_load((tmp_path / way / "snaps/tiny_resume_4_solver.yaml")
                                 .read_text())
        assert (first["max_iter"], resumed["max_iter"]) == (4, 6)
        assert resumed["net"] == "tiny_resume_4_net.yaml"
    assert both.files("cli") == both.files("api")
    # --overwrite starts over
    code, _, _ = both.same(["--overwrite"], overwrite=True)
    assert code == 0


def test_a_second_run_on_a_live_prefix_is_refused_naming_its_pid(tmp_path, monkeypatch, caplog):
    import os

    from caffe_py.fileio import PathLock

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    both = _Both(tmp_path, monkeypatch, caplog)
    held = [PathLock(tmp_path / way / "snaps" / "tiny", "x", "y").acquire()
            for way in ("cli", "api")]
    try:
        code, _, error = both.same([])
    finally:
        for lock in held:
            lock.release()
    prefix = tmp_path / "cli" / "snaps" / "tiny"
    assert code == 1 and error == (
        f"snapshot_prefix {prefix} is in use by another process (pid {os.getpid()}, holding "
        f"{prefix}.lock); wait for that run to end, or change snapshot_prefix")
    # the live run's files were not touched by the refused one
    assert both.files("cli") == ["net.yaml", "solver.yaml"]


def test_train_solver_prints_the_lines_on_stderr_unless_logging_is_configured(tmp_path):
    import subprocess
    import sys

    (tmp_path / "net.yaml").write_text(TINY_NET)
    (tmp_path / "solver.yaml").write_text(TINY_SOLVER.replace("MAX", "2").replace("SEED", "1"))
    code = ("import caffe_py, logging, sys\n"
            "if sys.argv[1] == 'configured': logging.basicConfig(level=logging.WARNING)\n"
            "caffe_py.train_solver('solver.yaml', devices='cpu', overwrite=True)\n")
    plain = subprocess.run([sys.executable, "-c", code, "plain"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert plain.returncode == 0, plain.stderr
    lines = plain.stderr.splitlines()
    assert lines[:2] == ["Using cpu", "Random seed: " + lines[1].split(": ")[1]]
    assert lines[-1] == "Optimization Done." and plain.stdout == ""
    quiet = subprocess.run([sys.executable, "-c", code, "configured"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert (quiet.returncode, quiet.stderr, quiet.stdout) == (0, "", "")


def test_a_resume_of_a_clock_seeded_run_keeps_its_seed_and_trains_as_a_straight_run(
        tmp_path, monkeypatch):
    import caffe_py

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(TINY_NET)
    (tmp_path / "solver.yaml").write_text(TINY_SOLVER.replace("MAX", "2").replace("SEED", "-1"))
    caffe_py.train_solver("solver.yaml", devices="cpu")
    seed = yaml.safe_load((tmp_path / "snaps/tiny_solver.yaml").read_text())["random_seed"]
    assert 0 <= seed < 2**31
    resumed = caffe_py.train_solver("solver.yaml", devices="cpu", snapshot="latest",
                                    sets=["max_iter=4"])
    assert yaml.safe_load((tmp_path / "snaps/tiny_resume_2_solver.yaml").read_text())[
        "random_seed"] == seed
    straight = caffe_py.train_solver("solver.yaml", devices="cpu", sets=[
        "max_iter=4", f"random_seed={seed}", "snapshot_prefix=straight/tiny"])
    for a, b in zip(resumed.net.learnable_params(), straight.net.learnable_params(),
                    strict=True):
        assert a.param.equal(b.param)
