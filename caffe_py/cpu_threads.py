"""How many threads torch's CPU kernels use: sized to the CPUs a run may have at its start, and
followed during a CPU run as other processes take CPUs and give them back.

torch's CPU build (2.13) runs its intra-op parallelism, oneDNN's convolutions and MKL's BLAS
on GNU OpenMP (``libgomp.so.1`` in torch/lib; no Intel ``libiomp5``, so ``KMP_BLOCKTIME``
does nothing). libgomp starts as many threads as the affinity mask has CPUs, and a thread that
waits (at the end of a parallel region, or for the next one) spins ``GOMP_SPINCOUNT``
iterations (300,000, about 3 ms, unless ``OMP_WAIT_POLICY`` says PASSIVE: 0, or ACTIVE:
forever) before it sleeps. Both are read once, when torch loads libgomp: setting them later in
the process changes nothing. A CPU quota (cgroups) and other processes' load are invisible to
it. When another process keeps one of two cores busy, one of the two threads is descheduled
at every turn, every parallel region waits for it while its peer spins, and a LeNet step
takes 10-20 times as long as with one thread.

So a CPU run (``prepare_host``, every ``cpy train``/``test``/``time``) first sizes the count to
the CPUs it may use: the affinity mask, and a cgroup CPU quota (v2 ``cpu.max``, v1
``cpu.cfs_quota_us / cpu.cfs_period_us``; a fraction of a CPU rounds down, at least one:
a thread beyond the quota's whole CPUs only shares the same CPU time and adds waits). A
training run on one CPU then follows other processes' load with :class:`ThreadGovernor`:
every ``WINDOW_S`` seconds it reads how busy the run's CPUs were (``/proc/stat``) less the
CPU time of this process, sets the count to the CPUs left free, and keeps a change only if
the steps it measures are not slower than before it (else it goes back and leaves that count
alone for a while). Its first look covers the command's start-up: ``cpy`` reads the CPUs' time
before torch loads (:mod:`caffe_py.start_load`), and importing torch takes over a second, so a
process that was there from the start is seen before the net is built. A quiet machine shows
no other load: the count never changes and nothing but a clock read per step is added.

The user's count wins: ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` in the environment, or a
``torch.set_num_threads`` call made after caffe_py was imported (a call made before is taken
as the most threads a run may use). A CPU run's numbers depend on its thread count (oneDNN's
and ATen's reductions split their sums per thread), so ``--deterministic`` keeps the sized
count for the whole run instead of following the load.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .start_load import take as take_start_reading

if TYPE_CHECKING:
    from .solver.solver import Solver

log = logging.getLogger(__name__)

USER_COUNT_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Environment variables through which a user fixes the count (torch reads both)."""

STARTING_COUNT = torch.get_num_threads()
"""torch's count when caffe_py first imported this module (before any run resized it)."""
_set_by_runs: int | None = None
"""The count a run last set; a different current count is the user's torch.set_num_threads."""


# --- what the machine allows ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CpuLimit:
    """The CPUs this process may use: ``affinity`` CPUs in its mask, and a cgroup's CPU quota
    in CPUs (None: no quota)."""

    affinity: int
    quota: float | None = None
    quota_source: str = ""
    """The file and text the quota was read from (for the log)."""

    @property
    def cpus(self) -> int:
        """Whole CPUs: the affinity mask's, at most the quota rounded down, at least one."""
        if self.quota is None:
            return max(self.affinity, 1)
        return max(1, min(self.affinity, math.floor(self.quota)))

    def describe(self) -> str:
        text = f"{self.affinity} CPU{'s' if self.affinity != 1 else ''} in the affinity mask"
        if self.quota is not None:
            text += f", a CPU quota of {self.quota:g} ({self.quota_source})"
        return text


