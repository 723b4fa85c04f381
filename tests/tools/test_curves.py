"""cpy plot: the series read from a metrics table, from caffe-py's log and from a Caffe log,
and the picture drawn from them."""
from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from support import TINY_NET as NET
from support import TINY_SOLVER as SOLVER

from caffe_py.cli import cli
from caffe_py.tools.curves import PlotError, plot, read_run

pytest.importorskip("matplotlib")

CAFFE_LOG = """\
I0210 13:39:20.000000 25210 solver.cpp:280] Solving LeNet
I0210 13:39:20.100000 25210 solver.cpp:337] Iteration 0, Testing net (#0)
I0210 13:39:20.500000 25210 solver.cpp:404]     Test net output #0: accuracy = 0.0925
I0210 13:39:20.500000 25210 solver.cpp:404]     Test net output #1: loss = 2.3 (* 1 = 2.3 loss)
I0210 13:39:20.600000 25210 solver.cpp:228] Iteration 0, loss = 2.29
I0210 13:39:20.600000 25210 solver.cpp:244]     Train net output #0: loss = 2.29 (* 1 = 2.29 loss)
I0210 13:39:20.600000 25210 sgd_solver.cpp:106] Iteration 0, lr = 0.01
I0210 13:39:22.381027 25210 solver.cpp:228] Iteration 100, loss = 0.21
I0210 13:39:22.381027 25210 sgd_solver.cpp:106] Iteration 100, lr = 0.00992565
"""


def test_a_caffe_log_is_read_as_parse_log_reads_it(tmp_path):
    (tmp_path / "caffe.log").write_text(CAFFE_LOG)
    series = read_run(tmp_path / "caffe.log")
    assert series["loss"] == [(0, pytest.approx(0.6), 2.29), (100, pytest.approx(2.381027),
                                                               0.21)]
    assert series["test0/accuracy"] == [(0, pytest.approx(0.5), 0.0925)]
    assert [p[2] for p in series["lr"]] == [0.01, 0.00992565]


def test_plot_draws_the_tables_and_the_logs_numbers(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(NET)
    (tmp_path / "solver.yaml").write_text(SOLVER)
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml", "--log-file",
                                      "run.log"])
    assert result.exit_code == 0, result.output
    table, log = read_run("snaps/tiny"), read_run("run.log")
    assert [p[2] for p in table["loss"]] == [p[2] for p in log["loss"]]  # the final one too
    assert [p[2] for p in table["test0/acc"]] == [p[2] for p in log["test0/acc"]]
    result = CliRunner().invoke(cli, ["plot", "snaps/tiny", "run.log", "-o", "curves.png",
                                      "--y", "acc,lr"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "wrote curves.png: lr, test0/acc of 2 run(s)\n"
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    drawn = plot(["snaps/tiny"], tmp_path / "c.svg", x="seconds", names=["acc"])
    assert [v for _, v in drawn["test0/acc"]["snaps/tiny"]] == \
        [p[2] for p in table["test0/acc"]]
    with pytest.raises(PlotError, match="^none of nope is in the runs"):
        plot(["snaps/tiny"], tmp_path / "x.png", names=["nope"])
    # matplotlib's traceback for .txt; a name without an extension became NAME.png, and
    # /dev/full a new /dev/full.png
    for out in ("curves.txt", "curves", "/dev/full"):
        with pytest.raises(PlotError) as info:
            plot(["snaps/tiny"], out, names=["acc"])
        assert str(info.value) == (f"{out}: cpy plot writes png, svg, pdf images, chosen by "
                                   "the file's extension; name the file with one of them "
                                   "(e.g. curves.png)")
    assert not Path("curves.png.png").exists() and not Path("/dev/full.png").exists()
    result = CliRunner().invoke(cli, ["plot", "missing", "-o", "x.png"])
    assert (result.exit_code, result.stderr.strip()) == (
        1, "Error: missing: no such metrics table, snapshot prefix or log; give "
           "<snapshot_prefix>_metrics.csv, the prefix, or a training log")
