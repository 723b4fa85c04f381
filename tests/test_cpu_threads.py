"""The CPU thread count: sized to the affinity mask and a cgroup's CPU quota (faked files),
the user's count respected, and the governor's decisions under other processes' load (a fake
clock and load)."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from support import tiny_net

from caffe_py import cpu_threads
from caffe_py.cpu_threads import (
    CpuLimit,
    LoadSample,
    ThreadGovernor,
    busy_seconds,
    cgroup_quota,
    free_count,
    governor_for,
    others_load,
    size_threads,
    user_count,
)


# --- the CPUs a process may use -----------------------------------------------------------------
@pytest.mark.parametrize("limit, cpus", [
    (CpuLimit(2), 2),
    (CpuLimit(8, 2.5), 2),       # a fraction of a CPU rounds down
    (CpuLimit(8, 0.5), 1),       # at least one
    (CpuLimit(2, 4.0), 2),       # a quota above the mask's CPUs: the mask
    (CpuLimit(16, 16.0), 16),
])
def test_whole_cpus_of_the_mask_and_the_quota(limit, cpus):
    assert limit.cpus == cpus


def _proc(tmp_path: Path, cgroup: str, mounts: list[str]) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text("".join(f"{m}\n" for m in mounts))
    return proc


def _write(folder: Path, **files: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (folder / name.replace("_", ".", 1)).write_text(text + "\n")


def test_cgroup_v2_cpu_max_the_tightest_of_the_group_and_its_parents(tmp_path):
    mount = tmp_path / "cg2"
    proc = _proc(tmp_path, "0::/kubepods/pod1/c1\n",
                 [f"30 23 0:26 / {mount} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate"])
    _write(mount / "kubepods/pod1/c1", cpu_max="max 100000")
    _write(mount / "kubepods/pod1", cpu_max="250000 100000")
    _write(mount / "kubepods", cpu_max="max 100000")
    assert cgroup_quota(proc) == (2.5, f"{mount}/kubepods/pod1/cpu.max: 250000 100000")
    _write(mount / "kubepods", cpu_max="150000 100000")
    assert cgroup_quota(proc) == (1.5, f"{mount}/kubepods/cpu.max: 150000 100000")
    _write(mount / "kubepods", cpu_max="max 100000")
    _write(mount / "kubepods/pod1", cpu_max="max 100000")
    assert cgroup_quota(proc) is None


def test_cgroup_v2_in_a_namespace_reads_the_mounts_own_files(tmp_path):
    """Under a cgroup namespace the process's path is '/', the mount's root too."""
    mount = tmp_path / "cg2"
    proc = _proc(tmp_path, "0::/\n",
                 [f"30 23 0:26 / {mount} rw - cgroup2 cgroup2 rw"])
    _write(mount, cpu_max="50000 100000")
    assert cgroup_quota(proc) == (0.5, f"{mount}/cpu.max: 50000 100000")
    assert CpuLimit(2, 0.5).cpus == 1


def test_cgroup_v1_cfs_quota_over_period(tmp_path):
    """A v1 container without a namespace: /proc/self/cgroup names the host's path, which the
    mount's root (field 4) is; the quota is cfs_quota_us / cfs_period_us, -1 for none."""
    mount = tmp_path / "cpu,cpuacct"
    proc = _proc(tmp_path, "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n0::/\n",
                 [f"40 30 0:36 /docker/abc {mount} rw,nosuid shared:17 - cgroup cgroup "
                  "rw,cpu,cpuacct",
                  f"41 30 0:37 /docker/abc {tmp_path}/memory rw - cgroup cgroup rw,memory"])
    _write(mount, cpu_cfs_quota_us="300000", cpu_cfs_period_us="100000")
    assert cgroup_quota(proc) == (3.0, f"{mount}/cpu.cfs_quota_us: 300000 / 100000")
    _write(mount, cpu_cfs_quota_us="-1")
    assert cgroup_quota(proc) is None


