"""Where each replica's step time goes: `cpy train --gpus 0..N-1` with no flag, a few of its
replayed iterations traced by torch.profiler, every GPU's kernels taken apart against the same
trace on one GPU.

    python benchmarks/replica_profile.py --out DIR --runs 1,4
    python benchmarks/replica_profile.py --out DIR --runs 1,4,4+noreduce,4+NCCL_PROTO=Simple

    python benchmarks/replica_profile.py --out DIR --model lenet --runs 1,2,2+noreduce

    python benchmarks/imagenet_data.py --specs-only
    python benchmarks/replica_profile.py --out DIR \
        --solver /tmp/cpy_gpu/imagenet_specs/raw_lmdb_solver.yaml --runs 1,4

Each run is a fresh process that trains one of benchmarks/scale_default.py's models
(``--model``: ResNet-50, constant DummyData, bf16, batch 256 per GPU; or LeNet, fp32, batch 64
per GPU, whose replays run chunks of several iterations), or the solver spec ``--solver`` names
(its net by an absolute path, as imagenet_data.py writes them: a ResNet-50 fed by a raw or JPEG
LMDB, to see what the data pipeline costs each iteration; timed as ``--model``'s), through
``caffe_py.train.train`` as `cpy train` does, with the replay of the captured iterations
wrapped: after WARM replays it traces PROFILED replays (CUDA activity only, every device,
between marker kernels; the trace starts before the capture), then times TIMED[model] more on
the wall clock, untraced (the host is ahead of the GPUs, so a replay's wall time is its
iterations' period). Per GPU and iteration, from the trace:

* *period*: the trace's span over the iterations traced;
* *busy*: the time some kernel or copy runs; *idle* = period - busy;
* *compute*: the kernels other than NCCL's, as the time some runs and as the sum of their
  durations; *Δ compute*: that sum over the same sum on one GPU (kernels slowed by NCCL's beside
  them, plus the reduction's own 1/N multiply where the update does not fold it in, as with
  ``divide``); *side*: the kernels other than NCCL's on streams other than backward's (that
  multiply);
* *NCCL*: the time an NCCL kernel runs, and the part of it with no other kernel beside it
  (*exposed*);
* *update*: Caffe's update kernel (``sgd_update_kernel``), and *before update*: from the end of
  the last NCCL kernel to the update's start (the reduction's join).

A run's variant follows its count after ``+``: ``noreduce`` replaces NCCL's all-reduce by nothing
(each replica trains on its own gradient: not a training run, a bound on what the reduction costs),
``after`` sets the solver's ``layer_wise_reduce: false`` (one all-reduce after backward),
``buffersK`` gives the rates K pinned host buffers (the host may run K replays ahead), ``reverse``
launches the replicas' replays last GPU first, ``threads`` launches each from a thread of its own,
all at once (on the stream the root copied its rates on), ``flat`` (one GPU) lays the weights,
gradients and state blobs out in flat buffers as a replica's are, with no other replica and no
reduction, ``partsK`` cuts the gradient into about K buckets (ResNet-50 keeps its 25 MB ones; the
default is flat.REDUCTION_PARTS), ``chunkK`` replays K iterations at a time (K must divide the
display interval, 1000 for LeNet), ``heuristic`` takes cuDNN's heuristic algorithms instead of its
benchmark search (the same picks on every GPU), ``twin`` captures each chunk twice and replays the
two in turn, ``divide`` has the all-reduce divide each sum by N on its side stream instead of the
update's kernel (as before the fold), ``solo`` replays only the first replica's graphs after the
warm-up (with ``noreduce``: the other devices stay idle, a bound on what driving them costs the
first), ``monitorK`` polls the Monitor's device checks every K iterations (the host may run further
ahead), ``addmm`` runs InnerProduct's float32 forward through PyTorch's fused ``F.linear`` (its path
before ``layers.common.linear_fp32``), ``ctx`` (with fewer GPUs than the host has) opens a CUDA
context on every GPU the run does not train on, ``peer`` also enables peer access between GPU 0 and
each of them and makes an NCCL communicator over all of them (what a multi-GPU run sets up, with
nothing run there), ``nccl`` sums every bucket with NCCL's all-reduce (no peer sums: the default
before csrc/peer_sum.cu), ``sidehigh`` gives the side streams where the buckets are summed the
highest CUDA stream priority and ``computehigh`` the streams the iterations are captured on (the
graphs keep their nodes' priorities), ``KEY=VALUE`` sets an environment variable (NCCL's knobs). The
table is printed last and written to DIR/replica_profile.md, with the kernels whose summed time grew
most against one GPU, each GPU's longest idle gaps (between which kernels), when each GPU's graph
launches were called against when their first kernels ran (the trace's host side: cudaGraphLaunch
calls, matched to their kernels by correlation id), and the host thread's time per iteration in the
graph launches, the rates' copies and the Solvers' end_iteration; every run is a JSON line in
DIR/replica_profile.jsonl."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

WARM = 4
"""Replays after the loop's own timed ones, before the trace (clocks and caches settle)."""
PROFILED = 5
TIMED = {"resnet50": 20, "lenet": 300}
"""Replays timed untraced per model (LeNet's 0.3 ms iterations need many for a steady mean)."""
Interval = tuple[int, int]