def affinity_cpus() -> list[int]:
    """The CPUs the affinity mask allows (all CPUs where the platform has no masks)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return list(range(os.cpu_count() or 1))


def cgroup_quota(proc: Path = Path("/proc/self")) -> tuple[float, str] | None:
    """The tightest CPU quota over this process's cgroups and their ancestors up to each
    mount, in CPUs, with the file and text it came from; None without one (or without
    cgroups). ``proc`` holds the ``cgroup`` and ``mountinfo`` files to read."""
    limits = []
    for version, folder, mount_point in cgroup_cpu_folders(proc):
        for level in (folder, *folder.parents):
            found = _quota_in(level, version)
            if found is not None:
                limits.append(found)
            if level == mount_point or level == level.parent:
                break
    return min(limits, default=None)


def _quota_in(folder: Path, version: int) -> tuple[float, str] | None:
    """The quota one cgroup folder sets: v2 ``cpu.max`` ("max 100000" or "200000 100000"),
    v1 ``cpu.cfs_quota_us`` (-1: none) over ``cpu.cfs_period_us``."""
    try:
        if version == 2:
            text = (folder / "cpu.max").read_text().strip()
            quota, _, period = text.partition(" ")
            if quota == "max":
                return None
            return int(quota) / int(period or 100000), f"{folder / 'cpu.max'}: {text}"
        quota_text = (folder / "cpu.cfs_quota_us").read_text().strip()
        period_text = (folder / "cpu.cfs_period_us").read_text().strip()
        if int(quota_text) <= 0:
            return None
        return (int(quota_text) / int(period_text),
                f"{folder / 'cpu.cfs_quota_us'}: {quota_text} / {period_text}")
    except (OSError, ValueError, ZeroDivisionError):
        return None


def cgroup_cpu_folders(proc: Path = Path("/proc/self")) -> list[tuple[int, Path, Path]]:
    """(version, folder, mount point) of this process's cgroups that can hold a CPU quota:
    v2's unified hierarchy and v1's ``cpu`` controller, found through ``mountinfo`` (its fourth
    field is the cgroup mounted there: a container's own, under a cgroup namespace or not)."""
    try:
        groups = [line.split(":", 2) for line in (proc / "cgroup").read_text().splitlines()]
        mounts = [line.split() for line in (proc / "mountinfo").read_text().splitlines()]
    except OSError:
        return []
    found = []
    for fields in mounts:
        if "-" not in fields[6:]:
            continue
        fstype, *rest = fields[fields.index("-", 6) + 1:]
        options = rest[1].split(",") if len(rest) > 1 else []
        if fstype == "cgroup2":
            version = 2
        elif fstype == "cgroup" and "cpu" in options:
            version = 1
        else:
            continue
        root, mount_point = fields[3], Path(fields[4])
        for group in groups:
            if len(group) != 3:
                continue
            hierarchy, controllers, path = group
            if version == 2 and hierarchy != "0" or \
                    version == 1 and "cpu" not in controllers.split(","):
                continue
            inside = os.path.relpath(path, root) if _under(path, root) else "."
            folder = mount_point if inside == "." else mount_point / inside
            if not folder.is_dir():  # a path of the host's, outside this container's mount
                folder = mount_point
            found.append((version, folder, mount_point))
    return found


def _under(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def cpu_limit() -> CpuLimit:
    """What this process may use now: its affinity mask and the cgroups' quota."""
    quota = cgroup_quota()
    return CpuLimit(len(affinity_cpus()), *(quota or (None, "")))


# --- the count at the start of a run ----------------------------------------------------------
def user_count(environ: Mapping[str, str] | None = None) -> str | None:
    """How the user fixed the count ('OMP_NUM_THREADS=4', 'torch.set_num_threads(3)'), or None
    when the count is caffe-py's to choose."""
    environ = os.environ if environ is None else environ
    for name in USER_COUNT_VARIABLES:
        if environ.get(name, "").strip():
            return f"{name}={environ[name].strip()}"
    current = torch.get_num_threads()
    expected = STARTING_COUNT if _set_by_runs is None else _set_by_runs
    if current != expected:
        return f"torch.set_num_threads({current})"
    return None


def run_count(limit: CpuLimit, ceiling: int) -> int:
    """The count a run starts with: the CPUs it may use, never above ``ceiling`` (torch's count
    before caffe-py sized it: a count set before caffe_py was imported is a ceiling)."""
    return max(1, min(limit.cpus, ceiling))


def set_count(count: int) -> None:
    """Set torch's count (its OpenMP, MKL and NNPACK pools) as a run's choice."""
    global _set_by_runs
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    _set_by_runs = count


def size_threads(limit: CpuLimit | None = None) -> int:
    """Size the count to the CPUs this process may use, unless the user fixed it; returns the
    count the run starts with (:func:`prepare_host` calls this for every CPU run)."""
    user = user_count()
    if user is not None:
        return torch.get_num_threads()
    limit = cpu_limit() if limit is None else limit
    count = run_count(limit, STARTING_COUNT)
    if count < STARTING_COUNT and count != torch.get_num_threads():
        log.info(f"CPU threads: {count} instead of torch's {STARTING_COUNT} "
                 f"({limit.describe()})")
    set_count(count)
    return count


# --- following other processes' load during a run -----------------------------------------------
OPENING_S = 0.25
"""The shortest net construction whose load the first step acts on (see ThreadGovernor)."""
SETTLE_STEPS = 2
"""The first steps of a run, untimed (allocations, oneDNN's primitives)."""
WINDOW_S = 1.0
"""Seconds of training between two looks at the load (and the steps they time)."""
MIN_STEPS = 4
"""Steps a window holds at least (a slow net's window is longer than WINDOW_S). The first
window after the settling steps holds just these: a competing process that was there from the
start, unseen by a construction shorter than OPENING_S, is acted on after SETTLE_STEPS +
MIN_STEPS steps."""
SLOWER = 1.10
"""A changed count is kept unless its steps take this much longer than the ones before it."""
HOLD_S = 30.0
"""How long a count that made the steps slower is left alone; doubled each time it does again,
up to MAX_HOLD_S."""
MAX_HOLD_S = 600.0


@dataclasses.dataclass(frozen=True)
class LoadSample:
    """One reading of the CPUs' time: ``busy`` seconds of the run's CPUs (ours included),
    ``own`` CPU seconds of this process, at ``wall`` seconds."""

    busy: float
    own: float
    wall: float


def others_load(before: LoadSample, after: LoadSample) -> float:
    """CPUs other processes kept busy between two samples, on average (never below 0)."""
    elapsed = after.wall - before.wall
    if elapsed <= 0:
        return 0.0
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / elapsed)


def free_count(cpus: int, others: float, ceiling: int) -> int:
    """The count for ``others`` CPUs of load on ``cpus`` CPUs: the CPUs left free, rounded to
    the nearest (two spinning threads against one busy process leave it 0.67 of a CPU), between
    1 and ``ceiling``."""
    return max(1, min(ceiling, math.floor(cpus - others + 0.5)))


def busy_seconds(stat: str, cpus: list[int], count_nice: bool, tick: float) -> float:
    """The busy seconds ``/proc/stat``'s text gives ``cpus``: user, system, irq, softirq and
    steal time (a hypervisor's, lost all the same), and nice time when ``count_nice`` (a
    niced process yields its CPU to ours, unless ours is niced too)."""
    wanted = {f"cpu{c}" for c in cpus}
    total = 0
    for line in stat.splitlines():
        name, *values = line.split()
        if name not in wanted:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in values[:8])
        total += user + system + irq + softirq + steal + (nice if count_nice else 0)
    return total * tick