def test_a_host_path_outside_the_mount_falls_back_to_the_mount(tmp_path):
    mount = tmp_path / "cpu"
    proc = _proc(tmp_path, "3:cpu:/system.slice/x.service\n",
                 [f"40 30 0:36 / {mount} rw - cgroup cgroup rw,cpu"])
    _write(mount, cpu_cfs_quota_us="200000", cpu_cfs_period_us="100000")
    assert cgroup_quota(proc) == (2.0, f"{mount}/cpu.cfs_quota_us: 200000 / 100000")


def test_no_cgroup_files_no_quota(tmp_path):
    assert cgroup_quota(tmp_path / "nowhere") is None
    proc = _proc(tmp_path, "0::/\n", ["22 1 0:21 / /proc rw - proc proc rw"])
    assert cgroup_quota(proc) is None


# --- the user's count and the run's ------------------------------------------------------------
class FakeTorchThreads:
    """torch.get_num_threads / set_num_threads over one number."""

    def __init__(self, monkeypatch, count: int, starting: int):
        self.count, self.calls = count, []
        monkeypatch.setattr(torch, "get_num_threads", lambda: self.count)
        monkeypatch.setattr(torch, "set_num_threads", self.set)
        monkeypatch.setattr(cpu_threads, "STARTING_COUNT", starting)
        monkeypatch.setattr(cpu_threads, "_set_by_runs", None)

    def set(self, n: int) -> None:
        self.calls.append(n)
        self.count = n


@pytest.fixture
def no_user_env(monkeypatch):
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)


def test_the_users_count_is_named(monkeypatch, no_user_env):
    fake = FakeTorchThreads(monkeypatch, count=4, starting=4)
    assert user_count({}) is None
    assert user_count({"OMP_NUM_THREADS": "3"}) == "OMP_NUM_THREADS=3"
    assert user_count({"MKL_NUM_THREADS": " 1 "}) == "MKL_NUM_THREADS=1"
    assert user_count({"OMP_NUM_THREADS": ""}) is None
    fake.count = 3  # torch.set_num_threads(3) after caffe_py was imported
    assert user_count({}) == "torch.set_num_threads(3)"
    cpu_threads.set_count(3)  # ... unless a run set it
    assert user_count({}) is None


def test_a_run_sizes_the_count_to_the_quota_and_says_so(monkeypatch, no_user_env, caplog):
    fake = FakeTorchThreads(monkeypatch, count=8, starting=8)
    caplog.set_level(logging.INFO, logger="caffe_py")
    limit = CpuLimit(8, 2.0, "/sys/fs/cgroup/cpu.max: 200000 100000")
    assert size_threads(limit) == 2 and fake.calls == [2]
    assert caplog.messages == ["CPU threads: 2 instead of torch's 8 (8 CPUs in the affinity "
                               "mask, a CPU quota of 2 (/sys/fs/cgroup/cpu.max: 200000 "
                               "100000))"]
    caplog.clear()
    assert size_threads(limit) == 2 and fake.calls == [2]  # a second run: nothing to change
    assert size_threads(CpuLimit(8)) == 8 and fake.calls == [2, 8]  # the quota lifted
    assert caplog.messages == []


def test_the_count_never_rises_above_torchs_starting_one(monkeypatch, no_user_env):
    """A torch.set_num_threads(2) made before caffe_py was imported is the ceiling."""
    fake = FakeTorchThreads(monkeypatch, count=2, starting=2)
    assert size_threads(CpuLimit(16)) == 2 and fake.calls == []
    assert size_threads(CpuLimit(16, 1.0)) == 1 and fake.calls == [1]


def test_the_users_count_is_left_as_it_is(monkeypatch, no_user_env):
    fake = FakeTorchThreads(monkeypatch, count=6, starting=6)
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert size_threads(CpuLimit(8, 2.0)) == 6 and fake.calls == []
    monkeypatch.delenv("OMP_NUM_THREADS")
    fake.count = 5  # torch.set_num_threads(5)
    assert size_threads(CpuLimit(8, 2.0)) == 5 and fake.calls == []