# --- the trace's arithmetic (pure: tested on made-up intervals) --------------------------------
def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The intervals merged where they touch or overlap, in order."""
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals: Iterable[Interval]) -> int:
    return sum(b - a for a, b in intervals)


def overlap(a: Sequence[Interval], b: Sequence[Interval]) -> int:
    """Total length of the intersection of two merged interval lists."""
    i = j = total = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def is_nccl(name: str) -> bool:
    return "nccl" in name.lower()


def is_update(name: str) -> bool:
    return "sgd_update_kernel" in name


Event = tuple[str, int, int, int]
"""A kernel or copy of the trace: (name, stream, start ns, end ns)."""


def device_breakdown(events: Sequence[Event], iterations: int) -> dict:
    """One device's trace taken apart per iteration (milliseconds; the module docstring says
    what each is). *side* is the summed time of the kernels other than NCCL's on streams
    other than the busiest (backward's): the reduction's 1/N multiply (``divide``)."""
    if not events:
        return {}
    per = 1e6 * iterations
    everything = union((s, e) for _, _, s, e in events)
    nccl = union((s, e) for n, _, s, e in events if is_nccl(n))
    compute = union((s, e) for n, _, s, e in events if not is_nccl(n))
    period = everything[-1][1] - everything[0][0]
    each = period // max(1, iterations)   # one iteration's period, ns
    by_stream: dict[int, int] = defaultdict(int)
    for _, stream, s, e in events:
        by_stream[stream] += e - s
    main = max(by_stream, key=lambda k: by_stream[k])
    joins = []
    nccl_ends = sorted(e for n, _, _, e in events if is_nccl(n))
    for s in _iteration_starts(sorted(s for n, _, s, _ in events if is_update(n)),
                               gap_ns=each // 2):
        before = [e for e in nccl_ends if e <= s]
        if before:
            joins.append(s - before[-1])
    names: dict[str, float] = defaultdict(float)
    for n, _, s, e in events:
        names[n] += (e - s) / per
    return {
        "gaps": idle_gaps(events, iterations, least_ns=min(20_000, each // 100)),
        "around_gap": around_longest_gap(events),
        "iteration": one_iteration(events),
        "period_ms": period / per,
        "busy_ms": length(everything) / per,
        "idle_ms": (period - length(everything)) / per,
        "compute_ms": length(compute) / per,
        "compute_sum_ms": sum(e - s for n, _, s, e in events if not is_nccl(n)) / per,
        "side_ms": sum(e - s for n, k, s, e in events if not is_nccl(n) and k != main) / per,
        "nccl_ms": length(nccl) / per,
        "nccl_exposed_ms": (length(nccl) - overlap(nccl, compute)) / per,
        "update_ms": sum(e - s for n, _, s, e in events if is_update(n)) / per,
        "before_update_ms": sum(joins) / len(joins) / 1e6 if joins else None,
        "kernels": dict(names),
    }


def idle_gaps(events: Sequence[Event], iterations: int, top: int = 4,
              least_ns: int = 20_000) -> list[tuple[float, str, str]]:
    """Where a device idles: the gaps of at least ``least_ns`` with no kernel or copy running,
    summed per (the kernel before, the kernel after) and per iteration (ms), largest first."""
    spans = sorted((s, e, n) for n, _, s, e in events)
    totals: dict[tuple[str, str], float] = defaultdict(float)
    end, before = spans[0][1], spans[0][2]
    for s, e, n in spans[1:]:
        if s - end >= least_ns:
            totals[(before[:60], n[:60])] += (s - end) / 1e6 / iterations
        if e > end:
            end, before = e, n
    return [(ms, a, b) for (a, b), ms in sorted(totals.items(), key=lambda kv: -kv[1])[:top]]


def around_longest_gap(events: Sequence[Event], k: int = 4) -> list[tuple[str, int, float, float]]:
    """The ``k`` events that end last before a device's longest idle gap and the ``k`` that
    start first after it: (name, stream, start, end) in microseconds from the gap's start."""
    gap = _longest_gap(events)
    if gap is None:
        return []
    spans, at, edge = gap
    before = sorted(spans[:at], key=lambda ev: ev[3])[-k:]
    return [(n, stream, (a - edge) / 1e3, (b - edge) / 1e3)
            for n, stream, a, b in [*before, *spans[at:at + k]]]


def _longest_gap(events: Sequence[Event]) -> tuple[list[Event], int, int] | None:
    """A device's longest idle gap: the events sorted by start, the index of the one that ends
    the gap and the time the gap starts (None without a gap)."""
    spans = sorted(events, key=lambda ev: ev[2])
    end, best, at = (spans[0][3] if spans else 0), 0, None
    for s, ev in enumerate(spans[1:], start=1):
        if ev[2] - end > best:
            best, at = ev[2] - end, s
        end = max(end, ev[3])
    if at is None:
        return None
    return spans, at, max(ev[3] for ev in spans[:at])


def host_around_gap(events: Sequence[Event], calls: Sequence[tuple[str, int, int, int]],
                    mine: set[int], before_ns: int = 3_000_000, most: int = 40
                    ) -> list[tuple[str, bool, float, float]]:
    """The host's CUDA calls (``calls``: name, correlation id, start, end) from ``before_ns``
    before a device's longest idle gap to its end: (name, whether the call's work ran on this
    device (its id among ``mine``), start, end) in microseconds from the gap's start, the
    last ``most``."""
    gap = _longest_gap(events)
    if gap is None:
        return []
    spans, at, edge = gap
    after = spans[at][2]
    near = sorted((c for c in calls if edge - before_ns <= c[2] <= after), key=lambda c: c[2])
    return [(name, corr in mine, (a - edge) / 1e3, (b - edge) / 1e3)
            for name, corr, a, b in near[-most:]]


def one_iteration(events: Sequence[Event], most: int = 300) -> list[tuple[str, int, float, float]]:
    """The events from the second update kernel's end to the third's, in the order they start:
    (name, stream, start, end) in microseconds from the first (empty for an iteration of more
    than ``most`` events, or fewer than three updates)."""
    ends = sorted(e for n, _, _, e in events if is_update(n))
    if len(ends) < 3:
        return []
    lo, hi = ends[1], ends[2]
    inside = sorted((ev for ev in events if lo <= ev[2] < hi), key=lambda ev: ev[2])
    if not inside or len(inside) > most:
        return []
    t0 = inside[0][2]
    return [(n, k, (a - t0) / 1e3, (b - t0) / 1e3) for n, k, a, b in inside]


def _iteration_starts(starts: Sequence[int], gap_ns: int) -> list[int]:
    """The first of each run of update kernels (an iteration's update launches lie close
    together; iterations are further apart than ``gap_ns``, half an iteration's period)."""
    return [s for k, s in enumerate(starts) if k == 0 or s - starts[k - 1] > gap_ns]


def grown(run: dict, one: dict, top: int = 8) -> list[tuple[str, float]]:
    """The kernels of ``run``'s first GPU whose summed time per iteration grew most against
    ``one`` (the one-GPU run's), NCCL's left out."""
    mine, base = run["devices"][0]["kernels"], one["devices"][0]["kernels"]
    deltas = [(name, ms - base.get(name, 0.0)) for name, ms in mine.items()
              if not is_nccl(name)]
    return sorted(deltas, key=lambda d: -d[1])[:top]


# --- one run, in its own process ----------------------------------------------------------------
VARIANTS = ("noreduce", "after", "reverse", "threads", "flat", "heuristic", "divide", "solo",
            "twin", "addmm", "ctx", "peer", "nccl", "sidehigh", "computehigh")
"""The variants a run may name after its count (the module docstring says what each does)."""
COUNTED = {"buffers": 0, "monitor": 1, "parts": 1, "chunk": 1}
"""The variants that take a count K (``chunk8``), with the smallest K each allows."""


def parse_run(text: str) -> tuple[int, list[str], dict[str, str]]:
    """'4+noreduce+NCCL_PROTO=Simple' -> (4, ['noreduce'], {'NCCL_PROTO': 'Simple'})."""
    count, *parts = text.split("+")
    flags = [p for p in parts if "=" not in p]
    env = dict(p.split("=", 1) for p in parts if "=" in p)

    def known(flag: str) -> bool:
        stem = flag.rstrip("0123456789")
        k = flag[len(stem):]
        return flag in VARIANTS or (stem in COUNTED and k != "" and int(k) >= COUNTED[stem])

    if not all(known(f) for f in flags) or not count.isdigit():
        choices = [*VARIANTS, *(f"{stem}K" for stem in COUNTED), "KEY=VALUE..."]
        raise SystemExit(f"--runs: '{text}' is not COUNT[{'|'.join('+' + c for c in choices)}]")
    return int(count), flags, env


def child(args: argparse.Namespace) -> None:
    import torch

    from caffe_py.parallel import captured
    from caffe_py.parallel.captured import AllReduceGroup
    from caffe_py.solver import graph_loop
    from caffe_py.solver.graph_loop import GraphedLoop
    from caffe_py.solver.solver import Solver
    from caffe_py.train import train

    n, flags, _ = parse_run(args.child)
    out = args.out
    solver = _solver(out, args.model, args.child, "after" in flags, args.solver)
    if "noreduce" in flags:
        def no_collective(parts: Any, streams: Any = None) -> None:
            return None

        original_setup = AllReduceGroup.setup

        def setup(self: AllReduceGroup, *a: Any, **kw: Any) -> Any:
            rep = original_setup(self, *a, **kw)
            if self.collectives is not None:
                self.collectives = type("NoCollectives", (), {
                    "all_reduce": staticmethod(no_collective)})()
            return rep

        AllReduceGroup.setup = setup  # type: ignore[method-assign]
    if "nccl" in flags:
        from caffe_py.parallel.peer_sum import PeerCollectives

        PeerCollectives.on = classmethod(  # type: ignore[method-assign, assignment]
            lambda cls, devices, nccl: None)
    if "sidehigh" in flags:   # clamped to the device's highest priority
        captured.SIDE_PRIORITY = -100
    if "computehigh" in flags:
        graph_loop.CAPTURE_PRIORITY = -100
    if "divide" in flags:
        def keep_dividing(self: AllReduceGroup, i: int, solver: Any) -> None:
            return None

        AllReduceGroup.hand_mean = keep_dividing  # type: ignore[method-assign]
    for flag in flags:
        if flag.startswith("monitor"):
            from caffe_py.solver.monitor import Monitor

            Monitor.__init__.__defaults__ = (int(flag[7:]),)
        if flag.startswith("buffers"):
            graph_loop.HOST_BUFFERS = int(flag[7:])
        if flag == "twin":
            _twin_graphs(GraphedLoop)
        if flag.startswith("chunk"):
            GraphedLoop._chunk_length = (  # type: ignore[method-assign]
                lambda self, s, k=int(flag[5:]): k)
        if flag.startswith("parts"):
            plan = captured.plan_reduction
            parts = int(flag[5:])
            captured.plan_reduction = (  # type: ignore[assignment]
                lambda flat, bucket_bytes, plan=plan, parts=parts: plan(flat, bucket_bytes,
                                                                        parts=parts))
    if "flat" in flags:   # one GPU laid out as a replica is: no other replica, no reduction
        from caffe_py.parallel.replicated import state_blobs
        from caffe_py.parallel.sync import SyncGroup

        init, groups = Solver.__init__, []

        def flat_init(self: Solver, *a: Any, **kw: Any) -> None:
            """The Solver, then what ReplicatedRun does to each replica's: its blobs moved
            into a sync group's flat buffers, gradients in place."""
            init(self, *a, **kw)
            groups.append(SyncGroup([self.device]))
            scale = self.loss_scale.tensors() if self.loss_scale is not None else []
            groups[-1].setup(0, [lp.param for lp in self.net.learnable_params()],
                             [*state_blobs(self.net), *scale])
            self.grads_in_place = True

        Solver.__init__ = flat_init  # type: ignore[method-assign]
    if "heuristic" in flags:
        solver_init = Solver.__init__

        def heuristic_init(self: Solver, *a: Any, **kw: Any) -> None:
            solver_init(self, *a, **kw)
            torch.backends.cudnn.benchmark = False   # the Solver turned the search on

        Solver.__init__ = heuristic_init  # type: ignore[method-assign]
    if "reverse" in flags:
        def reverse(self: GraphedLoop, members: list[Any], graphs: Any) -> None:
            for i in reversed(range(len(members))):
                with self.on_member(i, members[i]):
                    self._replay_one(graphs[i])

        GraphedLoop._launch = reverse  # type: ignore[method-assign]
    if "addmm" in flags:   # InnerProduct's forward as before linear_fp32
        from inner_product import fused_forward

        from caffe_py.layers.common import InnerProduct

        InnerProduct.forward = fused_forward  # type: ignore[method-assign]
    if "solo" in flags:
        def solo(self: GraphedLoop, members: list[Any], graphs: Any) -> None:
            with self.on_member(0, members[0]):
                self._replay_one(graphs[0])

        GraphedLoop._launch = solo  # type: ignore[method-assign]
    if "threads" in flags:
        launchers: list[Launcher] = []

        def threaded(self: GraphedLoop, members: list[Any], graphs: Any) -> None:
            if not launchers:
                launchers.extend(Launcher(m.device) for m in members)
            for launcher, graph in zip(launchers, graphs, strict=True):
                launcher.launch(self, graph, torch.cuda.current_stream(launcher.device))
            for launcher in launchers:
                launcher.wait()

        GraphedLoop._launch = threaded  # type: ignore[method-assign]
    replay, capture = GraphedLoop._replay, GraphedLoop._capture
    host: dict[str, float] = defaultdict(float)
    timing = {"on": False}

    def timed(where: str, fn: Any) -> Any:
        """``fn`` with its host time added to host[where] while the untraced replays run."""
        def wrapper(*a: Any, **kw: Any) -> Any:
            if not timing["on"]:
                return fn(*a, **kw)
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                key = where.format(device=torch.cuda.current_device())
                host[key] += time.perf_counter() - t
        return wrapper

    launches: dict[str, list[float]] = defaultdict(list)
    """Per device and whether its stream was idle at the call: each graph launch's host time."""
    graph_replay = torch.cuda.CUDAGraph.replay

    def replay_noted(self: Any) -> None:
        if not timing["on"]:
            return graph_replay(self)
        idle = torch.cuda.current_stream().query()
        t = time.perf_counter()
        try:
            return graph_replay(self)
        finally:
            dt = time.perf_counter() - t
            device = torch.cuda.current_device()
            host[f"graph.replay (current cuda:{device})"] += dt
            launches[f"cuda:{device}, {'idle' if idle else 'busy'}"].append(dt)

    torch.cuda.CUDAGraph.replay = replay_noted  # type: ignore[method-assign]
    graph_loop._Scales.put = timed("rates put", graph_loop._Scales.put)  # type: ignore
    Solver.end_iteration = timed("end_iteration", Solver.end_iteration)  # type: ignore
    torch.cuda.Event.synchronize = timed(  # type: ignore[method-assign]
        "Event.synchronize", torch.cuda.Event.synchronize)
    torch.Tensor.copy_ = timed("Tensor.copy_", torch.Tensor.copy_)  # type: ignore
    devices = [torch.device("cuda", i) for i in range(n)]
    seen = {"replays": 0, "profiled": 0, "timed": 0}
    spans: list[tuple[Any, Any]] = []
    """The timed window's replays: (start, end) events around each member's graph."""
    """Replays so far, and the iterations they ran in the traced and the timed windows."""
    result: dict[str, Any] = {"run": args.child, "gpus": n}
    prof: list[Any] = []

    def sync() -> None:
        for d in devices:
            torch.cuda.synchronize(d)

    def mark() -> None:
        """A marker kernel queued on every device between two replays, the traced window's
        edge on that device (the host is replays ahead: nothing waits for it; the trace
        starts before the capture, since the kernels of a graph captured before tracing
        began may go unrecorded)."""
        for d in devices:
            with torch.cuda.device(d):
                torch.cuda._sleep(1000)

    def capture_traced(self: GraphedLoop, s: Any) -> None:
        if not prof:
            from torch.profiler import ProfilerActivity, profile

            prof.append(profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]))
            prof[0].__enter__()
        capture(self, s)

    def traced(self: GraphedLoop, s: Any, k: int) -> None:
        if not self.chunk or k != self.chunk:   # timed replays, single ones until aligned
            replay(self, s, k)
            return
        seen["replays"] += 1
        i = seen["replays"]
        if i == WARM + 1:
            mark()
        if i == WARM + PROFILED + 1:
            mark()
            sync()
            prof[0].__exit__(None, None, None)
            result["devices"] = _breakdown(prof[0], n, seen["profiled"])
            result["chunk"] = k
            sync()
            result["wall0"], result["thread0"] = time.perf_counter(), time.thread_time()
            result["window"] = [time.time()]
            timing["on"] = True
        if WARM < i <= WARM + PROFILED:
            seen["profiled"] += k
        elif i > WARM + PROFILED:
            seen["timed"] += k
            self._timing = []   # each member's replay between two events (untraced)
        try:
            replay(self, s, k)
        finally:
            if self._timing is not None:
                spans.extend(self._timing)
                self._timing = None
        if i == WARM + PROFILED + TIMED[args.model]:
            sync()
            its = seen["timed"]
            result["replays"] = replay_spans(spans, its)
            result["step_ms"] = (time.perf_counter() - result["wall0"]) * 1e3 / its
            result["window"].append(time.time())   # the untraced window, seconds since epoch
            result["host_ms"] = (time.thread_time() - result["thread0"]) * 1e3 / its
            timing["on"] = False
            result["host"] = {k: v * 1e3 / its for k, v in sorted(host.items())}
            result["launch_us"] = {k: [len(v), 1e6 * statistics.median(v)]
                                   for k, v in sorted(launches.items())}
            for key in ("wall0", "thread0"):
                del result[key]
            with (out / "replica_profile.jsonl").open("a") as f:
                f.write(json.dumps(result) + "\n")

    GraphedLoop._replay = traced  # type: ignore[method-assign]
    GraphedLoop._capture = capture_traced  # type: ignore[method-assign]
    if "ctx" in flags or "peer" in flags:
        _idle_devices(n, peer="peer" in flags)
    train(str(solver), ",".join(str(i) for i in range(n)))


