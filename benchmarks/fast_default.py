"""`cpy train` with no flag against the usual PyTorch loops, on one GPU, each ratio in one run.

    python benchmarks/fast_default.py --fmnist /usr/share/datasets/fashion-mnist --out "$OUT"
    python benchmarks/fast_default.py --fmnist DIR --device cpu --smoke      # a CPU check

Rows (docs/performance.md keeps the table):
- LeNet (Caffe's lenet_solver: SGD momentum 0.9, weight decay 5e-4, inv policy, lr_mult 2 on
  biases, batch 64) on a Fashion-MNIST LMDB made by caffe-py's converter:
  * plain PyTorch, eager: an nn.Module LeNet with Caffe's update rule written with foreach ops,
    batches sliced from the training images kept on the device (no data loading at all);
  * the same plain step captured in one CUDA graph (the batch copied into a static input);
  * the plain eager loop and cpy's eager iteration (``Solver.iteration``, past the LMDB's first
    pass) in alternating rounds in one process: the eager comparison least moved by the host;
  * ``cpy train`` as the CLI runs it with no flag (``caffe_py.train.train`` with the default
    TrainOptions: CUDA graphs auto), and with ``--graphs off`` (eager), on the LMDB, test
    phases off; the rate over iterations 100-1,000 and 1,000-end (no warm-up period);
  * the whole 10,000-iteration solver as shipped (test every 500): wall time, final accuracy,
    and whether two runs give bit-identical weights.
- ResNet-50 (configs/resnet50_dummy.yaml; bf16 autocast, channels_last, batch 256, SGD):
  torchvision's resnet50 in a plain eager loop; ``cpy train`` with no flag and with
  ``--graphs off`` on constant DummyData; the shipped config as is (gaussian DummyData, refilled
  every forward on the device).
Every rate is measured between two synchronisations after a warm-up.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import itertools
import math
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from multigpu import constant_dummy_data, write_solver  # noqa: E402

from caffe_py.options import TrainOptions  # noqa: E402
from caffe_py.spec.solver_spec import load_solver  # noqa: E402
from caffe_py.tools.convert import convert_idx  # noqa: E402
from caffe_py.train import train  # noqa: E402


# --- the plain LeNet with Caffe's update ---------------------------------------------------
class LeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 20, 5), nn.Conv2d(20, 50, 5)
        self.ip1, self.ip2 = nn.Linear(800, 500), nn.Linear(500, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(self.conv1(x), 2, 2)
        x = F.max_pool2d(self.conv2(x), 2, 2)
        return self.ip2(F.relu(self.ip1(x.flatten(1))))


def inv_rate(it: int) -> float:
    return 0.01 * math.pow(1.0 + 1e-4 * it, -0.75)


class CaffeSGD:
    """Caffe's SGD with momentum 0.9 and weight decay 5e-4; biases at lr_mult 2."""

    def __init__(self, model: nn.Module, device: torch.device):
        named = list(model.named_parameters())
        self.groups = [([p for n, p in named if n.endswith("weight")], 1.0),
                       ([p for n, p in named if n.endswith("bias")], 2.0)]
        self.hist = [[torch.zeros_like(p) for p in ps] for ps, _ in self.groups]
        self.rate = torch.zeros((), device=device)  # the captured step reads it

    @torch.no_grad()
    def step(self, rate: float | torch.Tensor) -> None:
        for (params, mult), hist in zip(self.groups, self.hist, strict=True):
            grads = [p.grad for p in params]
            torch._foreach_add_(grads, params, alpha=5e-4)
            torch._foreach_mul_(hist, 0.9)
            if isinstance(rate, torch.Tensor):
                torch._foreach_add_(hist, torch._foreach_mul(grads, rate * mult))
            else:
                torch._foreach_add_(hist, grads, alpha=rate * mult)
            torch._foreach_sub_(params, hist)


def plain_lenet(images: torch.Tensor, labels: torch.Tensor, device: torch.device, steps: int,
                warmup: int, graph: bool) -> float:
    """Iterations/s of the plain loop (eager, or each step one CUDA graph replay)."""
    step = plain_lenet_step(images, labels, device, graph)
    for it in range(warmup):
        step(it)
    sync(device)
    start = time.perf_counter()
    for it in range(warmup, warmup + steps):
        step(it)
    sync(device)
    return steps / (time.perf_counter() - start)


