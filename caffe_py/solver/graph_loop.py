"""A single-device Solver's whole iterations as CUDA graph replays (the default on a GPU).

One captured iteration holds everything between two host decisions: the gradients zeroed,
iter_size forward and backward passes (each Data layer reading its batch from a static slot),
the loss recorded, and Caffe's update with this iteration's multipliers read from the device
(:meth:`~caffe_py.solver.rules.Updater.apply_scales`: the learning rate changes every
iteration without a new capture). Small nets are bound by the host's launches, so several
iterations go into one graph (a *chunk*): per chunk the host only copies the next batches into
their slots, copies the rates, replays, and does the bookkeeping Caffe does after each
iteration (display, test, snapshot and signals happen at chunk boundaries, which the chunk
length divides). That bookkeeping is the Solver's own Step: a chunk is
``begin_iteration()``, the replay in place of ``passes()`` and the update, and
``end_iteration(losses, outputs, count=chunk, planned=rates)``; the rates come from
``Solver.plan_rates``, so the loop keeps no state of the Solver's.

The first iterations run eagerly (warm-up: cuDNN picks its kernels, lazy handles are made),
then a graph of one iteration is captured (capture runs nothing, so no state moves); the next
few real iterations replay it and are timed on the device, which sizes the chunk, and a graph of
``chunk`` iterations is captured when that is more than one. Where a step cannot be captured
the loop says why in one line and runs the eager iteration instead.
"""
from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from ..errors import SolverError
from ..net import NetOutput
from .graphs import (
    StaticFeed,
    capture_blocker,
    install_static_feeds,
    register_generators,
    reinstall_feeds,
    restore_feeds,
)
from .roles import AutoCompile

if TYPE_CHECKING:
    from .solver import Solver

log = logging.getLogger(__name__)

WARMUP_ITERATIONS = 2
TIMED_REPLAYS = 3
"""Real iterations replayed one by one, timed, before the chunk length is chosen."""
CHUNK_MAX = 32
"""The most iterations one replay runs."""
CHUNK_TARGET_MS = 4.0
"""A chunk aims at about this much device time (one replay per iteration above it)."""
HOST_BUFFERS = 2
"""Pinned host buffers of the rates per member, filled in turn: a buffer is written again once
the copy that read it has run, so the host may run this many replays ahead."""
CAPTURE_PRIORITY = 0
"""The CUDA stream priority the iterations are captured on (lower is higher; 0 is the default
and the lowest). PyTorch instantiates graphs with their nodes' own priorities, so a replay's
kernels keep it whatever stream launches them."""
SLOT_BYTES_MAX = 256 << 20
"""The static batch slots of a chunk take at most this much device memory."""


class _Replayable(Protocol):
    def replay(self) -> None: ...


@dataclass
class _Graph:
    """One captured chunk of ``length`` iterations: a graph per member solver."""

    length: int
    graphs: Sequence[_Replayable]
    """One per member (CUDA), or one stand-in running every member's iterations (emulated)."""
    losses: list[torch.Tensor]
    """Per member, (length,) each iteration's mean loss, written by the replay."""
    first_out: list[list[NetOutput]]
    """Per member, [the first iteration's outputs]: static tensors, what display shows (made
    by the capture; the CPU emulation makes it anew at each replay)."""


@dataclass
class _Scales:
    """The per-iteration update multipliers: a device (chunk, groups) buffer the graphs read,
    filled from HOST_BUFFERS pinned host buffers used in turn."""

    device: torch.Tensor
    host: list[torch.Tensor]
    done: list[torch.cuda.Event | None] = field(default_factory=list)
    turn: int = 0
    rows: list[list[float]] = field(default_factory=list)
    """The last rows put, as host floats (what the CPU emulation's updates use)."""

    @classmethod
    def on(cls, device: torch.device, slots: int, groups: int) -> _Scales:
        pinned = device.type == "cuda"
        return cls(torch.zeros((slots, groups), device=device),
                   [torch.zeros((slots, groups), pin_memory=pinned)
                    for _ in range(HOST_BUFFERS)], [None] * HOST_BUFFERS)

    def put(self, rows: list[list[float]]) -> None:
        self.rows = rows
        k = self.turn % len(self.host)
        self.turn += 1
        done = self.done[k]
        if done is not None:
            done.synchronize()   # the copy that last read this buffer has finished
        buf = self.host[k]
        buf[:len(rows)] = torch.tensor(rows, dtype=torch.float32)
        on_cuda = self.device.is_cuda
        self.device[:len(rows)].copy_(buf[:len(rows)], non_blocking=on_cuda)
        if on_cuda:   # on the copy's own stream: the current one of the buffer's device
            done = self.done[k] = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device.device))


