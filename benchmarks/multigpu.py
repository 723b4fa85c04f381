"""Multi-GPU benchmark of caffe-py's data parallelism (driven by benchmarks/gpu_multigpu.sh).

Subcommands (each prints one JSON line per result and appends it to --json):

    solver   write a benchmark solver spec for a net (DummyData made constant, see below)
    caffe    caffe-py's ReplicatedRun (the code `cpy train --gpus` runs) on --gpus: images/s,
             per-replica host CPU ms and sync-wait ms per step; --profile writes a
             torch.profiler summary of the root replica's steps
    reduce   reduce (+ broadcast) one net's gradient: caffe-py's tree engine, its NCCL engine,
             a bare P2P tree and a bare torch.cuda.nccl.all_reduce
    table    the markdown tables of every result in --json

The benchmark nets keep their DummyData shapes but use constant fillers: a gaussian top is
refilled on the host every forward (Caffe's rule), 154 MB per ResNet-50 step per replica,
which would measure the host's random number generator instead of the GPUs. The baselines
(benchmarks/ddp_baseline.py) run the very same solver file.
"""
from __future__ import annotations

import argparse
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from caffe_py.devices import parse_devices
from caffe_py.io import feed_of
from caffe_py.options import TrainOptions
from caffe_py.parallel import ReplicatedRun, Tuning
from caffe_py.parallel.nccl import NcclSync
from caffe_py.parallel.sync import SyncGroup, TreeSync, run_replicas
from caffe_py.spec.solver_spec import load_solver


# --- benchmark specs ---------------------------------------------------------------------------
def constant_dummy_data(net: dict) -> dict:
    """The net with every DummyData top filled once by a constant (no per-step host refill)."""
    for layer in net["layer"]:
        if layer.get("type") == "DummyData":
            p = layer.setdefault("dummy_data_param", {})
            tops = len(layer["top"]) if isinstance(layer["top"], list) else 1
            p["data_filler"] = [{"type": "constant", "value": 0.5 if k == 0 else 0.0}
                                for k in range(tops)]
    return net


def lenet_dummy(lenet: dict, batch: int) -> dict:
    """configs/lenet.yaml with its Data layers replaced by one DummyData of MNIST's shape."""
    layers = [layer for layer in lenet["layer"] if layer.get("type") != "Data"
              and not _test_only(layer)]
    data = {"name": "data", "type": "DummyData", "top": ["data", "label"],
            "dummy_data_param": {"shape": [{"dim": [batch, 1, 28, 28]}, {"dim": [batch]}]}}
    return constant_dummy_data({"name": lenet.get("name", "LeNet"), "layer": [data, *layers]})


def _test_only(layer: dict) -> bool:
    inc = layer.get("include")
    rules = inc if isinstance(inc, list) else [inc] if inc else []
    return bool(rules) and all(r.get("phase") == "TEST" for r in rules)


def write_solver(net: dict, out: Path, name: str, precision: str = "BF16",
                 lr: float = 0.01) -> Path:
    """``net`` as out/<name>_net.yaml and the benchmarks' SGD solver over it (fixed rate,
    momentum 0.9, weight decay 1e-4, no display, no snapshot) as out/<name>_solver.yaml;
    returns the solver file's path (max_iter is the caller's to set)."""
    out.mkdir(parents=True, exist_ok=True)
    net_path = out / f"{name}_net.yaml"
    net_path.write_text(yaml.safe_dump(net, sort_keys=False))
    solver = {"net": str(net_path), "base_lr": lr, "momentum": 0.9,
              "weight_decay": 1e-4, "lr_policy": "fixed", "max_iter": 1, "display": 0,
              "random_seed": 1, "precision": precision, "snapshot_after_train": False,
              "snapshot_prefix": str(out / f"{name}_snap")}
    path = out / f"{name}_solver.yaml"
    path.write_text(yaml.safe_dump(solver, sort_keys=False))
    return path


def report_phases(feed: Any) -> None:
    """Where a feed thread's time went per batch with the decode processes (the log only;
    nothing for a feed without them)."""
    images = getattr(feed, "images", None)
    crops = images.crops if images is not None else None
    if crops is not None and crops.batches:
        print(f"feed {feed.name}: {crops.summary()}", flush=True)