def test_prepare_host_sizes_a_cpu_run_only(monkeypatch, no_user_env):
    from caffe_py.devices import prepare_host

    fake = FakeTorchThreads(monkeypatch, count=4, starting=4)
    monkeypatch.setattr(cpu_threads, "cpu_limit", lambda: CpuLimit(4, 1.0))
    prepare_host([torch.device("meta")])
    assert fake.calls == []
    prepare_host([torch.device("cpu")])
    assert fake.calls == [1]


def test_the_governor_is_for_a_cpu_run_of_caffe_pys_count(monkeypatch, no_user_env):
    fake = FakeTorchThreads(monkeypatch, count=2, starting=2)
    monkeypatch.setattr(cpu_threads, "read_load", lambda cpus: None)
    governor = governor_for(torch.device("cpu"), deterministic=False)
    assert isinstance(governor, ThreadGovernor) and governor.full == 2
    assert governor_for(torch.device("meta"), deterministic=False) is None
    assert governor_for(torch.device("cpu"), deterministic=True) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert governor_for(torch.device("cpu"), deterministic=False) is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    fake.count = 1
    cpu_threads.set_count(1)  # one thread: nothing to change
    assert governor_for(torch.device("cpu"), deterministic=False) is None


# --- the load ------------------------------------------------------------------------------------
STAT = """cpu  400 300 100 1000 5 1 2 7 0 0
cpu0 150 200 40 600 2 1 1 3 0 0
cpu1 250 100 60 400 3 0 1 4 0 0
intr 12345
ctxt 999
"""


def test_busy_seconds_of_the_runs_cpus_from_proc_stat():
    # cpu0: user 150 + system 40 + irq 1 + softirq 1 + steal 3 = 195 ticks; nice 200
    assert busy_seconds(STAT, [0], count_nice=False, tick=0.01) == pytest.approx(1.95)
    assert busy_seconds(STAT, [0], count_nice=True, tick=0.01) == pytest.approx(3.95)
    # cpu1: 250 + 60 + 0 + 1 + 4 = 315 ticks
    assert busy_seconds(STAT, [0, 1], count_nice=False, tick=0.01) == pytest.approx(5.10)
    assert busy_seconds(STAT, [5], count_nice=False, tick=0.01) == 0.0


def test_others_load_is_the_busy_time_less_ours_per_second():
    before = LoadSample(busy=10.0, own=4.0, wall=100.0)
    assert others_load(before, LoadSample(busy=14.0, own=6.0, wall=102.0)) == 1.0
    assert others_load(before, LoadSample(busy=11.0, own=6.0, wall=102.0)) == 0.0  # not < 0
    assert others_load(before, before) == 0.0


@pytest.mark.parametrize("cpus, others, ceiling, count", [
    (2, 0.0, 2, 2),
    (2, 0.3, 2, 2),
    (2, 0.67, 2, 1),   # two spinning threads against one busy process
    (2, 1.0, 2, 1),
    (2, 1.9, 2, 1),    # never below one
    (16, 0.94, 16, 15),
    (16, 3.2, 16, 13),
    (64, 10.0, 4, 4),  # a quota of 4 on a 64-CPU host with 10 CPUs of load elsewhere
    (64, 62.0, 4, 2),
])
def test_the_count_for_a_load(cpus, others, ceiling, count):
    assert free_count(cpus, others, ceiling) == count


# --- the governor over time ----------------------------------------------------------------------
class FakeHost:
    """A clock, this process's CPU time and the others' load, advanced by steps."""

    def __init__(self):
        self.wall, self.own, self.busy = 0.0, 0.0, 0.0
        self.others = 0.0  # CPUs the other processes keep busy
        self.counts: list[int] = []

    def sample(self) -> LoadSample:
        return LoadSample(self.busy, self.own, self.wall)

    def advance(self, seconds: float, own_cpus: float) -> None:
        self.wall += seconds
        self.own += own_cpus * seconds
        self.busy += (own_cpus + self.others) * seconds


def _governor(host: FakeHost) -> ThreadGovernor:
    return ThreadGovernor(2, [0, 1], load=host.sample, set_threads=host.counts.append,
                          clock=lambda: host.wall)


