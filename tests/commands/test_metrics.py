"""<snapshot_prefix>_metrics.csv: one row per display and per test pass, the numbers the log
prints, columns fixed by the nets' outputs, the final iteration's row last; a resume appends,
its seconds going on from the solver state's."""
from __future__ import annotations

import csv

import pytest
import torch
from click.testing import CliRunner
from support import TINY_NET as NET
from support import TINY_SOLVER as SOLVER

from caffe_py.cli import cli
from caffe_py.solver.metrics import seconds_at


def rows(path):
    with path.open(newline="") as f:
        return list(csv.reader(f))


def test_the_metrics_file_holds_what_the_log_prints(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(NET)
    (tmp_path / "solver.yaml").write_text(SOLVER.replace("snapshot_after_train: false",
                                                         "snapshot: 10"))
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml"])
    assert result.exit_code == 0, result.output
    table = rows(tmp_path / "snaps" / "tiny_metrics.csv")
    assert table[0] == ["iteration", "seconds", "phase", "lr", "loss", "train/loss",
                        "test0/acc", "test0/loss"]
    assert [(r[0], r[2]) for r in table[1:]] == [
        ("0", "test0"), ("0", "train"), ("5", "train"), ("10", "test0"), ("10", "train"),
        ("15", "train"), ("20", "train"), ("20", "test0")]
    lines = result.stderr.splitlines()
    printed = [line.split(" = ")[1].split()[0] for line in lines if "Train net output #0" in line]
    assert [r[5] for r in table[1:] if r[2] == "train"][:-1] == printed
    smoothed = [line.rsplit(" = ", 1)[1] for line in lines
                if line.startswith("Iteration ") and ("iter/s" in line or ", loss = " in line)]
    assert [r[4] for r in table[1:] if r[2] == "train"] == smoothed
    assert f"Iteration 20, loss = {table[-2][4]}" in lines  # the final row's loss
    accuracy = [line.split(" = ")[1].split()[0] for line in lines if "Test net output #0" in line]
    assert [r[6] for r in table[1:] if r[2] == "test0"] == accuracy
    assert all(r[3] == "0.05" for r in table[1:])
    seconds = [float(r[1]) for r in table[1:]]
    assert seconds == sorted(seconds)
    # resuming from iteration 10 appends the rows after it
    (tmp_path / "solver.yaml").write_text(SOLVER.replace("max_iter: 20", "max_iter: 30"))
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml", "--snapshot",
                                      "snaps/tiny_iter_10.solverstate.pt"])
    assert result.exit_code == 0, result.output
    again = rows(tmp_path / "snaps" / "tiny_metrics.csv")
    assert again[:len(table)] == table
    assert [(r[0], r[2]) for r in again[len(table):]] == [
        ("10", "test0"), ("10", "train"), ("15", "train"), ("20", "test0"), ("20", "train"),
        ("25", "train"), ("30", "train"), ("30", "test0")]
    # the resumed rows' clock goes on from the time the state recorded
    state = torch.load(tmp_path / "snaps" / "tiny_iter_10.solverstate.pt", weights_only=True)
    assert float(table[5][1]) >= state["seconds"] > float(table[3][1])  # iteration 10's
    resumed = [float(r[1]) for r in again[len(table):]]
    assert resumed == sorted(resumed) and state["seconds"] <= resumed[0] < state["seconds"] + 5


def test_seconds_of_a_state_without_them_come_from_the_table(tmp_path):
    """Caffe's own solver states keep no clock: the table's row at or before the iteration."""
    path = tmp_path / "m.csv"
    path.write_text("iteration,seconds,phase\n0,0.5,test0\n10,2.250,train\n20,4.0,train\n")
    assert (seconds_at(path, 10), seconds_at(path, 15), seconds_at(path, 25)) == (2.25, 2.25, 4.0)
    assert (seconds_at(path, -1), seconds_at(tmp_path / "none.csv", 5)) == (0.0, 0.0)


def test_tensorboard_gets_the_tables_values(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(NET)
    (tmp_path / "solver.yaml").write_text(SOLVER)
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml", "--tensorboard", "tb"])
    assert result.exit_code == 0, result.output
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    table = rows(tmp_path / "snaps" / "tiny_metrics.csv")
    accuracy = [(int(r[0]), float(r[6])) for r in table[1:] if r[2] == "test0"]
    assert [(e.step, pytest.approx(e.value)) for e in events.Scalars("test0/acc")] == accuracy
    assert {"loss", "lr", "train/loss", "test0/acc", "test0/loss"} <= set(
        events.Tags()["scalars"])