def cmd_solver(args: argparse.Namespace) -> None:
    net = yaml.safe_load(args.net.read_text())
    net = lenet_dummy(net, args.batch or 64) if args.lenet else constant_dummy_data(net)
    print(write_solver(net, args.out.resolve(), args.name, args.precision, args.lr))


# --- caffe-py throughput ------------------------------------------------------------------------
def sync_devices(devices: list[torch.device]) -> None:
    for d in dict.fromkeys(devices):
        if d.type == "cuda":
            torch.cuda.synchronize(d)


class NoteHandler(logging.Handler):
    """Keeps the run's log lines (the graph fallbacks are reported with the results)."""

    def __init__(self, notes: list[str]):
        super().__init__(logging.INFO)
        self.notes = notes

    def emit(self, record: logging.LogRecord) -> None:
        self.notes.append(record.getMessage())


class StepClock:
    """Callback of one replica: wall time of the timed steps, host CPU time of its thread
    (from the first timed step to the last backward), and an optional profile of 5 steps."""

    def __init__(self, devices: list[torch.device], warmup: int, root: bool,
                 profile: Path | None):
        self.devices, self.warmup, self.root, self.profile = devices, warmup, root, profile
        self.start = self.cpu0 = self.cpu = self.process0 = self.process_cpu = 0.0
        self.wait0 = 0.0
        self.prof: Any = None

    def on_start(self, solver: Any) -> None:
        if solver.iter != self.warmup:
            if self.prof is not None and solver.iter == self.warmup + 5:
                self._stop_profile()
            return
        self.cpu0 = time.thread_time()
        if self.root:
            self.process0 = time.process_time()
            sync_devices(self.devices)
            self.start = time.perf_counter()
            if self.profile is not None:
                from torch.profiler import ProfilerActivity, profile
                acts = [ProfilerActivity.CPU] + (
                    [ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
                self.prof = profile(activities=acts)
                self.prof.__enter__()

    def on_gradient_ready(self, solver: Any) -> None:
        self.cpu = time.thread_time() - self.cpu0
        if self.root:
            self.process_cpu = time.process_time() - self.process0

    def _stop_profile(self) -> None:
        self.prof.__exit__(None, None, None)
        sort = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
        table = self.prof.key_averages().table(sort_by=sort, row_limit=40)
        self.profile.write_text("torch.profiler over 5 steps of the root replica "
                                "(all threads' ops appear)\n" + table)
        self.prof = None


def cmd_caffe(args: argparse.Namespace) -> None:
    torch.backends.cudnn.benchmark = True
    devices = parse_devices(args.gpus)
    param = load_solver(args.solver)
    param.max_iter = args.warmup + args.iters
    clocks = [StepClock(devices, args.warmup, i == 0, args.profile if i == 0 else None)
              for i in range(len(devices))]
    param.memory_format = "CHANNELS_LAST" if args.channels_last else "CONTIGUOUS"
    notes: list[str] = []
    logging.getLogger("caffe_py").setLevel(logging.INFO)
    logging.getLogger("caffe_py").addHandler(NoteHandler(notes))
    tuning = Tuning(extra_callbacks=lambda i: [clocks[i]], overlap=not args.no_overlap,
                    lockstep=False if args.no_lockstep else None)
    options = TrainOptions(reduction=args.reduction, graphs="on" if args.graphs else "off")
    with ReplicatedRun(param, devices, options, tuning=tuning) as run:
        batch = run.root.batch_size()
        waits = [0.0] * len(devices)

        class Waits:  # sync waits before the timed steps are not counted
            def on_start(self, solver: Any) -> None:
                if solver.iter == args.warmup:
                    for i, rep in enumerate(run.sync.replicas):
                        waits[i] = rep.wait_s

            def on_gradient_ready(self, solver: Any) -> None:
                pass

        run.root.callbacks.append(Waits())
        run.run()
        sync_devices(devices)
        seconds = time.perf_counter() - clocks[0].start
        for solver in run.solvers:
            for layer in solver.net.data_layers():
                report_phases(getattr(feed_of(layer), "real", feed_of(layer)))  # graphs wrap it
        wait_ms = [1000 * (rep.wait_s - w) / args.iters for rep, w in
                   zip(run.sync.replicas, waits, strict=True)]
        early = [rep.early / max(1, param.max_iter * len(rep.flat.buckets))
                 for rep in run.sync.replicas]
        name = run.root.net.name
        lockstep = run.lockstep
    if lockstep:   # one thread issues every replica's step: its CPU time is the only one
        clocks = clocks[:1]
    n = len(devices)
    run_name = (f"caffe-py {args.reduction}" + (" + CUDA graphs" if args.graphs else "")
                + (", one thread (lockstep)" if lockstep and n > 1 else "")
                + (", a thread per replica" if args.graphs and not lockstep and n > 1 else "")
                + (", reduce after backward" if args.no_overlap else ""))
    fallbacks = [m for m in notes if m.startswith("CUDA graphs off")]
    if fallbacks:
        run_name += " (graphs fell back to eager)"
        print("\n".join(fallbacks), flush=True)
    emit(args.json, {
        "kind": "throughput" if args.profile is None else "profiled", "model": name,
        "run": run_name,
        "gpus": n, "batch": batch, "images_per_s": round(args.iters * batch * n / seconds, 1),
        "step_ms": round(1000 * seconds / args.iters, 2),
        "cpu_ms_per_step": [round(1000 * c.cpu / args.iters, 2) for c in clocks],
        "process_cpu_ms_per_step": round(1000 * clocks[0].process_cpu / args.iters, 2),
        "sync_wait_ms_per_step": [round(w, 2) for w in wait_ms],
        "buckets_sent_during_backward": [round(e, 2) for e in early]})


# --- reduction micro-benchmark ------------------------------------------------------------------
def grad_shapes(solver_path: Path) -> tuple[str, list[torch.Size]]:
    from caffe_py.net import Net

    spec, state = load_solver(solver_path).train_net_spec()
    net = Net(spec, "TRAIN", stages=state.stage, level=state.level, device="cpu")
    return net.name, [lp.param.shape for lp in net.learnable_params()
                      if lp.param.requires_grad]


def engine_ms(group: SyncGroup, devices: list[torch.device], shapes, iters: int) -> float:
    """ms per weights-down + grads-up through an engine's threads (no compute between)."""
    for i, d in enumerate(devices):
        group.setup(i, [torch.nn.Parameter(torch.ones(s, device=d)) for s in shapes])
    cbs = [group.callback(i) for i in range(len(devices))]
    clock: dict[str, float] = {}
    go = threading.Barrier(len(devices))

    def loop(i: int) -> None:
        for k in range(iters + 5):
            if k == 5:
                go.wait(60)
                if i == 0:
                    sync_devices(devices)
                    clock["t0"] = time.perf_counter()
            cbs[i].on_start()
            cbs[i].on_gradient_ready()
        go.wait(60)
        sync_devices(devices)

    run_replicas(group, [lambda i=i: loop(i) for i in range(len(devices))])
    return 1000 * (time.perf_counter() - clock["t0"]) / iters


def engine_lockstep_ms(group: TreeSync, devices: list[torch.device], shapes,
                       iters: int) -> float:
    """ms per weights-down + grads-up of the tree engine driven from one thread in lockstep
    order (weights top-down, gradients bottom-up), as with CUDA graphs."""
    from caffe_py.parallel.lockstep import on_replica, top_down

    for i, d in enumerate(devices):
        group.setup(i, [torch.nn.Parameter(torch.ones(s, device=d)) for s in shapes])
    down = [group.tree.root, *top_down(group)]
    for i in down:
        rep = group.replica(i)
        if rep.stream is not None:
            rep.stream.wait_stream(torch.cuda.default_stream(rep.device))
    t0 = 0.0
    for k in range(iters + 5):
        if k == 5:
            sync_devices(devices)
            t0 = time.perf_counter()
        for i in down:
            with on_replica(group.replica(i)):
                group.weights_down(i)
        for i in reversed(down):
            with on_replica(group.replica(i)):
                group.grads_up(i)
    sync_devices(devices)
    return 1000 * (time.perf_counter() - t0) / iters


def bare_tree_ms(devices, shapes, iters: int) -> tuple[float, float]:
    """ms of a bare P2P tree reduce, and of reduce + broadcast, from one thread."""
    from caffe_py.parallel.topology import build_tree, peer_matrix

    tree = build_tree(len(devices), peer_matrix(devices))
    numel = sum(torch.Size(s).numel() for s in shapes)
    grads = [torch.ones(numel, device=d) for d in devices]
    inbox = {e.child: torch.empty(numel, device=devices[e.parent]) for e in tree.edges}

    def reduce() -> None:
        for e in tree.edges:  # round by round: children's sums are complete first
            inbox[e.child].copy_(grads[e.child], non_blocking=True)
            grads[e.parent].add_(inbox[e.child])
        grads[0].mul_(1.0 / len(devices))

    def broadcast() -> None:
        for e in reversed(tree.edges):
            grads[e.child].copy_(grads[e.parent], non_blocking=True)

    out = []
    for steps in ((reduce,), (reduce, broadcast)):
        for k in range(iters + 5):
            if k == 5:
                sync_devices(devices)
                t0 = time.perf_counter()
            for step in steps:
                step()
        sync_devices(devices)
        out.append(1000 * (time.perf_counter() - t0) / iters)
    return out[0], out[1]


def bare_nccl_ms(devices, shapes, iters: int) -> float:
    import torch.cuda.nccl as nccl

    numel = sum(torch.Size(s).numel() for s in shapes)
    grads = [torch.ones(numel, device=d) for d in devices]
    for k in range(iters + 5):
        if k == 5:
            sync_devices(devices)
            t0 = time.perf_counter()
        nccl.all_reduce(grads)
    sync_devices(devices)
    return 1000 * (time.perf_counter() - t0) / iters


def cmd_reduce(args: argparse.Namespace) -> None:
    devices = parse_devices(args.gpus)
    model, shapes = grad_shapes(args.solver)
    mb = round(sum(torch.Size(s).numel() for s in shapes) * 4 / 1e6, 1)
    n = len(devices)
    base = {"kind": "reduce", "model": model, "gpus": n, "mb": mb, "tensors": len(shapes)}
    reduce_ms, both_ms = bare_tree_ms(devices, shapes, args.iters)
    emit(args.json, {**base, "op": "bare P2P tree: reduce (copies + adds, 1/N)",
                     "ms": round(reduce_ms, 3)})
    emit(args.json, {**base, "op": "bare P2P tree: reduce + broadcast", "ms": round(both_ms, 3)})
    ms = engine_ms(TreeSync(devices), devices, shapes, args.iters)
    emit(args.json, {**base, "op": "caffe-py tree engine: reduce + broadcast (threads)",
                     "ms": round(ms, 3)})
    ms = engine_lockstep_ms(TreeSync(devices), devices, shapes, args.iters)
    emit(args.json, {**base, "op": "caffe-py tree engine: reduce + broadcast (one thread, "
                     "lockstep)", "ms": round(ms, 3)})
    if all(d.type == "cuda" for d in devices):
        emit(args.json, {**base, "op": "bare torch.cuda.nccl.all_reduce",
                         "ms": round(bare_nccl_ms(devices, shapes, args.iters), 3)})
        ms = engine_ms(NcclSync(devices), devices, shapes, args.iters)
        emit(args.json, {**base, "op": "caffe-py nccl engine: all_reduce + broadcast (threads)",
                         "ms": round(ms, 3)})


# --- results ------------------------------------------------------------------------------------
def emit(path: Path | None, record: dict) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if path is not None:
        with path.open("a") as f:
            f.write(line + "\n")


def cmd_table(args: argparse.Namespace) -> None:
    records = [json.loads(x) for x in args.json.read_text().splitlines() if x.strip()]
    reduce_rows = [r for r in records if r.get("kind") == "reduce"]
    print(throughput_table([r for r in records if r.get("kind") == "throughput"], reduce_rows))
    print()
    print(reduce_table(reduce_rows))


def throughput_table(rows: list[dict], reduce_rows: list[dict] = ()) -> str:
    out = ["| model | run | GPUs | batch/GPU | images/s | step ms | vs PyTorch 1-GPU x N | "
           "vs DDP | sync wait ms/step (per replica) | host CPU ms/step (per replica) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    notes: list[str] = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        plain = next((r for r in mine if r["run"] == "pytorch 1-GPU loop"), None)
        for r in mine:
            ddp = next((d for d in mine if d["run"].startswith("torchrun DDP")
                        and d["gpus"] == r["gpus"]), None)
            lin = (f"{r['images_per_s'] / (plain['images_per_s'] * r['gpus']):.1%}"
                   if plain else "-")
            vs = (f"{r['images_per_s'] / ddp['images_per_s']:.2f}x"
                  if ddp and ddp is not r else "-")
            waits = ", ".join(f"{w:g}" for w in r.get("sync_wait_ms_per_step", [])) or "-"
            cpu = ", ".join(f"{c:g}" for c in r.get("cpu_ms_per_step", [])) or "-"
            out.append(f"| {model} | {r['run']} | {r['gpus']} | {r['batch']} | "
                       f"{r['images_per_s']:,.0f} | {r['step_ms']:g} | {lin} | {vs} | {waits} | "
                       f"{cpu} |")
            if ddp and ddp is not r and r["images_per_s"] < 0.97 * ddp["images_per_s"]:
                notes.append(limits(model, r, ddp, reduce_rows))
    if notes:
        out += ["", "What limits the caffe-py rows below DDP:", *notes]
    return "\n".join(out)


def limits(model: str, r: dict, ddp: dict, reduce_rows: list[dict]) -> str:
    """One line: the share of the step the GIL-holding threads, the waits, the copies take."""
    step = r["step_ms"]
    cpu = r.get("cpu_ms_per_step", [])
    waits = r.get("sync_wait_ms_per_step", [])
    parts = [f"- {model}, {r['run']} x{r['gpus']}: {r['images_per_s'] / ddp['images_per_s']:.2f}x"
             f" DDP, step {step:g} ms vs DDP {ddp['step_ms']:g} ms"]
    if cpu:
        parts.append(f"replica threads' own CPU {sum(cpu):.1f} ms/step, whole process "
                     f"{r.get('process_cpu_ms_per_step', 0):g} ms/step (Python work of all "
                     f"threads near the step time means the GIL serialises them)")
    if waits:
        parts.append(f"longest sync wait {max(waits):g} ms/step ({max(waits) / step:.0%})")
    tree = [x for x in reduce_rows if x["op"].startswith("caffe-py tree engine")
            and x.get("model") == model and x["gpus"] == r["gpus"]]
    if tree:
        parts.append(f"tree reduce+broadcast alone {tree[0]['ms']:g} ms "
                     f"({tree[0]['ms'] / step:.0%})")
    return "; ".join(parts)


def reduce_table(rows: list[dict]) -> str:
    out = ["| gradient reduction | model | GPUs | MB (tensors) | ms |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['op']} | {r.get('model', '-')} | {r['gpus']} | {r['mb']} "
                   f"({r['tensors']}) | {r['ms']} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("solver")
    s.add_argument("--net", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--name", required=True)
    s.add_argument("--lenet", action="store_true", help="net is configs/lenet.yaml")
    s.add_argument("--batch", type=int, default=0)
    s.add_argument("--precision", default="BF16", choices=("BF16", "FLOAT32"))
    s.add_argument("--lr", type=float, default=0.01)
    c = sub.add_parser("caffe")
    c.add_argument("--solver", type=Path, required=True)
    c.add_argument("--gpus", required=True)
    c.add_argument("--reduction", default="tree", choices=("tree", "nccl"))
    c.add_argument("--channels-last", action="store_true")
    c.add_argument("--graphs", action="store_true", help="each replica's step as a CUDA graph")
    c.add_argument("--no-overlap", action="store_true",
                   help="tree: reduce after backward, not bucket by bucket during it")
    c.add_argument("--no-lockstep", action="store_true",
                   help="with --graphs: a thread per replica instead of the root's thread")
    c.add_argument("--profile", type=Path)
    r = sub.add_parser("reduce")
    r.add_argument("--solver", type=Path, required=True)
    r.add_argument("--gpus", required=True)
    for p in (c, r):
        p.add_argument("--warmup", type=int, default=15)
        p.add_argument("--iters", type=int, default=30)
        p.add_argument("--json", type=Path)
    t = sub.add_parser("table")
    t.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    {"solver": cmd_solver, "caffe": cmd_caffe, "reduce": cmd_reduce,
     "table": cmd_table}[args.cmd](args)


if __name__ == "__main__":
    main()