def _changes(governor: ThreadGovernor) -> list[tuple[int, int]]:
    return [(before, after) for _, before, after in governor.changes]


def _steps(governor: ThreadGovernor, host: FakeHost, seconds: float, step: dict[int, float]):
    """Train for ``seconds``, each step taking step[count] (a test pass between steps takes
    nothing from the timing)."""
    end = host.wall + seconds
    while host.wall < end:
        governor.on_start(None)  # type: ignore[arg-type]
        host.advance(step[governor.count], own_cpus=min(governor.count, 2 - host.others))
        governor.on_update_applied(None)  # type: ignore[arg-type]


def test_a_quiet_machine_keeps_every_thread_and_changes_nothing():
    host = FakeHost()
    governor = _governor(host)
    _steps(governor, host, 60, {2: 0.015, 1: 0.024})
    assert _changes(governor) == [] and host.counts == []


def test_the_count_follows_a_competing_process_and_goes_back_when_it_ends(caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")
    host = FakeHost()
    governor = _governor(host)
    steps = {2: 0.015, 1: 0.024}
    _steps(governor, host, 10, steps)
    host.others, steps[2] = 0.67, 0.250  # a busy process: two threads wait on each other
    _steps(governor, host, 10, steps)
    assert _changes(governor) == [(2, 1)]
    host.others = 1.0
    _steps(governor, host, 30, steps)
    assert _changes(governor) == [(2, 1)]  # kept: the steps got faster
    host.others, steps[2] = 0.0, 0.015  # it ended
    _steps(governor, host, 10, steps)
    assert _changes(governor) == [(2, 1), (1, 2)] and host.counts == [1, 2]
    assert caplog.messages[0] == "CPU threads: 2 -> 1 (other processes kept 0.7 of 2 CPUs busy)"
    assert caplog.messages[1].startswith("CPU threads: 1 -> 2 (other processes kept ")
    assert len(caplog.messages) == 2


def test_a_competing_process_during_the_construction_is_acted_on_at_the_first_step(caplog):
    """The first step looks at the load while the net was built: no step waits at two
    threads for a process that was there from the start."""
    caplog.set_level(logging.INFO, logger="caffe_py")
    host = FakeHost()
    host.others = 1.0
    governor = _governor(host)
    host.advance(1.5, own_cpus=1.0)  # the net's construction
    governor.on_start(None)  # type: ignore[arg-type]
    assert governor.changes == [(1.5, 2, 1)] and host.counts == [1]
    assert caplog.messages == ["CPU threads: 2 -> 1 (other processes kept 1.0 of 2 CPUs busy "
                               "while the net was built)"]
    _steps(governor, host, 30, {2: 0.250, 1: 0.024})
    assert _changes(governor) == [(2, 1)]


def test_a_competing_process_during_the_start_up_is_acted_on_before_the_construction(caplog):
    """With the load when the command started, the governor looks at the start-up (importing
    torch: over a second) when it is made, so the net is built at the free count; the first
    step looks at the construction again and keeps it."""
    caplog.set_level(logging.INFO, logger="caffe_py")
    host = FakeHost()
    host.others = 1.0
    started = host.sample()
    host.advance(1.3, own_cpus=1.0)  # the start-up
    governor = ThreadGovernor(2, [0, 1], load=host.sample, set_threads=host.counts.append,
                              clock=lambda: host.wall, started=started)
    assert governor.changes == [(1.3, 2, 1)] and host.counts == [1]
    assert caplog.messages == ["CPU threads: 2 -> 1 (other processes kept 1.0 of 2 CPUs busy "
                               "since the command started)"]
    host.advance(1.5, own_cpus=1.0)  # the net's construction, at one thread
    _steps(governor, host, 30, {2: 0.250, 1: 0.024})
    assert _changes(governor) == [(2, 1)] and host.counts == [1]


def test_a_quiet_start_up_changes_nothing_and_a_short_one_waits_for_the_construction():
    host = FakeHost()
    started = host.sample()
    host.advance(1.3, own_cpus=1.0)
    governor = ThreadGovernor(2, [0, 1], load=host.sample, set_threads=host.counts.append,
                              clock=lambda: host.wall, started=started)
    _steps(governor, host, 10, {2: 0.015, 1: 0.024})
    assert governor.changes == [] and host.counts == []
    host = FakeHost()
    host.others = 1.0
    started = host.sample()
    host.advance(0.1, own_cpus=1.0)   # under OPENING_S: no look yet
    governor = ThreadGovernor(2, [0, 1], load=host.sample, set_threads=host.counts.append,
                              clock=lambda: host.wall, started=started)
    assert governor.changes == []
    host.advance(1.5, own_cpus=1.0)   # the construction: the first step looks at both
    governor.on_start(None)  # type: ignore[arg-type]
    assert governor.changes == [(1.6, 2, 1)]


def test_the_reading_at_the_commands_start_is_taken_once(monkeypatch):
    from caffe_py import start_load

    monkeypatch.setattr(start_load, "_reading",
                        start_load.StartReading(STAT, own=0.5, wall=10.0))
    monkeypatch.setattr(cpu_threads.os, "getpriority", lambda *_: 0)
    monkeypatch.setattr(cpu_threads.os, "sysconf", lambda _: 100)
    sample = cpu_threads.start_load([0, 1])
    assert sample is not None and (sample.own, sample.wall) == (0.5, 10.0)
    assert sample.busy == pytest.approx(5.10)   # the two CPUs' busy ticks at 100 a second
    assert cpu_threads.start_load([0, 1]) is None   # a later run did not start with the command
    start_load.note()
    taken = start_load.take()
    assert taken is not None and taken.stat.startswith("cpu ") and taken.own > 0


def test_a_quiet_construction_changes_nothing_at_the_first_step():
    host = FakeHost()
    governor = _governor(host)
    host.advance(1.5, own_cpus=1.0)
    _steps(governor, host, 30, {2: 0.015, 1: 0.024})
    assert governor.changes == [] and host.counts == []


def test_a_short_construction_leaves_the_load_to_the_first_window():
    """A construction under OPENING_S is too short a look: two untimed steps, then a first
    window of four, whose load includes the construction."""
    host = FakeHost()
    host.others = 1.0
    governor = _governor(host)
    host.advance(0.2, own_cpus=1.0)
    governor.on_start(None)  # type: ignore[arg-type]
    assert governor.changes == []
    host.advance(0.250, own_cpus=1.0)
    governor.on_update_applied(None)  # type: ignore[arg-type]
    _steps(governor, host, 4 * 0.250, {2: 0.250, 1: 0.024})
    assert governor.changes == []
    _steps(governor, host, 0.250, {2: 0.250, 1: 0.024})  # the sixth step
    assert governor.changes == [(pytest.approx(1.7), 2, 1)] and host.counts == [1]


def test_a_change_that_makes_the_steps_slower_is_undone_and_held_off(caplog):
    """Load that does not slow two threads (a process that yields its CPU): one thread is
    tried, measured slower and undone, held off for 30 s, tried again, then held off 60 s."""
    caplog.set_level(logging.INFO, logger="caffe_py")
    host = FakeHost()
    host.others = 0.8
    governor = _governor(host)
    steps = {2: 0.015, 1: 0.024}
    _steps(governor, host, 6 * 0.015, steps)  # the settling steps and the first window
    assert _changes(governor) == [(2, 1)]
    _steps(governor, host, 1.1, steps)  # a window at one thread: slower, undone
    assert _changes(governor) == [(2, 1), (1, 2)]
    assert caplog.messages == [
        "CPU threads: 2 -> 1 (other processes kept 0.8 of 2 CPUs busy)",
        "CPU threads: 1 -> 2 (a step took 24.0 ms with 1, 15.0 ms with 2; 1 is not tried "
        "again for 30 s)"]
    _steps(governor, host, 29.0, steps)
    assert len(_changes(governor)) == 2  # held off
    _steps(governor, host, 4.0, steps)  # tried again after 30 s, undone, held off for 60 s
    assert _changes(governor)[2:] == [(2, 1), (1, 2)]
    assert caplog.messages[-1].endswith("1 is not tried again for 60 s)")
    times = [at for at, _, _ in governor.changes]
    assert times[1] - times[0] == pytest.approx(1.0, abs=0.04)  # one window
    assert times[2] - times[1] == pytest.approx(30.0, abs=1.04)  # the hold, then a window
    _steps(governor, host, 58.0, steps)
    assert len(_changes(governor)) == 4
    _steps(governor, host, 4.0, steps)
    assert len(_changes(governor)) == 6
    assert caplog.messages[-1].endswith("1 is not tried again for 120 s)")
    assert governor.changes[4][0] - governor.changes[3][0] == pytest.approx(60.0, abs=1.04)


def test_close_gives_the_starting_count_back():
    host = FakeHost()
    host.others = 1.0
    governor = _governor(host)
    _steps(governor, host, 1.5, {2: 0.250, 1: 0.024})
    assert governor.count == 1
    governor.close()
    assert governor.count == 2 and host.counts == [1, 2]
    governor.close()
    assert host.counts == [1, 2]


# --- in a run ------------------------------------------------------------------------------------
SOLVER = """\
net: net.yaml
base_lr: 0.1
max_iter: 8
snapshot_after_train: false
snapshot_prefix: snaps/s
"""


def write_solver(directory):
    """The tiny DummyData net of the command-line tests and an 8-iteration solver over it."""
    (directory / "net.yaml").write_text(tiny_net())
    solver = directory / "solver.yaml"
    solver.write_text(SOLVER)
    return solver


@pytest.fixture
def one_cpu_of_load(monkeypatch, caplog, no_user_env):
    """Other processes keep one CPU busy (faked), the run's count is caffe-py's; yields the
    count the runs start with."""
    import time

    start = torch.get_num_threads()
    monkeypatch.setattr(cpu_threads, "STARTING_COUNT", start)
    monkeypatch.setattr(cpu_threads, "_set_by_runs", None)
    monkeypatch.setattr(cpu_threads, "cpu_limit", lambda: CpuLimit(start))  # no quota here
    monkeypatch.setattr(cpu_threads, "read_load", lambda cpus: LoadSample(
        time.process_time() + 1.0 * time.perf_counter(), time.process_time(),
        time.perf_counter()))
    caplog.set_level(logging.INFO, logger="caffe_py")
    yield start


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one thread: nothing to follow")
def test_a_cpu_training_run_follows_the_load_and_gives_its_count_back(
        tmp_path, caplog, one_cpu_of_load):
    """train() on the CPU: a load of one CPU (faked) is acted on after the settling steps and
    the first window (six steps), and the process has its count back when the run ends."""
    from caffe_py.train import train

    start = one_cpu_of_load
    solver = write_solver(tmp_path)
    train(solver, "cpu")
    cpus = len(cpu_threads.affinity_cpus())
    changes = [m for m in caplog.messages if m.startswith("CPU threads:")]
    assert changes[0] == (f"CPU threads: {start} -> {free_count(cpus, 1.0, start)} (other "
                          f"processes kept 1.0 of {cpus} CPUs busy)")
    assert torch.get_num_threads() == start


@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one thread: nothing to follow")
@pytest.mark.parametrize("deterministic, env", [(True, {}), (False, {"OMP_NUM_THREADS": "2"}),
                                                (False, {"MKL_NUM_THREADS": "2"})])
def test_a_deterministic_run_or_the_users_count_keeps_the_count_under_load(
        tmp_path, monkeypatch, caplog, one_cpu_of_load, deterministic, env):
    """--deterministic (a CPU run's sums follow its thread count) and a count the user set keep
    the count the run started with, whatever the load."""
    from caffe_py import train as train_module
    from caffe_py.options import TrainOptions

    monkeypatch.setattr(train_module, "make_deterministic", lambda: None)  # process-wide
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    counts: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", counts.append)
    solver = write_solver(tmp_path)
    train_module.train(solver, "cpu", TrainOptions(deterministic=deterministic))
    assert [m for m in caplog.messages if m.startswith("CPU threads:")] == []
    assert counts == []