class GraphedLoop:
    """Runs a Solver's iterations as replays of captured whole iterations (module docstring).

    Set as ``solver.runner``; :meth:`run` is called by ``Solver.step`` in place of one eager
    iteration and runs one or more iterations. ``chunk`` caps the iterations per replay
    (None: chosen from the measured step time and the solver's display/test/snapshot
    intervals). ``emulate=True`` records nothing and calls the recorded function at each
    replay instead (the same host logic on a CPU: what the CPU tests run).

    The loop captures the iterations of its *members*: the solver it runs, or (a subclass,
    parallel/captured.py) every replica of a run, each member's iteration in a graph of its
    own device, with :meth:`before` run before every member's passes and :meth:`between` after
    them, before the updates (there the replicas' gradients are summed).
    """

    def __init__(self, chunk: int | None = None, emulate: bool = False,
                 required: bool = False, auto_compile: AutoCompile | None = None):
        self.chunk_cap = chunk
        self.auto_compile = auto_compile
        """Compile the net once the timed replays show a long run ahead (``--compile auto``):
        the graphs are dropped, the compiled step warms up and is captured again."""
        self.emulate = emulate
        self.required = required
        """A net that cannot be captured is an error (``--graphs on``), not a note."""
        self.chunk = 0
        """Iterations per replay (0: not chosen yet)."""
        self.fallback: str | None = None
        self.graphs: dict[int, _Graph] = {}
        self.feeds: list[list[StaticFeed]] = []
        """Per member, its Data layers' static feeds."""
        self.scales: list[_Scales] = []
        """Per member, its update multipliers on its device."""
        self._warm = 0
        self._replay_ms: list[float] = []
        """The timed replays' device time: per replay, its longest member's (ms)."""
        self._timing: list[tuple[torch.cuda.Event, torch.cuda.Event]] | None = None
        """While a replay is timed: each member's events around its graph's launch."""
        self._capturing: list[torch.cuda.Stream] | None = None
        """While recording on CUDA: each member's capture stream."""
        self._paused = False
        """The real feeds are back in the Data layers (between two ``step`` calls)."""
        self.slots = 1
        """Batch slots per Data layer, in iterations: the longest chunk memory allows."""

    # --- the members (one solver here; every replica in parallel/captured.py) ----------------
    def members(self, s: Solver) -> list[Solver]:
        """The solvers whose iterations this loop captures, the one it runs first."""
        return [s]

    def before(self, streams: list[torch.cuda.Stream] | None) -> None:
        """Before every member's passes of an iteration (``streams`` as for :meth:`between`).
        One solver: nothing."""

    def between(self, streams: list[torch.cuda.Stream] | None) -> None:
        """After every member's passes, before their updates, in each member's stream order
        (``streams``: the members' capture streams while recording, else None: their current
        streams). One solver: nothing."""

    @contextlib.contextmanager
    def on_member(self, i: int, s: Solver) -> Iterator[None]:
        """Member ``i``'s device and stream (its capture stream while recording)."""
        if s.device.type != "cuda":
            yield
            return
        with torch.cuda.device(s.device):
            if self._capturing is None:
                yield
                return
            with torch.cuda.stream(self._capturing[i]):
                yield

    # --- the loop ---------------------------------------------------------------------------
    def pause(self, s: Solver) -> None:
        """Between two ``step`` calls the Data layers read their real feeds (the final
        forward of ``solve`` reads the next batch, as the eager loop's does)."""
        if self.feeds and not self._paused:
            for m, feeds in zip(self.members(s), self.feeds, strict=True):
                restore_feeds(m.net, feeds)
            self._paused = True

    def run(self, s: Solver, stop_iter: int) -> None:
        if self._paused:
            for m, feeds in zip(self.members(s), self.feeds, strict=True):
                reinstall_feeds(m.net, feeds)
            self._paused = False
        if self.fallback is not None:
            self._eager_iteration(s)
            return
        if not self.graphs:
            if self._warm < WARMUP_ITERATIONS:
                self._warm += 1
                self._eager_iteration(s)
                return
            self._capture(s)
            if self.fallback is not None:
                self._eager_iteration(s)
                return
        if not self._begin(s):
            return
        if len(self._replay_ms) < TIMED_REPLAYS and self.chunk_cap is None:
            self._timed_replay(s)
            if len(self._replay_ms) == TIMED_REPLAYS and self.auto_compile is not None:
                self._consider_compiling(s, stop_iter)
            return
        if not self.chunk:
            self._add_chunk(s)
        self._replay(s, self._length(s, stop_iter))

    def _begin(self, s: Solver) -> bool:
        """Every member's begin_iteration (the first's may test, and a signal stop it)."""
        members = self.members(s)
        if not members[0].begin_iteration():
            return False
        for m in members[1:]:
            m.begin_iteration()   # True: only the first member tests
        return True

    def _eager_iteration(self, s: Solver) -> None:
        """One iteration of every member, uncaptured: the warm-up, or the fallback."""
        members = self.members(s)
        if len(members) == 1:
            s.iteration()
            return
        if not self._begin(s):
            return
        plan = s.plan_rates(1)
        results = []
        self.before(None)
        for i, m in enumerate(members):
            with self.on_member(i, m):
                results.append(m.passes())
        self.between(None)
        for i, m in enumerate(members):
            with self.on_member(i, m):
                m.apply_scales(m.updater.scales(plan.rates[0], plan.first_iter))
        for m, (loss, out) in reversed(list(zip(members, results, strict=True))):
            m.end_iteration(loss, out, planned=plan)   # the first member's last: it snapshots

    def _length(self, s: Solver, stop_iter: int) -> int:
        """The chunk when it fits before the next boundary, else one iteration."""
        k = self.chunk
        return k if k > 1 and s.iter % k == 0 and s.iter + k <= stop_iter else 1

    def _replay(self, s: Solver, length: int) -> None:
        """``length`` iterations' passes and updates of every member as one replay each,
        between the Solvers' ``begin_iteration`` (done) and ``end_iteration``."""
        g = self.graphs[length]
        members = self.members(s)
        for feeds in self.feeds:
            for feed in feeds:
                feed.fill(length * s.param.iter_size)
        plan = s.plan_rates(length)
        rows = [s.updater.scales(rate, plan.first_iter + j) for j, rate in enumerate(plan.rates)]
        for scales in self.scales:
            scales.put(rows)
        self._launch(members, g.graphs)
        for m, losses, out in reversed(list(zip(members, g.losses, g.first_out, strict=True))):
            m.end_iteration(losses, out[0], count=length, planned=plan)

    def _launch(self, members: list[Solver], graphs: Sequence[_Replayable]) -> None:
        """Every member's replay (or the one emulated replay), in member order."""
        for i, (m, graph) in enumerate(zip(members, graphs, strict=False)):
            with self.on_member(i, m):
                self._replay_one(graph)

    def _replay_one(self, graph: _Replayable) -> None:
        """One member's replay on the current stream; while a replay is timed, between two
        events on that stream."""
        if self._timing is None:
            graph.replay()
            return
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        self._timing.append((start, end))

    # --- capture, timing, the chunk ---------------------------------------------------------
    def _timed_replay(self, s: Solver) -> None:
        """A real iteration replayed alone, its device time noted: from each member's graph
        launch to its end, the longest member's (a chunk waits for the slowest). The host's
        work before the launches (the slots, the rates) is left out: a chunk of k iterations
        does it once, not k times (CPU emulation: 0)."""
        if s.device.type != "cuda":
            self._replay(s, 1)
            self._replay_ms.append(0.0)
            return
        self._timing = []
        try:
            self._replay(s, 1)
            spans = self._timing
        finally:
            self._timing = None
        for _, end in spans:
            end.synchronize()
        self._replay_ms.append(max(start.elapsed_time(end) for start, end in spans))

    def _consider_compiling(self, s: Solver, stop_iter: int) -> None:
        """Once: compile the net when the measured step says the run is long (AutoCompile);
        then drop the graphs and go back to the warm-up, which runs (and compiles) the
        compiled step before it is captured."""
        policy, self.auto_compile = self.auto_compile, None
        assert policy is not None
        step_ms, left = min(self._replay_ms), max(0, stop_iter - s.iter)
        if not policy.worth(left, step_ms):
            return
        log.info(f"Compiling the net with torch.compile: {left} iterations left at "
                 f"{step_ms:.1f} ms make about {left * step_ms / 60000:.0f} min "
                 "(--compile off skips this)")
        self._synchronize(s)
        self._restore_feeds(s)
        self.graphs.clear()
        self.scales, self.chunk, self._warm, self._replay_ms = [], 0, 0, []
        s.step_fn = policy.step(s.net)

    def _add_chunk(self, s: Solver) -> None:
        """Choose the chunk length and capture its graph (once)."""
        self.chunk = self._chunk_length(s)
        if self.chunk not in self.graphs:
            self.graphs[self.chunk] = self._record(s, self.chunk)

    def _capture(self, s: Solver) -> None:
        reason = next((r for m in self.members(s) if (r := capture_blocker(
            m, whole_iteration=True, emulate=self.emulate)) is not None), None)
        if reason is None:
            try:
                self._build(s)
            except RuntimeError as exc:   # a layer did something a graph cannot hold
                self._synchronize(s)
                self._restore_feeds(s)
                self.graphs.clear()
                reason = f"capture failed: {str(exc).splitlines()[0]}"
        if reason is not None:
            if self.required:
                raise SolverError(f"--graphs on: the iteration on {s.device} cannot be "
                                  f"captured: {reason}; use --graphs auto to run it eagerly")
            self.fallback = reason
            log.info(f"CUDA graphs off ({self._where(s)}): {reason}; running eagerly")

    def _where(self, s: Solver) -> str:
        return ", ".join(str(m.device) for m in self.members(s))

    def _synchronize(self, s: Solver) -> None:
        if not self.emulate:
            for m in self.members(s):
                torch.cuda.synchronize(m.device)

    def _build(self, s: Solver) -> None:
        """Static slots, the rates' buffers, fixed gradients, and the one-iteration graph."""
        members = self.members(s)
        self.slots = self._max_chunk(s)
        self.feeds = [install_static_feeds(m.net, m.device, self.slots * s.param.iter_size)
                      for m in members]
        self.scales = [_Scales.on(m.device, self.slots, len(m.updater.groups)) for m in members]
        for m in members:
            m.grads_in_place = True
            for w in m.updater.params:   # every gradient at a fixed address, zero to start
                if w.grad is None:
                    w.grad = torch.zeros_like(w)
        self._synchronize(s)
        self.graphs[1] = self._record(s, 1)

    def _max_chunk(self, s: Solver) -> int:
        """The longest chunk the batch slots' memory allows (the given chunk, else CHUNK_MAX)."""
        k = self.chunk_cap if self.chunk_cap is not None else CHUNK_MAX
        slot_bytes = sum(4 * math.prod(layer.top_shapes[0]) + 8 * layer.top_shapes[0][0]
                         for layer in s.net.data_layers()) * s.param.iter_size
        return min(k, max(1, SLOT_BYTES_MAX // slot_bytes)) if slot_bytes else k

    def _chunk_length(self, s: Solver) -> int:
        """Iterations per replay: about CHUNK_TARGET_MS of device time by the timed replays (or
        the chunk given), within the slots, dividing every interval at which the host must step
        in between iterations."""
        k = self.slots
        if self.chunk_cap is None:
            step_ms = min(self._replay_ms) if self._replay_ms else CHUNK_TARGET_MS
            k = min(k, max(1, math.floor(CHUNK_TARGET_MS / max(step_ms, 1e-3))))
        p = s.param
        common = 0   # gcd of the intervals: a chunk length must divide it
        for interval in (p.display, p.test_interval if s.test_nets else 0, p.snapshot):
            common = math.gcd(common, interval)
        if common:
            k = max(d for d in range(1, k + 1) if common % d == 0)
        return k

    def _record(self, s: Solver, length: int) -> _Graph:
        members = self.members(s)
        losses = [torch.zeros(length, device=m.device) for m in members]
        scales = [[sc.device[j] for j in range(length)] for sc in self.scales]  # rows by member
        outs: list[list[NetOutput]] = [[] for _ in members]

        def rates(i: int, j: int) -> torch.Tensor | list[float]:
            """A graph reads the rates from its device buffer; the CPU emulation updates with
            the host's floats, the eager update's arithmetic, so that it matches the eager
            loop bit for bit (tests/solver/test_rules.py holds the two forms together)."""
            return self.scales[i].rows[j] if self.emulate else scales[i][j]

        def iterations() -> None:
            for feeds in self.feeds:
                for feed in feeds:
                    feed.cursor = 0
            for j in range(length):
                self.before(self._capturing)
                for i, m in enumerate(members):
                    with self.on_member(i, m):
                        loss, out = m.passes()
                        losses[i][j].copy_(loss)
                        if j == 0:
                            outs[i][:] = [_values(out)]
                self.between(self._capturing)
                for i, m in enumerate(members):
                    with self.on_member(i, m):
                        m.apply_scales(rates(i, j))

        if self.emulate:
            return _Graph(length, [_Emulated(iterations)], losses, outs)
        graphs = [torch.cuda.CUDAGraph() for _ in members]
        streams = [torch.cuda.Stream(m.device, priority=CAPTURE_PRIORITY) for m in members]
        for m, graph, stream in zip(members, graphs, streams, strict=True):
            register_generators(graph, _device_generators(m))
            stream.wait_stream(torch.cuda.current_stream(m.device))
        self._capturing = streams
        begun: list[torch.cuda.CUDAGraph] = []
        try:
            for m, graph, stream in zip(members, graphs, streams, strict=True):
                with torch.cuda.device(m.device), torch.cuda.stream(stream):
                    # relaxed: the members' captures are open at once in this one thread
                    graph.capture_begin(capture_error_mode="relaxed")
                    begun.append(graph)
            iterations()
        except BaseException:
            self._end_captures(members, begun, streams, quiet=True)   # the first error stands
            raise
        self._end_captures(members, begun, streams)
        for m, stream in zip(members, streams, strict=True):
            torch.cuda.current_stream(m.device).wait_stream(stream)
        return _Graph(length, graphs, losses, outs)

    def _end_captures(self, members: list[Solver], begun: list[torch.cuda.CUDAGraph],
                      streams: list[torch.cuda.Stream], quiet: bool = False) -> None:
        self._capturing = None
        for m, graph, stream in zip(members, begun, streams, strict=False):
            with torch.cuda.device(m.device), torch.cuda.stream(stream):
                try:
                    graph.capture_end()
                except RuntimeError:
                    if not quiet:
                        raise

    def _restore_feeds(self, s: Solver) -> None:
        if not self._paused:
            for m, feeds in zip(self.members(s), self.feeds, strict=False):
                restore_feeds(m.net, feeds)
        self.feeds, self._paused = [], False


class _Emulated:
    """A stand-in for a captured graph: :meth:`replay` runs the recorded function again."""

    def __init__(self, fn: Callable[[], None]):
        self.fn = fn

    def replay(self) -> None:
        self.fn()


def _device_generators(s: Solver) -> list[torch.Generator]:
    return [g for layer in s.net.layers for g in layer.generators().values()
            if g.device.type == "cuda"]


def _values(out: NetOutput) -> NetOutput:
    """``out``'s tensors without their autograd graph (the same memory). A graph keeps its first
    iteration's outputs for display; held with the autograd graph they would keep that
    capture's AccumulateGrad nodes, and the stream those were made on, alive into the next
    capture, where PyTorch warns of the stream mismatch."""
    return NetOutput(out.loss.detach(), {k: v.detach() for k, v in out.outputs.items()})