def plain_lenet_step(images: torch.Tensor, labels: torch.Tensor, device: torch.device,
                     graph: bool) -> Callable[[int], None]:
    """The plain loop's iteration ``step(it)``: eager, or one replay of the captured step."""
    torch.manual_seed(1701)
    model = LeNet().to(device)
    opt = CaffeSGD(model, device)
    n = len(labels) // 64

    def batch(it: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = it % n
        return images[k * 64:(k + 1) * 64].float().mul_(0.00390625), labels[k * 64:(k + 1) * 64]

    if not graph:
        def step(it: int) -> None:
            for p in model.parameters():
                p.grad = None
            x, y = batch(it)
            F.cross_entropy(model(x), y).backward()
            opt.step(inv_rate(it))
    else:
        static_x, static_y = (t.clone() for t in batch(0))
        for it in range(3):   # warm-up before capture, on a side stream
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                model.zero_grad(set_to_none=False)
                F.cross_entropy(model(static_x), static_y).backward()
                opt.step(inv_rate(it))
            torch.cuda.current_stream(device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for p in model.parameters():
                p.grad.zero_()
            F.cross_entropy(model(static_x), static_y).backward()
            opt.step(opt.rate)

        def step(it: int) -> None:
            x, y = batch(it)
            static_x.copy_(x)
            static_y.copy_(y)
            opt.rate.fill_(inv_rate(it))
            g.replay()
    return step


def eager_rounds(solver_file: Path, images: torch.Tensor, labels: torch.Tensor,
                 device: torch.device, rounds: int, n: int) -> tuple[float, float]:
    """Median microseconds an iteration over ``rounds`` alternating timings of ``n``
    iterations each: the plain eager loop's, and cpy's eager iteration (``Solver.iteration``,
    what ``cpy train --graphs off`` runs) past the LMDB's first pass. Alternating in one
    process takes out most of the host's drift, which moves single eager timings by up to
    35% on the GPU machines."""
    import statistics

    from caffe_py.solver.solver import Solver

    step = plain_lenet_step(images, labels, device, graph=False)
    param = dataclasses.replace(load_solver(solver_file), max_iter=10**7, test_interval=0,
                                display=0)
    plain: list[float] = []
    cpy: list[float] = []
    with Solver(param, device=device) as s:
        s.start()
        for it in range(1000):  # 938 batches make the first pass; then the loop gathers
            s.iteration()
            step(it)
        count = itertools.count(1000)
        for _ in range(rounds):
            for times, run in ((plain, lambda: step(next(count))), (cpy, s.iteration)):
                sync(device)
                start = time.perf_counter()
                for _ in range(n):
                    run()
                sync(device)
                times.append(1e6 * (time.perf_counter() - start) / n)
    return statistics.median(plain), statistics.median(cpy)


# --- cpy train, timed through its progress display ------------------------------------------
class Enough(Exception):
    """Raised by a Clock at its last mark to end a long run once it is measured."""


@dataclasses.dataclass
class Clock:
    """A progress 'bar' that notes the time (after a sync) when given iterations pass; with
    ``stop`` it ends the run at the last mark (raising :class:`Enough`)."""

    marks: list[int]
    device: torch.device
    stop: bool = False
    times: dict[int, float] = dataclasses.field(default_factory=dict)
    at: int = 0
    started: float = dataclasses.field(default_factory=time.perf_counter)

    def update(self, n: int) -> None:
        self.at += n
        for m in self.marks:
            if m not in self.times and self.at >= m:
                sync(self.device)
                self.times[m] = time.perf_counter()
        if self.stop and self.at >= self.marks[-1]:
            raise Enough

    def factory(self) -> Callable:
        @contextlib.contextmanager
        def bar(total: int, initial: int) -> Iterator[Clock]:
            self.at = initial
            yield self
        return bar

    def rate(self, a: int, b: int) -> float:
        ta, tb = self.times[a], self.times[b]
        return (b - a) / (tb - ta)


def cpy_rates(solver_file: Path, device: torch.device, graphs: str, marks: list[int],
              compile_net: str = "auto", max_iter: int | None = None, **fields) -> Clock:
    """``cpy train``'s rates between ``marks``; with ``max_iter`` beyond the last mark the
    run is planned that long (what the automatic choices see) and ended at the last mark."""
    param = dataclasses.replace(load_solver(solver_file), max_iter=max_iter or marks[-1],
                                **fields)
    clock = Clock(marks, device, stop=max_iter is not None and max_iter > marks[-1])
    try:
        train(param, [device], TrainOptions(graphs=graphs, progress=clock.factory(),
                                            compile=compile_net))
    except Enough:
        pass
    return clock


# --- data and specs ---------------------------------------------------------------------------
def idx_arrays(fmnist: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The training images (N, 1, 28, 28) uint8 and labels (N,) int64 of the idx files."""
    import gzip

    images = gzip.decompress((fmnist / "train-images-idx3-ubyte.gz").read_bytes())[16:]
    labels = gzip.decompress((fmnist / "train-labels-idx1-ubyte.gz").read_bytes())[8:]
    return (torch.frombuffer(bytearray(images), dtype=torch.uint8).view(-1, 1, 28, 28),
            torch.frombuffer(bytearray(labels), dtype=torch.uint8).long())


def fmnist_dir(work: Path) -> Path:
    return Path((work / "fmnist").read_text())


def lenet_files(fmnist: Path, work: Path) -> Path:
    """Fashion-MNIST LMDBs and configs/mnist.yaml + lenet.yaml pointing at them."""
    (work / "fmnist").write_text(str(fmnist))
    for split, stem in (("train", "train"), ("test", "t10k")):
        db = work / f"{split}_lmdb"
        if not db.exists():
            convert_idx(fmnist / f"{stem}-images-idx3-ubyte.gz",
                        fmnist / f"{stem}-labels-idx1-ubyte.gz", db)
    net = yaml.safe_load((ROOT / "configs" / "lenet.yaml").read_text())
    for layer in net["layer"]:
        if layer["type"] == "Data":
            split = "train" if "train" in layer["data_param"]["source"] else "test"
            layer["data_param"]["source"] = str(work / f"{split}_lmdb")
    (work / "lenet.yaml").write_text(yaml.safe_dump(net, sort_keys=False))
    solver = yaml.safe_load((ROOT / "configs" / "mnist.yaml").read_text())
    solver.update(net="lenet.yaml", snapshot=0, snapshot_after_train=False,
                  snapshot_prefix=str(work / "snap" / "lenet"))
    (work / "mnist.yaml").write_text(yaml.safe_dump(solver, sort_keys=False))
    return work / "mnist.yaml"


def resnet_solver(work: Path, filler: str | None, batch: int) -> Path:
    """configs/resnet50_dummy.yaml at ``batch`` (its shipped fillers, or with ``filler``
    "constant" every top filled once) under the benchmarks' solver (multigpu.write_solver)."""
    net = yaml.safe_load((ROOT / "configs" / "resnet50_dummy.yaml").read_text())
    for layer in net["layer"]:
        if layer["type"] == "DummyData":
            for shape in layer["dummy_data_param"]["shape"]:
                shape["dim"][0] = batch
    if filler == "constant":
        net = constant_dummy_data(net)
    return write_solver(net, work, f"resnet_{filler or 'shipped'}")


def torchvision_rate(device: torch.device, batch: int, steps: int, warmup: int) -> float:
    import torchvision

    model = torchvision.models.resnet50().to(device=device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    x = torch.full((batch, 3, 224, 224), 0.5, device=device).contiguous(
        memory_format=torch.channels_last)
    y = torch.zeros(batch, dtype=torch.long, device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return batch * steps / (time.perf_counter() - start)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def final_weights(solver_file: Path, device: torch.device,
                  deterministic: bool = False) -> tuple[float, list, float]:
    """The shipped 10,000-iteration solve: wall seconds, weights, final test accuracy."""
    start = time.perf_counter()
    root = train(load_solver(solver_file), [device], TrainOptions(deterministic=deterministic))
    seconds = time.perf_counter() - start
    acc = float(root.last_test[0]["accuracy"]) if root.last_test else float("nan")
    return seconds, [lp.param.detach().cpu() for lp in root.net.learnable_params()], acc


# --- main -------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fmnist", type=Path, required=True, help="the Fashion-MNIST .gz files")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=Path("/tmp/cpy_fast"))
    ap.add_argument("--smoke", action="store_true", help="tiny counts (a CPU check)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: lenet,full,resnet")
    args = ap.parse_args()
    device = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.benchmark = device.type == "cuda"
    skip = set(filter(None, args.skip.split(",")))
    steps, end = (20, 60) if args.smoke else (3000, 6000)
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        solver = lenet_files(args.fmnist, work)
        parts = [("lenet", lambda: lenet_rows(solver, work, device, steps, end, args.smoke)),
                 ("profile", lambda: profile_eager(solver, work, device, args.out,
                                                   20 if args.smoke else 300) or []),
                 ("full", lambda: full_rows(solver, device, args.smoke)),
                 ("resnet", lambda: resnet_rows(work, device, args.smoke))]
        for name, part in parts:
            if name not in skip:
                rows += part()
                # the table so far: a run cut short still leaves what it measured
                (args.out / "fast_default.md").write_text(markdown(rows, device))
    print((args.out / "fast_default.md").read_text(), flush=True)


def lenet_rows(solver: Path, work: Path, device: torch.device, steps: int, end: int,
               smoke: bool) -> list[tuple[str, str]]:
    images, labels = idx_arrays(fmnist_dir(work))
    images, labels = images.to(device), labels.to(device)
    eager = plain_lenet(images, labels, device, steps, 200 if not smoke else 5, graph=False)
    rows = [("LeNet, plain PyTorch eager loop (it/s)", f"{eager:,.0f}")]
    graphed = None
    if device.type == "cuda":
        graphed = plain_lenet(images, labels, device, steps, 200, graph=True)
        rows.append(("LeNet, the plain step as one CUDA graph (it/s)", f"{graphed:,.0f}"))
    rounds, n = (3, 10) if smoke else (9, 500)
    plain_us, cpy_us = eager_rounds(solver, images, labels, device, rounds, n)
    rows.append((f"LeNet eager, alternating rounds ({rounds} x {n} iterations each): the plain "
                 "loop / cpy's iteration, median us", f"{plain_us:,.0f} / {cpy_us:,.0f} "
                 f"({plain_us / cpy_us:.2f}x the plain eager loop)"))
    marks = [100, 1000, end] if not smoke else [5, 20, end]
    fields = {"test_interval": 0, "display": 0}
    auto = cpy_rates(solver, device, "auto", marks, **fields)
    off = cpy_rates(solver, device, "off", marks, **fields)
    for name, clock in (("cpy train, no flag", auto), ("cpy train --graphs off", off)):
        early, late = clock.rate(marks[0], marks[1]), clock.rate(marks[1], marks[2])
        base = graphed if (graphed and clock is auto) else eager
        label = "graph step" if (graphed and clock is auto) else "eager loop"
        rows.append((f"LeNet, {name}: it/s over iterations {marks[0]}-{marks[1]} / "
                     f"{marks[1]}-{marks[2]}",
                     f"{early:,.0f} / {late:,.0f} ({late / base:.2f}x the plain {label})"))
    return rows


def profile_eager(solver: Path, work: Path, device: torch.device, out: Path, steps: int) -> None:
    """Where an eager LeNet iteration's host time goes: torch.profiler over cpy's eager loop
    and the plain loop (host self time per op), and cProfile over cpy's Python."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    from caffe_py.solver.solver import Solver

    param = dataclasses.replace(load_solver(solver), max_iter=10**6, test_interval=0,
                                display=0)
    text = []
    with Solver(param, device=device) as s:
        s.start()
        for _ in range(50):
            s.iteration()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                s.iteration()
        text.append(f"cpy eager iteration, {steps} iterations, by host self time\n"
                    + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
        stats = io.StringIO()
        cp = cProfile.Profile()
        cp.enable()
        for _ in range(steps):
            s.iteration()
        cp.disable()
        pstats.Stats(cp, stream=stats).sort_stats("tottime").print_stats(40)
        text.append("cProfile of the same loop\n" + stats.getvalue())
    images, labels = idx_arrays(fmnist_dir(work))
    images, labels = images.to(device), labels.to(device)
    model = LeNet().to(device)
    opt = CaffeSGD(model, device)

    def step(it: int) -> None:
        for p in model.parameters():
            p.grad = None
        k = it % 900
        x = images[k * 64:(k + 1) * 64].float().mul_(0.00390625)
        F.cross_entropy(model(x), labels[k * 64:(k + 1) * 64]).backward()
        opt.step(inv_rate(it))

    for it in range(50):
        step(it)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for it in range(steps):
            step(it)
    text.append(f"plain eager loop, {steps} iterations, by host self time\n"
                + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30))
    (out / "eager_profile.txt").write_text("\n\n".join(text))


def full_rows(solver: Path, device: torch.device, smoke: bool) -> list[tuple[str, str]]:
    if smoke:
        data = yaml.safe_load(solver.read_text())
        data.update(max_iter=40, test_interval=20, test_iter=5, display=20)
        solver.write_text(yaml.safe_dump(data, sort_keys=False))
    seconds, w1, acc = final_weights(solver, device)
    _, w2, _ = final_weights(solver, device)
    same = all(torch.equal(a, b) for a, b in zip(w1, w2, strict=True))
    det_s, d1, det_acc = final_weights(solver, device, deterministic=True)
    _, d2, _ = final_weights(solver, device, deterministic=True)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.deterministic = False
    det_same = all(torch.equal(a, b) for a, b in zip(d1, d2, strict=True))
    iters = yaml.safe_load(solver.read_text())["max_iter"]
    return [(f"LeNet, the shipped solver ({iters} iterations, tests every 500): wall s, "
             "final accuracy", f"{seconds:.1f} s, {acc:.4f}"),
            ("LeNet, two runs of the default path: bit-identical weights", str(same)),
            ("LeNet, the same with --deterministic: wall s, accuracy, bit-identical",
             f"{det_s:.1f} s, {det_acc:.4f}, {det_same}")]


LONG_RUN = 450_000
"""Iterations of the long ResNet-50 row: a Caffe ResNet-50 solver's length (ImageNet at batch
256 for 90 epochs), which the default's automatic compile sees as worth compiling."""


def resnet_rows(work: Path, device: torch.device, smoke: bool) -> list[tuple[str, str]]:
    batch, warm, steps = (2, 2, 3) if smoke else (256, 15, 60)
    rows = []
    base = None
    if device.type == "cuda":
        try:
            base = torchvision_rate(device, batch, steps, warm)
            rows.append(("ResNet-50, torchvision plain eager loop (img/s)", f"{base:,.0f}"))
        except ImportError:
            rows.append(("ResNet-50, torchvision plain eager loop", "torchvision missing"))
    marks = [warm, warm + steps]
    rates = {}
    long_run = LONG_RUN if not smoke else 10**6
    for name, filler, graphs, compile_net, planned in (
            ("no flag, constant DummyData", "constant", "auto", "auto", None),
            ("--graphs off, constant DummyData", "constant", "off", "auto", None),
            ("no flag, the shipped config (gaussian)", None, "auto", "auto", None),
            (f"no flag, a {long_run:,}-iteration run (compiles by itself), constant "
             "DummyData", "constant", "auto", "auto", long_run),
            ("--compile, constant DummyData", "constant", "auto", "on", None)):
        torch._dynamo.reset()  # no row reuses another's compiled code (each pays its compile)
        # the long run: timed from the 30th iteration after the automatic compile's
        # re-capture (warm-up, timed replays, compile, warm-up, timed replays: ~10)
        at = [m + 30 for m in marks] if planned else marks
        try:
            clock = cpy_rates(resnet_solver(work, filler, batch), device, graphs, at,
                              compile_net=compile_net, max_iter=planned)
        except Exception as exc:  # noqa: BLE001 - a failed variant is a row, not the end
            rows.append((f"ResNet-50, cpy train {name}", f"failed: {str(exc)[:160]}"))
            continue
        rates[name] = batch * clock.rate(*at)
        ratio = f" ({rates[name] / base:.2f}x torchvision)" if base else ""
        extra = (f"; {clock.times[at[0]] - clock.started:.0f} s from the start to iteration "
                 f"{at[0]}, compile included" if planned else "")
        rows.append((f"ResNet-50, cpy train {name} (img/s)",
                     f"{rates[name]:,.0f}{ratio}{extra}"))
    shipped = rates["no flag, the shipped config (gaussian)"]
    rows.append(("ResNet-50, the shipped config / constant data",
                 f"{shipped / rates['no flag, constant DummyData']:.3f}"))
    return rows


def markdown(rows: list[tuple[str, str]], device: torch.device) -> str:
    machine = (torch.cuda.get_device_name(device) if device.type == "cuda"
               else f"CPU ({platform.processor() or platform.machine()})")
    lines = [f"Machine: {machine}; torch {torch.__version__}; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"Command: `python {' '.join(sys.argv)}`", "", "| what | result |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