def read_load(cpus: list[int]) -> LoadSample | None:
    """A :class:`LoadSample` of ``cpus`` now; None where there is no /proc/stat."""
    try:
        stat = Path("/proc/stat").read_text()
    except OSError:
        return None
    return _sample(stat, cpus, time.process_time(), time.perf_counter())


def start_load(cpus: list[int]) -> LoadSample | None:
    """The :class:`LoadSample` of ``cpus`` when the command started (:mod:`.start_load`; its
    first caller takes it), or None without that reading."""
    taken = take_start_reading()
    return None if taken is None else _sample(taken.stat, cpus, taken.own, taken.wall)


def _sample(stat: str, cpus: list[int], own: float, wall: float) -> LoadSample:
    niced = os.getpriority(os.PRIO_PROCESS, 0) > 0
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    return LoadSample(busy_seconds(stat, cpus, niced, tick), own, wall)


class ThreadGovernor:
    """Follows other processes' load during one CPU run (the module docstring).

    A Solver callback: it times each step from ``on_start`` to ``on_update_applied`` (the
    passes and the update; no test pass, no snapshot), the first SETTLE_STEPS untimed. The
    first step first looks at the load since the governor was made (the net's construction,
    when it took OPENING_S or more) and starts at the CPUs it left free: a process that was
    there from the start costs no step at a count that waits for it. Given ``started`` (the
    load when the command started, :func:`start_load`), the governor first looks at the load
    since then when it is made (the command's start-up: importing torch takes a second or
    more), so the net's construction runs at the CPUs left free too, and the first step looks
    again at the construction's. Those changes are no trials (no step at the run's count to
    compare with); the later ones are. At the end of every
    window of steps (MIN_STEPS for the first, then WINDOW_S and MIN_STEPS) it
    reads the load and sets the count to the CPUs that other processes left free since the
    last look (since it was made, the net's construction included, for the first). Every
    change is a trial: the next window's steps must not take SLOWER times as long as the
    window's before it, else the count goes back and the tried one is held off for HOLD_S
    (doubled at each failure), so a load that does not hurt (a process that yields its CPU)
    costs a window now and then. Other processes include this run's own child processes (JPEG
    decoders): they take CPUs from the threads all the same.

    ``load`` reads the CPUs' time, ``set_threads`` sets the count and ``clock`` tells the time
    (the tests inject them)."""

    def __init__(self, full: int, cpus: list[int], *,
                 load: Callable[[], LoadSample | None] | None = None,
                 set_threads: Callable[[int], None] = set_count,
                 clock: Callable[[], float] = time.perf_counter,
                 started: LoadSample | None = None):
        self.full = full
        """The count the run started with (the most it uses)."""
        self.cpus = len(cpus)
        self.count = full
        self._load = load if load is not None else (lambda: read_load(cpus))
        self._set_threads = set_threads
        self._clock = clock
        self._sample = self._load() if started is None else started
        self._step_start: float | None = None
        self._window_start = clock() if started is None else started.wall
        self._steps: list[float] = []
        self._settling = SETTLE_STEPS
        self._opening = True  # the first on_start looks at the construction's load
        self._first_window = True  # closes after MIN_STEPS steps, whatever their time
        self._skip_next = False  # the first step at a new count is not timed (new primitives)
        self._trial: tuple[int, float] | None = None  # (the count before, its mean step)
        self._held: dict[int, float] = {}  # count -> time until which it is not tried
        self._hold_s: dict[int, float] = {}  # count -> its next hold
        self.changes: list[tuple[float, int, int]] = []
        """(clock, from, to) of every change, in order."""
        if started is not None:
            self._open(clock(), "since the command started")

    # --- the Solver's callback hooks
    def on_start(self, solver: Solver) -> None:
        if self._opening:
            self._opening = False
            self._open(self._clock(), "while the net was built")
        self._step_start = self._clock()

    def on_gradient_ready(self, solver: Solver) -> None:
        pass

    def on_update_applied(self, solver: Solver) -> None:
        if self._step_start is None:
            return
        now = self._clock()
        if self._settling:
            self._settling -= 1
            return
        if self._skip_next:
            self._skip_next = False
        else:
            self._steps.append(now - self._step_start)
        long_enough = self._first_window or now - self._window_start >= WINDOW_S
        if long_enough and len(self._steps) >= MIN_STEPS:
            self._first_window = False
            self._close_window(now)

    def close(self) -> None:
        """Give the run's count back (the process goes on with what the run started with)."""
        if self.count != self.full:
            self._set_threads(self.full)
            self.count = self.full

    # --- the decisions
    def _open(self, now: float, when: str) -> None:
        """The count for what comes next, from the load ``when`` (the command's start-up, or
        the net's construction), if that took OPENING_S or more."""
        if now - self._window_start < OPENING_S:
            return
        others = self._others()
        if others is None:
            return
        self._window_start = now
        target = free_count(self.cpus, others, self.full)
        if target != self.count:
            self._change(target, f"other processes kept {others:.1f} of {self.cpus} CPUs busy "
                                 f"{when}")
            self._skip_next = False  # the settling steps are untimed already

    def _close_window(self, now: float) -> None:
        steps, self._steps = self._steps, []
        self._window_start = now
        others = self._others()
        if others is not None:
            self._change(*self.decide(sum(steps) / len(steps), others, now))

    def _others(self) -> float | None:
        """Other processes' load since the last sample (None without samples)."""
        before, self._sample = self._sample, self._load()
        if before is None or self._sample is None:
            return None
        return others_load(before, self._sample)

    def _change(self, target: int, why: str) -> None:
        if target == self.count:
            return
        log.info(f"CPU threads: {self.count} -> {target} ({why})")
        self.changes.append((self._clock(), self.count, target))
        self._set_threads(target)
        self.count = target
        self._skip_next = True

    def decide(self, mean_step: float, others: float, now: float) -> tuple[int, str]:
        """The count for the next window and why, from this window's mean step time (seconds)
        and the others' load in it (CPUs) at ``now`` (see the class docstring)."""
        if self._trial is not None:
            before, before_step = self._trial
            self._trial = None
            if mean_step > before_step * SLOWER:  # the change made the steps slower: undo it
                hold = self._hold_s.get(self.count, HOLD_S)
                self._held[self.count] = now + hold
                self._hold_s[self.count] = min(2 * hold, MAX_HOLD_S)
                return before, (f"a step took {mean_step * 1e3:.1f} ms with {self.count}, "
                                f"{before_step * 1e3:.1f} ms with {before}; {self.count} is "
                                f"not tried again for {hold:g} s")
            self._hold_s.pop(self.count, None)
        target = free_count(self.cpus, others, self.full)
        if target != self.count and self._held.get(target, 0.0) <= now:
            self._trial = (self.count, mean_step)
            return target, f"other processes kept {others:.1f} of {self.cpus} CPUs busy"
        return self.count, ""


def governor_for(device: torch.device, deterministic: bool) -> ThreadGovernor | None:
    """The governor of a training run on one ``device``: None unless it is the CPU, the count
    is caffe-py's (no user's), the run is not ``deterministic`` and there are two threads or
    more to change."""
    if device.type != "cpu" or deterministic or user_count() is not None:
        return None
    full = torch.get_num_threads()
    if full < 2:
        return None
    cpus = affinity_cpus()
    return ThreadGovernor(full, cpus, started=start_load(cpus))
