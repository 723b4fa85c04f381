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
from support import cli_process, error_line, log_lines, tiny_net, wait_for

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
    """Stop a live run with SIGINT (Caffe's stop: a final snapshot); its log lines."""
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return log_lines(err)


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
        assert error_line(err) == refusal(work, winner.pid)
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
            _, err = second.communicate(timeout=60)
            assert second.returncode == 1, (extra, err)
            assert error_line(err) == refusal(work, live.pid), extra
            assert "Removed" not in err
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


# --- one conversion per database ----------------------------------------------------------------
def _png_bytes(value: int) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.full((4, 4, 3), value, np.uint8)).save(out, format="PNG")
    return out.getvalue()


STALLED_IMAGES = 4000


@pytest.fixture
def stalled_conversion(tmp_path):
    """`cpy convert imageset` of 4,000 images stopped (SIGSTOP, as a process stalled on a hung
    network share) once it has committed its first 1,000 records into db.partial, holding its
    lock; ``release`` lets it go on (SIGCONT). (A FIFO among the images stalled it before;
    such an entry is refused now.)"""
    import os
    import signal

    images = tmp_path / "images"
    images.mkdir()
    png = _png_bytes(7)
    lines = []
    for i in range(STALLED_IMAGES):
        name = f"{i:04d}.png"
        (images / name).write_bytes(png)
        lines.append(f"{name} {i % 3}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    live = cli_process(tmp_path, "convert", "imageset", "images", "list.txt", "db")
    deadline = time.monotonic() + 60
    while not (tmp_path / "db.partial" / "data.mdb").exists() or \
            (tmp_path / "db.partial" / "data.mdb").stat().st_size < 16384:
        assert live.poll() is None and time.monotonic() < deadline, live.stderr.read()
        time.sleep(0.005)
    os.kill(live.pid, signal.SIGSTOP)

    def release():
        os.kill(live.pid, signal.SIGCONT)

    yield tmp_path, live, release
    live.kill()


def test_a_second_conversion_into_a_live_ones_database_is_refused(stalled_conversion):
    """The second is refused naming the live one's pid (it used to be told that db.partial
    was left by an interrupted conversion, to delete it); the live one then completes."""
    work, live, release = stalled_conversion
    for extra in ([], ["--resume"]):
        second = cli_process(work, "convert", "imageset", "images", "list.txt", "db", *extra)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 1
        assert error_line(err) == (f"Error: database db is in use by another process (pid "
                               f"{live.pid}, holding db.lock); wait for that conversion to "
                               "end, or write to another path")
    release()
    out, err = live.communicate(timeout=60)
    assert live.returncode == 0, err
    assert out.startswith(f"db: {STALLED_IMAGES} records, ")
    assert sorted(p.name for p in work.iterdir() if p.name.startswith("db")) == ["db"]


def test_a_partial_database_deleted_under_a_live_conversion_is_one_line(stalled_conversion):
    import shutil

    work, live, release = stalled_conversion
    shutil.rmtree(work / "db.partial")
    release()
    _, err = live.communicate(timeout=60)
    assert live.returncode == 1
    assert error_line(err) == ("Error: db.partial was removed while this conversion wrote it; "
                           "convert again")


def test_a_resume_continues_only_the_input_it_began(tmp_path):
    """--resume of another input of the same length is refused (it used to append the second
    input's records after the first's); the summary of a resume counts every record."""
    from synthetic import random_idx

    from caffe_py.errors import DataError
    from caffe_py.tools.convert import convert_idx

    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    images, labels, *_ = random_idx(first, 2500, seed=1)
    other_images, other_labels, *_ = random_idx(second, 2500, seed=2)

    class Stop(Exception):
        pass

    class StopAfter:
        def __init__(self, n):
            self.n = n

        def update(self, k):
            self.n -= k
            if self.n < 0:
                raise Stop

        def close(self):
            pass

    db = tmp_path / "db"
    with pytest.raises(Stop):
        convert_idx(images, labels, db, progress=lambda total, what: StopAfter(1499))
    with pytest.raises(DataError) as caught:
        convert_idx(other_images, other_labels, db, resume=True)
    assert str(caught.value) == (
        f"{tmp_path / 'db.partial'}: cannot resume: it was begun from {images} "
        f"({images.stat().st_size:,} bytes), not {other_images} "
        f"({other_images.stat().st_size:,} bytes); delete it and convert again, or resume with "
        "the inputs it was begun from")
    result = convert_idx(images, labels, db, resume=True)
    assert (result.records, result.written) == (2500, 1000)
    assert result.line().startswith(f"{db}: 2500 records (1000 written now, ")
    assert result.line().endswith(" s (resumed after 1500)")
    assert sorted(p.name for p in db.iterdir()) == ["data.mdb", "lock.mdb"]
