"""The training log as Caffe's tools/extra scripts read it: glog's prefix on every line written
to a file or a pipe, the message texts they grep, and the fields their awk picks. The regular
expressions are the scripts' own (parse_log.py, extract_seconds.py, parse_log.sh)."""
from __future__ import annotations

import datetime
import os
import re
import socket
import subprocess
import sys

import pytest
from support import ROOT, cli_process
from support import TINY_NET as NET
from support import TINY_SOLVER as SOLVER

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
    assert out == ""  # the log is on stderr, as Caffe's
    return tmp_path, err.splitlines()


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
    _, err = proc.communicate(timeout=120)
    assert err.splitlines()[0] == "Using cpu" and err.splitlines()[-1] == "Optimization Done."
    proc = cli_process(tmp_path, "train", "--solver", "missing.yaml")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and err.startswith("Error: ") and len(err.splitlines()) == 1


def test_glogs_environment_variables_act_as_on_caffes_tools(tmp_path):
    """GLOG_minloglevel drops lines below a severity, GLOG_log_dir writes glog's files (one
    per severity, with its header and the cpy.<SEVERITY> links), GLOG_logtostderr keeps the
    lines on stderr only; an error is in the files too, as Caffe's failed CHECK is."""
    (tmp_path / "net.yaml").write_text(NET)
    (tmp_path / "solver.yaml").write_text(SOLVER)
    env = {**os.environ, "GLOG_log_dir": str(tmp_path / "logs")}
    done = subprocess.run([sys.executable, str(ROOT / "cli.py"), "train", "--solver",
                           "solver.yaml"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    info = tmp_path / "logs" / "cpy.INFO"
    name = re.fullmatch(rf"cpy\.{re.escape(socket.gethostname())}\.[^.]+\.log\.INFO\."
                        r"\d{8}-\d{6}\.\d+", os.readlink(info))
    assert name is not None, os.readlink(info)
    text = info.read_text().splitlines()
    assert text[0].startswith("Log file created at: ") and text[1].startswith(
        "Running on machine: ")
    assert text[2] == "Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg"
    assert text[3:] == done.stderr.splitlines()  # the same prefixed lines as the pipe's
    assert sorted(p.name for p in (tmp_path / "logs").iterdir() if p.is_symlink()) == \
        ["cpy.INFO"]  # no warning or error line: no such file

    quiet = subprocess.run([sys.executable, str(ROOT / "cli.py"), "train", "--solver",
                            "solver.yaml", "--overwrite"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120,
                           env={**env, "GLOG_minloglevel": "1", "GLOG_logtostderr": "1",
                                "GLOG_log_dir": str(tmp_path / "quiet")})
    assert (quiet.returncode, quiet.stderr, quiet.stdout) == (0, "", "")
    assert not (tmp_path / "quiet").exists()

    failed = subprocess.run([sys.executable, str(ROOT / "cli.py"), "train", "--solver",
                             "solver.yaml", "--weights", "nope.pt"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert (failed.returncode, failed.stderr) == (1, "Error: nope.pt: file not found; check "
                                                     "the path\n")
    for severity in ("INFO", "WARNING", "ERROR"):
        last = (tmp_path / "logs" / f"cpy.{severity}").read_text().splitlines()[-1]
        assert GLOG_PREFIX.match(last) and last.startswith("E")
        assert last.endswith("] nope.pt: file not found; check the path")

    bad = subprocess.run([sys.executable, str(ROOT / "cli.py"), "train", "--solver",
                          "solver.yaml"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "GLOG_minloglevel": "x"})
    assert (bad.returncode, bad.stderr) == (1, "Error: GLOG_minloglevel 'x' is not a number; use "
                                               "0 (INFO), 1 (WARNING), 2 (ERROR) or 3 (FATAL)\n")


def test_an_error_is_the_last_line_of_the_log_file(tmp_path):
    (tmp_path / "net.yaml").write_text(NET)
    (tmp_path / "solver.yaml").write_text(SOLVER)
    proc = cli_process(tmp_path, "train", "--solver", "solver.yaml", "--log-file", "run.log",
                       "--snapshot", "latest")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    *log, error = err.splitlines()
    assert error.startswith("Error: --snapshot latest: no solver state") and log
    lines = (tmp_path / "run.log").read_text().splitlines()
    assert lines[:-1] == log  # the log file holds what stderr showed, then the error
    assert lines[-1].startswith("E") and lines[-1].endswith(f"] {error[len('Error: '):]}")
