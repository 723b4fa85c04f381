"""Faults while a run goes on, through the command line: a disk that fills up under the
snapshots or the log, an input read that stalls, and the limits a shared machine sets
(open files, address space, a container's memory). Each ends in one line on stderr, or in the
documented stop; never a traceback."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support import ROOT, bare, cli_process, error_line, log_lines, tiny_net, write_records

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
    """The command failed with exit 1 and one line, 'Error: ...', ending stderr (after the
    log lines), no traceback."""
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    return error_line(done.stderr)


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


@pytest.mark.slow
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
    assert "Iteration 100, " in done.stderr   # it stopped in the middle, not at the start


# --- the limits a shared machine sets ---------------------------------------------------------
def limited(**limits):
    """A preexec_fn setting resource limits (RLIMIT_<NAME>=soft) in the child."""
    import resource

    def apply():
        for name, value in limits.items():
            key = getattr(resource, f"RLIMIT_{name}")
            resource.setrlimit(key, (value, resource.getrlimit(key)[1]))
    return apply


def test_too_few_open_files_is_one_line(tmp_path):
    """ulimit -n 20 under a net of 20 Data layers."""
    data = "".join(f"""\
  - name: d{i}
    type: Data
    top: [d{i}, l{i}]
    data_param: {{source: db{i}, batch_size: 4}}
""" for i in range(20))
    for i in range(20):
        write_records(tmp_path / f"db{i}", ((np.full((1, 2, 3), k, np.uint8), k % 3)
                                             for k in range(8)))
    (tmp_path / "net.yaml").write_text("name: files\nlayer:\n" + data + """\
  - {name: ip, type: InnerProduct, bottom: d0, top: ip, inner_product_param: {num_output: 3}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, l0], top: loss}
""")
    (tmp_path / "solver.yaml").write_text(SOLVER.format(max_iter=2, snapshot=0, display=0,
                                                        prefix="snaps/t"))
    line = one_line_error(cpy(tmp_path, "train", "--solver", "solver.yaml",
                              preexec_fn=limited(NOFILE=20)))
    assert line.startswith("Error: too many open files (")
    assert line.endswith("): this process may open 20 (ulimit -n); raise it (e.g. ulimit -n "
                         "4096) or read fewer databases at once")


BIG = """\
name: big
layer:
  - {name: data, type: DummyData, top: data, dummy_data_param: {shape: [{dim: [1, SIZE]}]}}
  - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 1}}
