"""InnerProduct's float32 forward on one GPU: Caffe's two steps (``torch.mm``, then the bias
added in place: the layer's path, ``layers.common.linear_fp32``) against PyTorch's fused
``F.linear`` (cuBLAS's ``addmm``), and LeNet's `cpy train` rate with each, in the same run.

    python benchmarks/inner_product.py [--iters 6000] [--rounds 2]

Per shape: device time per op (each op captured 20 times in one CUDA graph, replayed for about
0.2 s: bias_grad.py's ``device_us``), the host time to launch a graph of 20 such ops (the median
of 9 launches, the device idle), and each result's largest error against float64, relative to
the largest output. LeNet rows: ``caffe_py.train.train`` on scale_default.py's LeNet (constant
DummyData, batch 64), the layer's path and ``F.linear`` in alternating rounds.
"""
from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from bias_grad import (  # noqa: E402
    PER_GRAPH,
    device_us,
    graph_of,
    lenet_rounds,
    parse_args,
    rounds_table,
)

from caffe_py.layers.common import InnerProduct, linear_fp32  # noqa: E402

SHAPES = [   # name, (M, K, N)
    ("LeNet ip2", (64, 500, 10)),
    ("LeNet ip1", (64, 800, 500)),
    ("CIFAR-10 quick ip2", (100, 64, 10)),
    ("a 10-way classifier on 1,024 features, batch 100", (100, 1024, 10)),
    ("LeNet ip2, batch 1,024", (1024, 500, 10)),
    ("CaffeNet fc8, batch 256", (256, 4096, 1000)),
    ("ResNet-50 fc1000, batch 256", (256, 2048, 1000)),
]


def launch_us(op: Callable[[], object]) -> float:
    """The host's time to launch a graph of PER_GRAPH calls of ``op`` (median of 9, idle)."""
    graph = graph_of(op)
    times = []
    for _ in range(9):
        torch.cuda.synchronize()
        t = time.perf_counter()
        graph.replay()
        times.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return 1e6 * statistics.median(times)


def shape_rows() -> list[str]:
    rows = []
    for name, (m, k, n) in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, k, device="cuda", generator=g)
        w = torch.randn(n, k, device="cuda", generator=g) / k ** 0.5
        b = torch.randn(n, device="cuda", generator=g)
        want = x.double() @ w.double().t() + b.double()
        ops = {"F.linear": lambda x=x, w=w, b=b: F.linear(x, w, b),
               "mm, add_": lambda x=x, w=w, b=b: linear_fp32(x, w, b)}
        cells = []
        for op in ops.values():
            err = float((op().double() - want).abs().max() / want.abs().max())
            cells.append((device_us(op), launch_us(op), err))
        (t_lin, l_lin, e_lin), (t_ours, l_ours, e_ours) = cells
        rows.append(f"| {name} ({m}x{k} by {k}x{n}) | {t_lin:.1f} | {t_ours:.1f} | "
                    f"{t_lin / t_ours:.2f}x | {l_lin:.0f} | {l_ours:.0f} | "
                    f"{e_lin:.1e} / {e_ours:.1e} |")
    return rows


def fused_forward(self: InnerProduct, x: torch.Tensor) -> torch.Tensor:
    """InnerProduct's forward through PyTorch's fused ``F.linear`` (cuBLAS's ``addmm``): the
    layer's float32 GPU path before ``linear_fp32``."""
    weight = self.weight.t() if self.transpose else self.weight
    return F.linear(x.flatten(self.axis), weight, self.bias if self.has_bias else None)


@contextlib.contextmanager
def layer_path(on: bool) -> Iterator[None]:
    """The layer's float32 path (on), or every InnerProduct through F.linear (off)."""
    forward = InnerProduct.forward
    if not on:
        InnerProduct.forward = fused_forward  # type: ignore[method-assign]
    try:
        yield
    finally:
        InnerProduct.forward = forward  # type: ignore[method-assign]


def main() -> None:
    args = parse_args("inner_product.py")
    lines = [args.title, "", f"| shape | F.linear, us | mm, add_, us | speed-up | launch of "
             f"{PER_GRAPH}: F.linear, us | mm, add_, us | rel. error (F.linear / mm, add_) |",
             "|---|---|---|---|---|---|---|", *shape_rows()]
    rounds = lenet_rounds(args.iters, args.rounds, layer_path)
    lines += rounds_table(rounds, "mm, add_ (the layer's float32 path)", "F.linear",
                          "The layer's path's LeNet rate: {ratio:.3f}x F.linear's.")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
