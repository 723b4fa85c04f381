"""The bias gradient of a channel-first (NCHW) output, one GPU: csrc/bias_grad.cu against
PyTorch's sum over the batch and spatial axes, and LeNet's `cpy train` rate with the kernel and
with the net option ``bias_grad_kernel: false`` (PyTorch's), in the same run.

    python benchmarks/bias_grad.py [--iters 6000] [--rounds 2]

Kernel rows: each op captured 20 times in one CUDA graph, replayed until about 0.2 s have
passed, device time per op from CUDA events (the host's launches left out: a LeNet-sized sum
takes less time on the device than the host takes to launch it). The kernel's sums are checked
against a float64 sum first. LeNet rows: ``caffe_py.train.train`` on benchmarks/scale_default.py's
LeNet (constant DummyData, batch 64, fp32), the option on and off in alternating rounds, each
round's rate the median of its display lines after the first.
"""
from __future__ import annotations

import argparse
import datetime
import logging
import re
import statistics
import sys
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

SHAPES = [
    ("LeNet conv1 grad", (64, 20, 24, 24), torch.float32),
    ("LeNet conv2 grad", (64, 50, 8, 8), torch.float32),
    ("CaffeNet conv1 grad, batch 256", (256, 96, 55, 55), torch.float32),
    ("CaffeNet conv5 grad, batch 256", (256, 256, 13, 13), torch.float32),
    ("VGG-16 conv1_2 grad, batch 32, bf16", (32, 64, 224, 224), torch.bfloat16),
    ("VGG-16 conv5_3 grad, batch 32, bf16", (32, 512, 14, 14), torch.bfloat16),
]
PER_GRAPH = 20


def graph_of(op: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """PER_GRAPH calls of ``op`` captured in one CUDA graph (after three warm-up calls)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            op()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(PER_GRAPH):
            op()
    return graph


def device_us(op: Callable[[], object], seconds: float = 0.2) -> float:
    """Microseconds of device time per call of ``op``, from replays of a graph of PER_GRAPH."""
    graph = graph_of(op)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    reps = max(1, int(seconds * 1e3 / max(start.elapsed_time(end), 1e-3)))
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (reps * PER_GRAPH)


def kernel_rows() -> list[str]:
    from caffe_py.kernels import build

    ext = build.load()
    rows = []
    for name, shape, dtype in SHAPES:
        g = torch.randn(shape, device="cuda").to(dtype)
        C, inner = shape[1], g[0, 0].numel()
        dims = [0, *range(2, g.dim())]
        ours = ext.bias_grad(g, C, inner)
        want = g.double().sum(dims)
        err = float((ours.double() - want).abs().max() / want.abs().max().clamp_min(1e-30))
        t_torch = device_us(lambda g=g, dims=dims: g.sum(dims, dtype=torch.float32))
        t_ours = device_us(lambda g=g, C=C, inner=inner: ext.bias_grad(g, C, inner))
        mb = g.numel() * g.element_size() / 1e6
        rows.append(f"| {name} {list(shape)} | {mb:.1f} | {t_torch:.1f} | {t_ours:.1f} | "
                    f"{t_torch / t_ours:.2f}x | {err:.1e} |")
    return rows


class _Rates(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.rates: list[float] = []

    def emit(self, record: logging.LogRecord) -> None:
        m = re.search(r"\(([\d.]+) iter/s", record.getMessage())
        if m:
            self.rates.append(float(m.group(1)))


def lenet_rounds(iters: int, rounds: int,
                 setting: Callable[[bool], AbstractContextManager[object]]
                 ) -> list[tuple[bool, float]]:
    """LeNet's `cpy train` rate (it/s, the median of a round's display lines after the first)
    in ``rounds`` pairs of rounds, ``setting(True)`` then ``setting(False)`` around each."""
    from scale_default import solver_for

    from caffe_py.options import TrainOptions
    from caffe_py.train import train

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        base = solver_for("lenet", Path(tmp), cpu=False)
        spec = yaml.safe_load(base.read_text())
        spec.update(max_iter=iters, display=iters // 6, snapshot=0)
        for k, on in enumerate([True, False] * rounds):
            spec["snapshot_prefix"] = str(Path(tmp) / f"r{k}" / "s")
            path = Path(tmp) / f"solver_{k}.yaml"
            path.write_text(yaml.safe_dump(spec, sort_keys=False))
            handler = _Rates()
            logging.getLogger("caffe_py").addHandler(handler)
            try:
                with setting(on):
                    train(str(path), "0", TrainOptions(overwrite=True))
            finally:
                logging.getLogger("caffe_py").removeHandler(handler)
            out.append((on, statistics.median(handler.rates[1:] or handler.rates)))
    return out


def parse_args(script: str) -> argparse.Namespace:
    """--iters and --rounds for an A/B script of LeNet rounds; exits without a CUDA device."""
    ap = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=6000)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(f"{script}: needs a CUDA device")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.title = (f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
                  f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
                  f"`python benchmarks/{script} --iters {args.iters} --rounds {args.rounds}`")
    return args


def rounds_table(rounds: list[tuple[bool, float]], on: str, off: str, verdict: str) -> list[str]:
    """The LeNet rounds' table: each setting's rates and median, then ``verdict`` with the
    ratio of the medians (on over off)."""
    rates = {flag: [r for f, r in rounds if f == flag] for flag in (True, False)}
    median = {flag: statistics.median(rates[flag]) for flag in (True, False)}
    return ["", "| LeNet `cpy train`, one GPU | it/s (rounds) | median |", "|---|---|---|",
            *(f"| {label} | {', '.join(f'{r:,.0f}' for r in rates[flag])} | "
              f"{median[flag]:,.0f} |" for flag, label in ((True, on), (False, off))),
            f"\n{verdict.format(ratio=median[True] / median[False])}"]


def main() -> None:
    args = parse_args("bias_grad.py")
    lines = [args.title, "", "| gradient | MB | PyTorch's sum, us | csrc/bias_grad.cu, us | "
             "speed-up | max rel. error |", "|---|---|---|---|---|---|", *kernel_rows()]
    from caffe_py.layers.vision import BIAS_GRAD_KERNEL
    from caffe_py.net import default_options

    rounds = lenet_rounds(args.iters, args.rounds,
                          lambda on: default_options({BIAS_GRAD_KERNEL: on}))
    lines += rounds_table(rounds, "bias_grad_kernel (default)", "bias_grad_kernel: false",
                          "The kernel's LeNet rate: {ratio:.3f}x PyTorch's sum's.")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