"""


@pytest.mark.slow
def test_an_address_space_limit_is_the_memory_estimate_and_one_line(tmp_path):
    """ulimit -v 3 GiB: a 1.1 GiB weight (3.4 GiB with its gradient and history) is refused by
    the estimate naming the limit; under 1.5 GiB, a 1.1 GiB top the estimate lets through
    fails to allocate (torch and Python hold 0.6 GiB of address space): one line too."""
    (tmp_path / "big.yaml").write_text(BIG.replace("SIZE", "300000000"))
    line = one_line_error(cpy(tmp_path, "net", "big.yaml", preexec_fn=limited(AS=3 << 30)))
    assert line == ("Error: big.yaml:4: layer[1]: layer 'ip' (InnerProduct): blob 'weight' of "
                    "shape [1, 300000000] needs 3.4 GiB (values, gradient and solver history), "
                    "more than the cpu memory (3.0 GiB under ulimit -v); make the layer or the "
                    "batch smaller")
    line = one_line_error(cpy(tmp_path, "net", "big.yaml", preexec_fn=limited(AS=3 << 29)))
    assert line == ("Error: out of memory: an allocation failed (at most 1.5 GiB under ulimit "
                    "-v); make the net, the batch or prefetch smaller, or raise the limit")


def test_a_cgroup_memory_limit_is_the_memory_estimate(tmp_path):
    """A real memory cgroup of 1 GiB (v1 or v2; made when running as root where the hierarchy
    is writable, skipped otherwise), the command run inside it."""
    from caffe_py.limits import cgroup_memory_limit

    group, limit_file = _memory_cgroup(tmp_path.name, 1 << 30)
    try:
        (tmp_path / "big.yaml").write_text(BIG.replace("SIZE", "100000000"))

        def join():
            (group / "cgroup.procs").write_text(str(os.getpid()))

        line = one_line_error(cpy(tmp_path, "net", "big.yaml", preexec_fn=join))
    finally:
        group.rmdir()
    assert line == ("Error: big.yaml:4: layer[1]: layer 'ip' (InnerProduct): blob 'weight' of "
                    "shape [1, 100000000] needs 1.1 GiB (values, gradient and solver history), "
                    f"more than the cpu memory (1.0 GiB under the cgroup's limit in "
                    f"{limit_file}); make the layer or the batch smaller")
    assert cgroup_memory_limit() is None or cgroup_memory_limit().bytes > 1 << 30


def _memory_cgroup(name: str, limit: int) -> tuple[Path, Path]:
    for base, file in ((Path("/sys/fs/cgroup/memory"), "memory.limit_in_bytes"),
                       (Path("/sys/fs/cgroup/unified"), "memory.max"),
                       (Path("/sys/fs/cgroup"), "memory.max")):
        group = base / f"cpy_{name}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            (group / file).write_text(str(limit))
            return group, group / file
        except OSError:
            group.rmdir()
    pytest.skip("no writable memory cgroup here (needs root)")


def test_cgroup_limits_are_read_up_the_hierarchy(tmp_path):
    """/proc/self/cgroup and mountinfo of a container (v2, and v1's memory controller): the
    tightest limit of the cgroup and its parents; 'max' and v1's 2^63 are none."""
    from caffe_py.limits import cgroup_memory_limit

    v2 = tmp_path / "v2"
    (v2 / "jobs" / "run7").mkdir(parents=True)
    (v2 / "memory.max").write_text("max\n")
    (v2 / "jobs" / "memory.max").write_text(f"{3 << 30}\n")
    (v2 / "jobs" / "run7" / "memory.max").write_text(f"{5 << 30}\n")
    (tmp_path / "cgroup").write_text("0::/jobs/run7\n")
    (tmp_path / "mountinfo").write_text(
        f"29 23 0:26 / {v2} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    found = cgroup_memory_limit(tmp_path / "cgroup", tmp_path / "mountinfo")
    assert (found.bytes, found.what) == (
        3 << 30, f" under the cgroup's limit in {v2 / 'jobs' / 'memory.max'}")
    v1 = tmp_path / "v1"
    (v1 / "docker" / "abc").mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (v1 / "docker" / "abc" / "memory.limit_in_bytes").write_text(f"{2 << 30}\n")
    (tmp_path / "cgroup").write_text("5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n")
    (tmp_path / "mountinfo").write_text(
        f"35 31 0:32 / {v1} rw,relatime - cgroup cgroup rw,memory\n")
    found = cgroup_memory_limit(tmp_path / "cgroup", tmp_path / "mountinfo")
    assert found.bytes == 2 << 30
    (v1 / "docker" / "abc" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_memory_limit(tmp_path / "cgroup", tmp_path / "mountinfo") is None


# --- stalls -------------------------------------------------------------------------------------
STUCK_LAYER = '''\
import threading

from caffe_py.layers.python import TorchLayer

release = threading.Event()


class Stuck(TorchLayer):
    """Hangs in replica 1's forward until the test releases it (a user's layer waiting on
    something that never comes)."""

    def setup(self, bottom_shapes):
        return [bottom_shapes[0]]

    def forward(self, x):
        if threading.current_thread().name == "cpy-replica-1":
            release.wait(60)
        return x
'''


def test_a_replica_stuck_in_a_python_layer_is_named_by_the_watchdog(tmp_path):
    """Two CPU replicas, the second stuck in a user's Python layer: the root's wait for its
    gradients times out (the sync timeout, 2 s here) naming the thread, the layer and the
    method it is stuck in, instead of 'a replica is stuck'."""
    from caffe_py.errors import SolverError
    from caffe_py.parallel.replicated import ReplicatedRun, Tuning
    from caffe_py.spec.solver_spec import load_solver

    (tmp_path / "stuck_layer.py").write_text(STUCK_LAYER)
    (tmp_path / "net.yaml").write_text(tiny_net(extra="""\
  - name: stuck
    type: Python
    bottom: ip
    top: held
    python_param: {module: stuck_layer, layer: Stuck}
"""))
    (tmp_path / "solver.yaml").write_text(SOLVER.format(max_iter=4, snapshot=0, display=0,
                                                        prefix=tmp_path / "snaps" / "t"))
    param = load_solver(tmp_path / "solver.yaml")
    try:
        with pytest.raises(SolverError) as caught, \
                ReplicatedRun(param, ["cpu"] * 2, tuning=Tuning(timeout=2)) as run:
            run.run()
    finally:
        sys.modules["stuck_layer"].release.set()
    seconds = re.search(r"for (\d+) s; fix", str(caught.value))
    assert seconds is not None and int(seconds.group(1)) >= 2
    assert str(caught.value) == (
        "replica 0 (cpu) waited 2 s for gradient bucket 0 from replica 1 (cpu) at iteration 0; "
        "a replica is stuck: cpy-replica-1 has been running layer 'stuck' (Python: "
        f"stuck_layer.Stuck.forward) for {seconds.group(1)} s; fix that layer (threads still "
        "running: cpy-replica-1)")


def test_a_run_that_fails_before_its_first_snapshot_keeps_the_rows_it_wrote(tmp_path,
                                                                          monkeypatch):
    """The metrics table is the evidence of what went wrong: a run that fails before its
    first snapshot (a layer raising at its sixth forward) keeps it with its rows, while the
    resolved specs of the failed start go."""
    import caffe_py
    from caffe_py.errors import CaffePyError

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "failing_layer.py").write_text(
        "from caffe_py.layers.python import TorchLayer\n\n"
        "class FailsLater(TorchLayer):\n"
        "    calls = 0\n\n"
        "    def setup(self, bottom_shapes):\n"
        "        return [bottom_shapes[0]]\n\n"
        "    def forward(self, x):\n"
        "        FailsLater.calls += 1\n"
        "        if FailsLater.calls > 5:\n"
        "            raise RuntimeError('the sixth forward fails')\n"
        "        return x\n")
    (tmp_path / "net.yaml").write_text(tiny_net(extra="""\
  - {name: later, type: Python, bottom: ip, top: later,
     python_param: {module: failing_layer, layer: FailsLater}}
"""))
    (tmp_path / "solver.yaml").write_text(SOLVER.format(max_iter=200, snapshot=100, display=1,
                                                        prefix="snaps/t"))
    with pytest.raises(CaffePyError, match="the sixth forward fails"):
        caffe_py.train_solver("solver.yaml", devices="cpu")
    rows = (tmp_path / "snaps" / "t_metrics.csv").read_text().splitlines()
    assert rows[0].startswith("iteration,seconds,phase,lr,loss") and len(rows) == 6
    assert sorted(p.name for p in (tmp_path / "snaps").iterdir()) == ["t_metrics.csv"]


def image_list_with_a_fifo(work: Path, images: int, fifo_at: int) -> Path:
    """``list.txt`` of ``images`` 8 x 8 PNGs, the one at ``fifo_at`` a FIFO (a read that never
    answers, as on a hung network file system)."""
    from PIL import Image

    folder = work / "img"
    folder.mkdir()
    lines = []
    for i in range(images):
        path = folder / f"{i:04d}.png"
        if i == fifo_at:
            os.mkfifo(path)
        else:
            Image.fromarray(np.full((8, 8, 3), i % 256, np.uint8)).save(path)
        lines.append(f"img/{path.name} {i % 3}")
    (work / "list.txt").write_text("\n".join(lines) + "\n")
    return folder / f"{fifo_at:04d}.png"


def test_the_watchdog_names_the_file_a_stalled_read_is_stuck_on(tmp_path):
    """The reader's wait for records (60 s in a run; 2 s here) names the file the producer
    has been reading, instead of 'another replica may have stopped reading' (one replica)."""
    from caffe_py.errors import DataError
    from caffe_py.io import ReaderPool
    from caffe_py.io.db.image_list import ImageDecoder, ImageListDatabase
    from caffe_py.io.reader.records import FeedSpec

    fifo = image_list_with_a_fifo(tmp_path, 12, fifo_at=5)
    source = str(tmp_path / "list.txt")
    spec = FeedSpec(source, 2, 1, (3, 8, 8),
                    opener=lambda: ImageListDatabase(source, root_folder=str(tmp_path) + "/"),
                    decoder=lambda: ImageDecoder(source, (3, 8, 8), color=True, resize=None))
    with ReaderPool(replicas=1) as pool:
        queue = pool.subscribe(spec, "TRAIN/data", replica=0)
        pool.start()
        with pytest.raises(DataError) as caught:
            for _ in range(6):
                queue.get_batch(2, timeout=2)
        started = time.monotonic()
    assert time.monotonic() - started < 2   # the pool closes without waiting on the read
    seconds = re.search(r"for (\d+) s; a file", str(caught.value)).group(1)
    assert str(caught.value) == (
        f"{source}: no record arrived for 2 s (stream TRAIN/data): the reader has been reading "
        f"{fifo} for {seconds} s; a file that never answers (a hung network file system, a "
        "FIFO): check it")
    with open(fifo, "wb"):   # let the stuck read go
        pass


@pytest.mark.slow
def test_sigterm_acts_within_a_second_while_the_input_stalls(tmp_path):
    """ImageData reading a FIFO in its list: SIGTERM (a preemption) used to wait for the read,
    then the 60 s watchdog ended the run without a snapshot. Now the main thread's wait is cut
    short: a snapshot of the last finished iteration, and the documented exit (0, 'Optimization
    stopped early.'), within a few seconds."""
    image_list_with_a_fifo(tmp_path, 300, fifo_at=150)
    (tmp_path / "net.yaml").write_text(tiny_net(data="""\
  - name: data
    type: ImageData
    top: [data, label]
    transform_param: {scale: 0.00390625}
    image_data_param: {source: list.txt, batch_size: 2}
"""))
    (tmp_path / "solver.yaml").write_text(SOLVER.format(max_iter=10**6, snapshot=0, display=1,
                                                        prefix="snaps/t"))
    run = cli_process(tmp_path, "train", "--solver", "solver.yaml")
    try:
        lines = _until_quiet(run, quiet=3.0, timeout=90)
        shown = [int(m.group(1)) for line in lines
                 if (m := re.match(r"Iteration (\d+) \(", line))]
        assert shown and shown[-1] < 75   # stalled before the FIFO's batch (record 150)
        signalled = time.monotonic()
        run.send_signal(signal.SIGTERM)
        out, err = run.communicate(timeout=60)
        took = time.monotonic() - signalled
    finally:
        run.kill()
    assert run.returncode == 0, err[-2000:]
    rest = log_lines(err)
    last = shown[-1] + 1   # the iterations finished: the displayed ones, counted from 0
    state = tmp_path / "snaps" / f"t_iter_{last}.solverstate.pt"
    assert rest[-1] == "Optimization stopped early."
    assert rest[-3:-1] == [f"Snapshotting to {tmp_path / 'snaps' / f't_iter_{last}.pt'}",
                           f"Snapshotting solver state to {state}"]
    assert snap.load_state(state)["iter"] == last
    assert took < 10, took


def _until_quiet(proc, quiet: float, timeout: float) -> list[str]:
    """``proc``'s log lines (stderr, glog prefix removed) until none comes for ``quiet`` s.

    Reads the pipe's descriptor itself: a buffered ``readline`` may hold lines already read
    from the pipe while ``select`` on the descriptor says nothing is left, which cut the lines
    short by however many sat in the buffer. The first reader of ``proc.stderr``; what it has
    not read stays in the pipe for ``communicate``."""
    import codecs
    import selectors

    lines: list[str] = []
    fd = proc.stderr.fileno()
    decode = codecs.getincrementaldecoder("utf-8")(errors="replace").decode
    pending = ""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(quiet):
                if lines:
                    return lines
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            *done, pending = (pending + decode(chunk)).split("\n")
            lines.extend(bare(line) for line in done)
    raise AssertionError(f"the run never went quiet (or ended): {lines[-5:]}")