def _idle_devices(n: int, peer: bool) -> None:
    """The ``ctx`` and ``peer`` variants: a context on every GPU from n on; with ``peer``, peer
    access both ways between GPU 0 and each, and one NCCL all-reduce over every GPU."""
    import torch
    import torch.cuda.nccl as nccl

    count = torch.cuda.device_count()
    if count <= n:
        raise SystemExit(f"--runs: ctx and peer need more GPUs than the run's {n}")
    ones = [torch.ones(1, device=f"cuda:{d}") for d in range(count)]
    if peer:
        for d in range(n, count):
            ones[d].copy_(ones[0])
            ones[0].copy_(ones[d])
        nccl.all_reduce(ones)
    for d in range(count):
        torch.cuda.synchronize(d)


def replay_spans(spans: Sequence[tuple[Any, Any]], iterations: int) -> list[dict[str, float]]:
    """Per device, from the events around each of its graph launches in the untraced window:
    the time inside its graphs and the time between one graph's end and the next one's start
    (the rates' copy, and the device waiting for the host's launch), ms per iteration."""
    by_device: dict[int, list[tuple[Any, Any]]] = defaultdict(list)
    for start, end in spans:
        by_device[start.device.index].append((start, end))
    return [replay_times([(start.elapsed_time(end),
                           prev[1].elapsed_time(start) if prev is not None else None)
                          for prev, (start, end) in zip([None, *mine], mine, strict=False)],
                         iterations) | {"device": d}
            for d, mine in sorted(by_device.items())]


