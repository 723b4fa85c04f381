"""Preemption and kills through the command line: SIGTERM snapshots then stops, a kill at any
moment (mid-snapshot included) leaves a newest snapshot that resumes, and the temporaries a
killed write leaves are removed by the next run over the prefix."""
from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest
from support import bare_lines, cli_process, tiny_net, wait_for

from caffe_py.solver import snapshot as snap

NET = tiny_net()
SOLVER = """\
net: net.yaml
base_lr: 0.05
momentum: 0.9
max_iter: {max_iter}
display: {display}
snapshot: {snapshot}
snapshot_after_train: {after}
snapshot_prefix: snaps/tiny
random_seed: 3
"""


@pytest.fixture
def work(tmp_path):
    (tmp_path / "net.yaml").write_text(NET)
    return tmp_path


def solver(work: Path, max_iter=10**7, display=50, snapshot=0, after="false") -> None:
    (work / "solver.yaml").write_text(SOLVER.format(max_iter=max_iter, display=display,
                                                    snapshot=snapshot, after=after))


def newest_state(work: Path) -> Path | None:
    states = sorted((work / "snaps").glob("*.solverstate.pt"),
                    key=lambda p: int(p.name.split("_iter_")[1].split(".")[0]))
    return states[-1] if states else None


def test_sigterm_snapshots_then_stops_even_without_snapshot_after_train(work):
    solver(work)
    proc = cli_process(work, "train", "--solver", "solver.yaml")
    seen: list[str] = []
    try:
        wait_for(proc, "Train net output", seen)
        proc.send_signal(signal.SIGTERM)
        _, rest = proc.communicate(timeout=60)
    finally:
        proc.kill()
    lines = seen + bare_lines(rest)
    assert proc.returncode == 0, rest[-2000:]
    assert lines[-1] == "Optimization stopped early."
    state = newest_state(work)
    weights = state.with_name(state.name.replace(".solverstate", ""))
    assert lines[-3:-1] == [f"Snapshotting to {weights}", f"Snapshotting solver state to {state}"]
    assert snap.load_state(state)["iter"] > 0


def test_sigterm_effect_none_keeps_training(work):
    solver(work)
    proc = cli_process(work, "train", "--solver", "solver.yaml", "--sigterm-effect", "none")
    seen: list[str] = []
    try:
        wait_for(proc, "Train net output", seen)
        proc.send_signal(signal.SIGTERM)
        wait_for(proc, "Train net output", seen)  # still training
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0


def kill_and_resume(work: Path, trials: int, seed: int) -> list[str]:
    """Kill ``cpy train`` (SIGKILL) at random moments, half of them while a snapshot is being
    written, and resume each time from the newest state; returns what each trial saw."""
    rng = random.Random(seed)
    solver(work, display=1, snapshot=3)
    outcomes = []
    for trial in range(trials):
        state = newest_state(work)
        args = ["train", "--solver", "solver.yaml"] + (["--snapshot", str(state)] if state else [])
        proc = cli_process(work, *args)
        seen: list[str] = []
        try:
            wait_for(proc, "Snapshotting to" if trial % 2 else "Train net output", seen)
            time.sleep(rng.uniform(0, 0.05))
            proc.kill()
            proc.communicate(timeout=60)
        finally:
            proc.kill()
        resumed = seen[0] if state else "fresh"
        outcomes.append(resumed)
        newest = newest_state(work)
        if newest is not None:
            snap.load_state(newest)  # loads, checksums included
            snap.load_weights(snap.weights_path_of(snap.load_state(newest), newest))
    return outcomes


def test_kills_mid_snapshot_leave_a_snapshot_that_resumes(work):
    kill_and_resume(work, trials=4, seed=1)
    solver(work, max_iter=60, display=0, snapshot=0, after="true")
    state = newest_state(work)
    done = cli_process(work, "train", "--solver", "solver.yaml", "--snapshot", str(state))
    _, err = done.communicate(timeout=120)
    assert done.returncode == 0, err[-2000:]
    assert bare_lines(err)[-1] == "Optimization Done."
    assert not list((work / "snaps").glob(".*.tmp"))


@pytest.mark.long
def test_fifty_kills_at_random_moments(work):
    kill_and_resume(work, trials=50, seed=7)
    assert snap.load_state(newest_state(work))["iter"] > 0


def test_a_new_run_removes_the_temporaries_of_its_prefix(work):
    solver(work, max_iter=2)
    (work / "snaps").mkdir()
    stale = [work / "snaps" / ".tiny_iter_3.pt.abc123.tmp",
             work / "snaps" / ".tiny_iter_6.solverstate.pt.x9y8.tmp"]
    other = work / "snaps" / ".other_iter_3.pt.abc123.tmp"
    for path in (*stale, other):
        path.write_bytes(b"PK\x03\x04 half")
    proc = cli_process(work, "train", "--solver", "solver.yaml")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    for path in stale:
        assert f"Removed {path.name}, left by an interrupted snapshot" in err
        assert not path.exists()
    assert other.exists()
