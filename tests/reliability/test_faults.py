"""Faults while a run goes on, through the command line: a disk that fills up under the
snapshots or the log, an input read that stalls, and the limits a shared machine sets
(open files, address space, a container's memory). Each ends in one line on stderr, or in the
documented stop; never a traceback."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import ROOT, tiny_net

from caffe_py.solver import snapshot as snap

SOLVER = """\
net: net.yaml
base_lr: 0.05
momentum: 0.9
max_iter: {max_iter}
snapshot: {snapshot}
display: {display}
snapshot_prefix: {prefix}
random_seed: 3
"""


def cpy(cwd, *args, timeout=120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, **kwargs)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    """The command failed with exit 1 and exactly one line, 'Error: ...', on stderr."""
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr[-2000:]
    return lines[0]


def mounted_tmpfs(path, size: str):
    """A tmpfs of ``size`` at ``path`` (root only; the test is skipped elsewhere)."""
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    return path


@pytest.fixture
def disk(tmp_path):
    """A 7 MiB tmpfs: room for one snapshot pair of the wide net below (2.7 MiB each file),
    and 1.6 MiB more: the next weights file fills it, and once the failed write's temporary is
    gone more than 1 MiB is free again."""
    yield mounted_tmpfs(tmp_path / "disk", "7m")
    subprocess.run(["umount", str(tmp_path / "disk")], capture_output=True)


def test_a_snapshot_that_fills_a_real_disk_is_one_line(tmp_path, disk):
    """torch.save reports ENOSPC as a RuntimeError ('unexpected pos ...'); whether the disk is
    full is judged while the failed write still holds its space."""
    # 6 inputs x 100,000 outputs: 2.7 MiB of weights, as much again of momentum history
    (tmp_path / "net.yaml").write_text(tiny_net().replace("num_output: 3", "num_output: 100000"))
    (tmp_path / "solver.yaml").write_text(SOLVER.format(max_iter=6, snapshot=2, display=0,
                                                        prefix=disk / "t"))
    line = one_line_error(cpy(tmp_path, "train", "--solver", "solver.yaml"))
    state = disk / "t_iter_2.solverstate.pt"
    assert line == (f"Error: no space left on device writing {disk / 't_iter_4.pt'}"
                    f"; free space or write elsewhere (nothing was replaced); the previous "
                    f"snapshot {state} is intact (resume with --snapshot {state})")
    assert snap.load_state(state)["iter"] == 2
    assert not [p.name for p in disk.iterdir() if p.name.endswith(".tmp")]


@pytest.fixture
def tiny_run(tmp_path):
    (tmp_path / "net.yaml").write_text(tiny_net())
    (tmp_path / "solver.yaml").write_text(SOLVER.format(max_iter=3000, snapshot=0, display=1,
                                                        prefix="snaps/t"))
    return tmp_path


def test_a_full_log_disk_is_one_line(tiny_run):
    """--log-file on a full disk: at the first line (/dev/full), and in the middle of the run
    (a 32 KiB tmpfs that the display lines fill)."""
    line = one_line_error(cpy(tiny_run, "train", "--solver", "solver.yaml",
                              "--log-file", "/dev/full"))
    assert line == ("Error: no space left on device writing the log file /dev/full; free "
                    "space or give --log-file a place with room")
    logs = mounted_tmpfs(tiny_run / "logs", "32k")
    try:
        done = cpy(tiny_run, "train", "--solver", "solver.yaml", "--overwrite",
                   "--log-file", str(logs / "run.log"))
        assert (logs / "run.log").stat().st_size == 32768
    finally:
        subprocess.run(["umount", str(logs)], capture_output=True)
    assert one_line_error(done) == (f"Error: no space left on device writing the log file "
                                    f"{logs / 'run.log'}; free space or give --log-file a "
                                    "place with room")
    assert "Iteration 100, " in done.stdout   # it stopped in the middle, not at the start