def replay_times(times: Sequence[tuple[float, float | None]], iterations: int) -> dict[str, float]:
    """(each graph's span, the gap before it or None for the first) in ms -> ms per iteration
    inside the graphs and between them (the first graph's gap is outside the window)."""
    inside = sum(t for t, _ in times)
    between = sum(g for _, g in times if g is not None)
    return {"in_graphs_ms": inside / iterations, "between_ms": between / iterations,
            "graphs": len(times)}


def _twin_graphs(loop: Any) -> None:
    """The ``twin`` variant: every chunk length captured twice and the two replayed in turn, so
    that no graph is launched while its own previous launch may still run."""
    add_chunk, replay = loop._add_chunk, loop._replay
    twins: dict[int, list] = {}
    turn = {"n": 0}

    def add_twins(self: Any, s: Any) -> None:
        add_chunk(self, s)
        if self.chunk > 1 and self.chunk not in twins:
            twins[self.chunk] = [self.graphs[self.chunk], self._record(s, self.chunk)]

    def alternate(self: Any, s: Any, length: int) -> None:
        if length in twins:
            turn["n"] += 1
            self.graphs[length] = twins[length][turn["n"] % 2]
        replay(self, s, length)

    loop._add_chunk, loop._replay = add_twins, alternate


class Launcher:
    """A thread that launches one device's graph replays (the ``threads`` variant: every
    replica's replay launched at once, each from its own thread, instead of one after another
    from the root's)."""

    def __init__(self, device: Any):
        import queue
        import threading

        self.device = device
        self.todo: queue.Queue = queue.Queue()
        self.done: queue.Queue = queue.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        import torch

        torch.cuda.set_device(self.device)
        while True:
            loop, graph, stream = self.todo.get()
            with torch.cuda.stream(stream):
                loop._replay_one(graph)   # timed, while the loop times a replay
            self.done.put(None)

    def launch(self, loop: Any, graph: Any, stream: Any) -> None:
        """Replay ``graph`` through ``loop`` on ``stream``: the caller's current stream of this
        device (where the rates were copied; current streams are per thread)."""
        self.todo.put((loop, graph, stream))

    def wait(self) -> None:
        self.done.get()


