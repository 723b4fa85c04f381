"""One forward and backward pass of BVLC's own nets, NCHW against channels_last, on this machine.

    python benchmarks/memory_format_cpu.py                 # every net, about a minute
    python benchmarks/memory_format_cpu.py alexnet         # the named ones

Each net is the deploy form of a committed BVLC prototxt (data layers replaced by one input of
the shape below), built in the TRAIN phase, laid out as the solver's ``memory_format`` lays it
out, and timed over as many passes as fit in ``--seconds`` after 3 untimed ones. The table is
what docs/solver.md quotes for the choice of ``memory_format: AUTO``.
"""
from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from caffe_py.api import deploy_spec  # noqa: E402
from caffe_py.net import Net  # noqa: E402

BVLC = ROOT / "tests/fixtures/prototxts/bvlc"
NETS = {
    "lenet": ("examples/mnist/lenet_train_test.prototxt", (64, 1, 28, 28)),
    "cifar10_quick": ("examples/cifar10/cifar10_quick_train_test.prototxt", (32, 3, 32, 32)),
    "cifar10_full": ("examples/cifar10/cifar10_full_train_test.prototxt", (32, 3, 32, 32)),
    "cifar10_full_sigmoid_bn": ("examples/cifar10/cifar10_full_sigmoid_train_test_bn.prototxt",
                                (32, 3, 32, 32)),
    "alexnet": ("models/bvlc_alexnet/train_val.prototxt", (4, 3, 227, 227)),
}


def pass_ms(prototxt: Path, shape: tuple[int, ...], fmt: torch.memory_format,
            seconds: float) -> float:
    """Milliseconds of one forward and backward pass of the net laid out in ``fmt``."""
    torch.manual_seed(0)
    net = Net(deploy_spec(prototxt, {"data": shape}), "TRAIN", device="cpu")
    net.to(memory_format=fmt)
    x = torch.rand(shape).contiguous(memory_format=fmt)

    def one() -> None:
        for p in net.parameters():
            p.grad = None
        out = net.forward({"data": x})
        sum(o.float().sum() for o in out.outputs.values()).backward()

    for _ in range(3):
        one()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        one()
        n += 1
    return (time.perf_counter() - start) / n * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("nets", nargs="*", help=f"any of {', '.join(NETS)} (default: all)")
    ap.add_argument("--seconds", type=float, default=3.0, help="timed seconds per row")
    args = ap.parse_args()
    unknown = [name for name in args.nets if name not in NETS]
    if unknown:
        ap.error(f"unknown net '{unknown[0]}': choose from {', '.join(NETS)}")
    print(f"Machine: {platform.processor() or platform.machine()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. Command: "
          f"`python {' '.join(sys.argv)}`.\n")
    print("| net (batch) | contiguous ms | channels_last ms | speed-up |\n|---|---:|---:|---:|")
    for name in args.nets or NETS:
        path, shape = NETS[name]
        nchw, last = (pass_ms(BVLC / path, shape, fmt, args.seconds)
                      for fmt in (torch.contiguous_format, torch.channels_last))
        print(f"| {name} ({shape[0]}) | {nchw:.1f} | {last:.1f} | {nchw / last:.2f}x |",
              flush=True)


if __name__ == "__main__":
    main()
