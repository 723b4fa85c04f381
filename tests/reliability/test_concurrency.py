"""One snapshot_prefix, one run: real `cpy train` processes on one prefix, and a resume from a
solver state whose weights file another run wrote.

The run holds ``<prefix>.lock`` (flock) for its life: a second run is refused in one line
naming the live one's pid, before it reads or removes anything under the prefix."""
from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path

import pytest
from support import bare_lines, cli_process, tiny_net, wait_for

import caffe_py
from caffe_py.errors import SolverError
from caffe_py.solver import snapshot as snap

SOLVER = """\
net: net.yaml
base_lr: 0.05
momentum: 0.9
max_iter: {max_iter}
display: {display}
snapshot: {snapshot}
snapshot_prefix: snaps/tiny
random_seed: {seed}
"""


def work_dir(path: Path, max_iter=10**7, display=20, snapshot=20, seed=3) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "net.yaml").write_text(tiny_net())
    (path / "solver.yaml").write_text(SOLVER.format(max_iter=max_iter, display=display,
                                                    snapshot=snapshot, seed=seed))
    return path


def refusal(work: Path, pid: int) -> str:
    prefix = work / "snaps" / "tiny"
    return (f"Error: snapshot_prefix {prefix} is in use by another process (pid {pid}, "
            f"holding {prefix}.lock); wait for that run to end, or change snapshot_prefix")


def finish(proc) -> list[str]:
    """Stop a live run with SIGINT (Caffe's stop: a final snapshot); its stdout lines."""
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return bare_lines(out)


@pytest.mark.slow
def test_two_runs_started_together_on_one_prefix(tmp_path):
    """Both with --overwrite, as two people starting the same script: one trains, the other
    is refused naming it; the snapshots and the metrics are the one run's."""
    work = work_dir(tmp_path)
    procs = [cli_process(work, "train", "--solver", "solver.yaml", "--overwrite")
             for _ in range(2)]
    try:
        loser = next(p for p in _first_to_end(procs))
        winner = next(p for p in procs if p is not loser)
        _, err = loser.communicate(timeout=60)
        assert loser.returncode == 1
        assert err.strip() == refusal(work, winner.pid)
        wait_for(winner, "Iteration 40 (", [])
        lines = finish(winner)
    finally:
        for p in procs:
            p.kill()
    assert lines[-1] == "Optimization stopped early."
    table = (work / "snaps" / "tiny_metrics.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in table].count("iteration") == 1
    iterations = [int(row.split(",")[0]) for row in table[1:]]
    assert iterations == sorted(iterations) and len(set(iterations)) == len(iterations)
    newest = snap.latest_state(str(work / "snaps" / "tiny"))
    assert newest[1] == []   # every state loads with its own weights


def _first_to_end(procs, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                yield p
                return
        time.sleep(0.05)
    raise AssertionError("neither run ended: the second was not refused")


@pytest.mark.slow
def test_runs_refused_by_a_live_run_touch_none_of_its_files(tmp_path):
    """While a run trains: a plain start, a start with --overwrite and a --snapshot latest
    are each refused in one line naming it; its metrics table, resolved specs, snapshots and
    an in-flight snapshot temporary stay as they are, and it trains on to a clean end."""
    work = work_dir(tmp_path)
    live = cli_process(work, "train", "--solver", "solver.yaml")
    seen: list[str] = []
    try:
        wait_for(live, "Snapshotting solver state to", seen)
        wait_for(live, "Iteration 40 (", seen)
        snaps = work / "snaps"
        # the live run's next snapshot, caught while it is being written
        in_flight = snaps / ".tiny_iter_60.pt.k2j4h3.tmp"
        in_flight.write_bytes(b"PK\x03\x04 being written")
        before = {p.name: p.read_bytes() for p in snaps.iterdir()
                  if not p.name.endswith(("_metrics.csv", ".lock"))}
        rows_before = (snaps / "tiny_metrics.csv").read_bytes()
        extras = ([], ["--overwrite"], ["--snapshot", "latest"])
        seconds = [cli_process(work, "train", "--solver", "solver.yaml", *extra)
                   for extra in extras]
        for extra, second in zip(extras, seconds, strict=True):
            out, err = second.communicate(timeout=60)
            assert second.returncode == 1, (extra, err)
            assert err.strip() == refusal(work, live.pid), extra
            assert "Removed" not in out
        after = {p.name: p.read_bytes() for p in snaps.iterdir()
                 if p.name in before}
        assert after == before
        assert (snaps / "tiny_metrics.csv").read_bytes().startswith(rows_before)
        in_flight.unlink()
        wait_for(live, "Iteration 100 (", seen)
        lines = finish(live)
    finally:
        live.kill()
    assert lines[-1] == "Optimization stopped early."
    assert not (work / "snaps" / "tiny.lock").exists()


def test_a_resume_refuses_weights_another_run_wrote(tmp_path, monkeypatch):
    """Two runs' snapshots under one name (the second started over with --overwrite and was
    stopped after its first snapshot, say): each state records the size and CRC of the
    weights written with it, so a resume from a mismatched pair is refused, and --snapshot
    latest skips it (one line) for the newest pair that belongs together."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    first = work_dir(tmp_path / "first", max_iter=4, display=0, snapshot=2, seed=3)
    other = work_dir(tmp_path / "other", max_iter=4, display=0, snapshot=2, seed=5)
    for work in (first, other):
        monkeypatch.chdir(work)
        caffe_py.train_solver("solver.yaml", devices="cpu")
    snaps = first / "snaps"
    shutil.copy(other / "snaps" / "tiny_iter_4.pt", snaps / "tiny_iter_4.pt")
    monkeypatch.chdir(first)
    state = snaps / "tiny_iter_4.solverstate.pt"
    saved, found = snap.fingerprint(other / "snaps" / "tiny_iter_4.pt"), \
        snap.load_state(state)[snap.PAIRED]
    problem = (f"{state}: its weights file tiny_iter_4.pt is not the one written with it "
               f"({saved['size']:,} bytes, CRC {saved['crc32']:08x}; the state was saved with "
               f"{found['size']:,} bytes, CRC {found['crc32']:08x}): another run wrote that "
               "name since (one started over with --overwrite, say); resume from another "
               "state, or start a new run from those weights with --weights")
    (first / "solver.yaml").write_text(SOLVER.format(max_iter=6, display=0, snapshot=2,
                                                     seed=3))
    with pytest.raises(SolverError) as caught:
        caffe_py.train_solver("solver.yaml", devices="cpu", snapshot=str(state))
    assert str(caught.value) == problem
    solver = caffe_py.train_solver("solver.yaml", devices="cpu", snapshot="latest")
    assert solver.iter == 6
    assert (snaps / "tiny_resume_2_solver.yaml").is_file()   # it resumed iteration 2