def _solver(out: Path, model: str, tag: str, after: bool, given: Path | None = None) -> Path:
    """The model's solver as scale_default.py writes it (or the ``given`` solver spec, whose
    net is an absolute path, as imagenet_data.py writes them), run long enough for the
    windows. ResNet-50 displays nothing (its replays are one iteration each); LeNet keeps its
    display interval, which the chunk length divides as in scale_default.py's run."""
    from scale_default import solver_for

    from caffe_py.solver.graph_loop import CHUNK_MAX

    base = given if given is not None else solver_for(model, out, cpu=False)
    spec = yaml.safe_load(base.read_text())
    safe = tag.replace("=", "_").replace("+", "_")
    replays = 40 + WARM + PROFILED + TIMED[model]
    if model == "resnet50":
        spec.update(max_iter=replays, display=0)
    else:
        display = spec["display"]
        spec["max_iter"] = display * -(-replays * CHUNK_MAX // display)
    spec["snapshot_prefix"] = str(out / f"snap_{safe}" / "s")
    if after:
        spec["layer_wise_reduce"] = False
    path = out / f"profile_{safe}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _breakdown(prof: Any, n: int, iterations: int) -> list[dict]:
    """Every device's kernels and copies between its two marker kernels, and when each graph
    launch of the trace was called against when its first kernel ran."""
    per_device: dict[int, list[Event]] = defaultdict(list)
    correlated: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    calls: list[tuple[int, int, int]] = []
    api: list[tuple[str, int, int, int]] = []
    for ev in prof.profiler.kineto_results.events():
        if str(ev.device_type()).endswith("CUDA") and ev.duration_ns() > 0:
            start, end = ev.start_ns(), ev.start_ns() + ev.duration_ns()
            per_device[ev.device_index()].append(
                (ev.name(), ev.device_resource_id(), start, end))
            correlated[ev.device_index()].append((ev.correlation_id(), start, end))
            continue
        if ev.name().startswith("cuda"):
            api.append((ev.name(), ev.correlation_id(), ev.start_ns(),
                        ev.start_ns() + ev.duration_ns()))
        if "GraphLaunch" in ev.name():
            calls.append((ev.correlation_id(), ev.start_ns(), ev.start_ns() + ev.duration_ns()))
    out = []
    for d in range(n):
        events = between_marks(per_device.get(d, []))
        breakdown = device_breakdown(events, iterations)
        if breakdown:
            breakdown["launches"] = launch_delays(calls, correlated.get(d, []))
            breakdown["host_around_gap"] = host_around_gap(
                events, api, {c for c, _, _ in correlated.get(d, [])})
        out.append(breakdown)
    return out


def launch_delays(calls: Sequence[tuple[int, int, int]],
                  kernels: Sequence[tuple[int, int, int]]) -> dict[str, float]:
    """For one device's graph launches (``calls``: the host's cudaGraphLaunch calls as
    (correlation id, start, end) ns; ``kernels``: the device's kernels likewise, a graph's
    kernels carrying its launch's id), the medians in ms of: how long before the previous
    launch's last kernel ended the call was made (*ahead*: negative when the host called
    after the device had run dry), and from the call's return to the graph's first kernel
    (*to first kernel*)."""
    spans: dict[int, list[int]] = {}
    for corr, start, end in kernels:
        span = spans.setdefault(corr, [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    launched = sorted((spans[c][0], spans[c][1], s, e) for c, s, e in calls if c in spans)
    ahead = [prev[1] - call_start for prev, (_, _, call_start, _) in
             zip(launched, launched[1:], strict=False)]
    first = [start - call_end for start, _, _, call_end in launched]
    return {"ahead_ms": statistics.median(ahead) / 1e6 if ahead else float("nan"),
            "to_first_kernel_ms": statistics.median(first) / 1e6 if first else float("nan"),
            "graphs": len(launched)}


def between_marks(events: Sequence[Event], mark: str = "spin_kernel") -> list[Event]:
    """The events after the last-but-one marker kernel's end and before the last one's
    start (empty without two markers)."""
    marks = sorted((s, e) for name, _, s, e in events if mark in name)
    if len(marks) < 2:
        return []
    lo, hi = marks[-2][1], marks[-1][0]
    return [ev for ev in events if ev[2] >= lo and ev[3] <= hi and mark not in ev[0]]


# --- the parent: the runs, the table -----------------------------------------------------------
def table(rows: list[dict]) -> str:
    one = next((r for r in rows if r["run"] == "1"), None)
    head = ("| run | GPU | step ms (untraced) | period | busy | idle | compute | compute sum | "
            "Δ compute sum | side | NCCL | NCCL exposed | update | before update | host ms |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    base = one["devices"][0]["compute_sum_ms"] if one else None
    for r in rows:
        for g, d in enumerate(r.get("devices", [])):
            if not d:
                continue
            delta = f"{d['compute_sum_ms'] - base:+.2f}" if base is not None else "-"
            join = f"{d['before_update_ms']:.3f}" if d["before_update_ms"] is not None else "-"
            lines.append(
                f"| {r['run']} | {g} | {r['step_ms']:.2f} | {d['period_ms']:.2f} | "
                f"{d['busy_ms']:.2f} | {d['idle_ms']:.2f} | {d['compute_ms']:.2f} | "
                f"{d['compute_sum_ms']:.2f} | {delta} | {d['side_ms']:.3f} | "
                f"{d['nccl_ms']:.2f} | "
                f"{d['nccl_exposed_ms']:.3f} | {d['update_ms']:.3f} | {join} | "
                f"{r['host_ms']:.2f} |")
    if one:
        for r in rows:
            if r is one or not r.get("devices"):
                continue
            lines.append(f"\nGPU 0 of run {r['run']}: kernels whose time per iteration grew "
                         "most against one GPU (ms):")
            lines += [f"- {ms:+.3f} {name[:110]}" for name, ms in grown(r, one)]
    for r in rows:
        for d in r.get("replays", []):
            lines.append(f"- run {r['run']}, GPU {d['device']}, untraced: "
                         f"{d['in_graphs_ms']:.4f} ms an iteration inside its graphs, "
                         f"{d['between_ms']:.4f} between them ({d['graphs']} graphs)")
    for r in rows:
        lines.append(f"\nRun {r['run']}: the host's time per iteration (ms): "
                     + ", ".join(f"{k} {v:.3f}" for k, v in r.get("host", {}).items()))
        if r.get("launch_us"):
            lines.append("- its graph launches, host time (count, median us; the device's "
                         "stream idle or busy at the call): " + "; ".join(
                             f"{k} {n} x {us:.0f}" for k, (n, us) in r["launch_us"].items()))
        for g, d in enumerate(r.get("devices", [])):
            lines.append(f"- GPU {g} idles (ms per iteration, kernel before -> after): "
                         + "; ".join(f"{ms:.3f} {a} -> {b}" for ms, a, b in d.get("gaps", [])))
            if d.get("around_gap"):
                lines.append(f"- GPU {g}'s longest gap, the events around it (us from its "
                             "start: stream, start-end, name): " + "; ".join(
                                 f"{k} {a:.1f}-{b:.1f} {n[:50]}"
                                 for n, k, a, b in d["around_gap"]))
            if "launches" in d:
                la = d["launches"]
                lines.append(f"- GPU {g}'s graph launches ({la['graphs']} traced): called "
                             f"{la['ahead_ms']:.3f} ms before the previous graph's last kernel "
                             f"ended; first kernel {la['to_first_kernel_ms']:.3f} ms after the "
                             "call returned (medians)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--runs", default="1,4", help="runs in order, e.g. 1,4,4+noreduce")
    ap.add_argument("--model", choices=("resnet50", "lenet"), default="resnet50")
    ap.add_argument("--solver", type=Path, default=None,
                    help="trace this solver spec instead of --model's, timed as --model's "
                         "(e.g. imagenet_data.py's imagenet_specs/raw_lmdb_solver.yaml: a "
                         "ResNet-50 fed by an LMDB)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--timeout-s", type=float, default=240)
    args = ap.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.solver is not None:
        args.solver = args.solver.resolve()
        if not args.solver.is_file():
            raise SystemExit(f"--solver: {args.solver} is not a file")
    if args.child is not None:
        child(args)
        return
    jsonl = args.out / "replica_profile.jsonl"
    jsonl.unlink(missing_ok=True)
    for run in args.runs.split(","):
        _, _, env = parse_run(run)
        cmd = [sys.executable, __file__, "--out", str(args.out), "--model", args.model,
               "--child", run, *(["--solver", str(args.solver)] if args.solver else [])]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s,
                                  env={**os.environ, **env})
            text, code = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            text, code = str(exc.stdout or "") + str(exc.stderr or ""), -1
        safe = run.replace("=", "_").replace("+", "_")
        (args.out / f"profile_{safe}.log").write_text(text)
        print(f"run {run}: exit {code}", flush=True)
        if code != 0:
            print("  " + "\n  ".join(text.strip().splitlines()[-4:]), flush=True)
    rows = [json.loads(line) for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
    import torch

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else platform.node()
    report = (f"{name} x {torch.cuda.device_count()}, torch {torch.__version__}, "
              f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
              f"`python benchmarks/replica_profile.py --out DIR --model {args.model} "
              + (f"--solver {args.solver} " if args.solver else "")
              + f"--runs {args.runs}`\n\n"
              + table(rows))
    (args.out / "replica_profile.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
