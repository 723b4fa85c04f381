"""The training log as Caffe's tools/extra scripts read it: glog's prefix on every line written
to a file or a pipe, the message texts they grep, and the fields their awk picks. The regular
expressions are the scripts' own (parse_log.py, extract_seconds.py, parse_log.sh)."""
from __future__ import annotations

import datetime
import re

import pytest
from support import TINY_NET as NET
from support import TINY_SOLVER as SOLVER
from support import cli_process

from caffe_py.commands.output import GLOG_PREFIX

# parse_log.py's
ITERATION = re.compile(r"Iteration (\d+)")
TRAIN_OUTPUT = re.compile(r"Train net output #(\d+): (\S+) = ([\.\deE+-]+)")
TEST_OUTPUT = re.compile(r"Test net output #(\d+): (\S+) = ([\.\deE+-]+)")
LEARNING_RATE = re.compile(r"lr = ([-+]?[0-9]*\.?[0-9]+([eE]?[-+]?[0-9]+)?)")


def extract_datetime(line: str) -> datetime.datetime:
    """extract_seconds.py's extract_datetime_from_line."""
    fields = line.strip().split()
    month, day = int(fields[0][1:3]), int(fields[0][3:])
    stamp = fields[1]
    pos = stamp.rfind(".")
    hour, minute, second = (int(x) for x in stamp[:pos].split(":"))
    return datetime.datetime(2026, month, day, hour, minute, second, int(stamp[pos + 1:]))


@pytest.fixture
def log(tmp_path):
    (tmp_path / "net.yaml").write_text(NET)
    (tmp_path / "solver.yaml").write_text(SOLVER)
    proc = cli_process(tmp_path, "train", "--solver", "solver.yaml", "--log-file", "run.log")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return tmp_path, out.splitlines()


def test_every_line_of_a_piped_log_has_glogs_prefix_and_the_scripts_read_it(log):
    tmp_path, lines = log
    assert lines and [line for line in lines if not GLOG_PREFIX.match(line)] == []
    solving = [line for line in lines if "] Solving " in line]  # parse_log.sh's grep
    assert len(solving) == 1
    start = extract_datetime(solving[0])
    times = [extract_datetime(line) for line in lines]
    assert times == sorted(times) and times[0] <= start <= times[-1]
    iterations = [int(m.group(1)) for line in lines if (m := ITERATION.search(line))]
    assert sorted(set(iterations)) == [0, 5, 10, 15, 20]
    train = [TRAIN_OUTPUT.search(line).groups() for line in lines if "Train net output" in line]
    assert [(n, name) for n, name, _ in train] == [("0", "loss")] * 4
    rates = [float(m.group(1)) for line in lines if ", lr = " in line
             if (m := LEARNING_RATE.search(line))]
    assert rates == [0.05] * 4
    tests = [TEST_OUTPUT.search(line).groups()[:2] for line in lines if "Test net output" in line]
    assert tests == [("0", "acc"), ("1", "loss")] * 3  # iterations 0, 10, 20
    # parse_log.sh: the test value is awk's $11, the learning rate's $9
    assert [line.split()[10] for line in lines if "Test net output #0" in line] == \
        [v for _, name, v in (TEST_OUTPUT.search(line).groups() for line in lines
                              if "Test net output #0" in line)]
    assert [line.split()[8] for line in lines if ", lr = " in line] == ["0.05"] * 4
    assert (tmp_path / "run.log").read_text().splitlines()[-1].endswith("] Optimization Done.")


def test_plain_format_and_unprefixed_errors(tmp_path):
    (tmp_path / "net.yaml").write_text(NET)
    (tmp_path / "solver.yaml").write_text(SOLVER)
    proc = cli_process(tmp_path, "train", "--solver", "solver.yaml", "--log-format", "plain")
    out, _ = proc.communicate(timeout=120)
    assert out.splitlines()[0] == "Using cpu" and out.splitlines()[-1] == "Optimization Done."
    proc = cli_process(tmp_path, "train", "--solver", "missing.yaml")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err.startswith("Error: ") and len(err.splitlines()) == 1
