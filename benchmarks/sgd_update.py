"""Caffe's SGD update of ResNet-50's parameters on one GPU: the one-kernel update
(csrc/sgd_update.cu) against the op-by-op pipeline (its test oracle), on the parameters as
separate tensors (one GPU's run) and as views into one flat buffer (a replica's, laid out as
caffe_py/parallel/flat.py lays them), with the rates on the device as a CUDA graph replays them.

    python benchmarks/sgd_update.py [--repeats 200]

Each row: the median of ``repeats`` timed updates (CUDA events around each, after 20 untimed),
the bytes the update moves (w, g and h each read and written: 24 bytes an element) over that
time, and that rate over the device-to-device copy's measured in the same run (a copy reads and
writes each byte once). ResNet-50: configs/resnet50_dummy.yaml's learnable blobs in channels_last
(as the solver's AUTO memory format leaves them on a GPU), SGD with momentum and weight decay,
each blob's lr_mult and decay_mult as the config sets them.
"""
from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from caffe_py.net import Net  # noqa: E402
from caffe_py.parallel.flat import FlatParams  # noqa: E402
from caffe_py.solver.rules import Updater  # noqa: E402
from caffe_py.spec.net_spec import parse_net  # noqa: E402
from caffe_py.spec.schema import Source  # noqa: E402
from caffe_py.spec.solver_spec import parse_solver  # noqa: E402
from caffe_py.spec.yamlio import loads  # noqa: E402

CONFIG = ROOT / "configs/resnet50_dummy.yaml"
BYTES_PER_ELEMENT = 6 * 4
"""w, g and h each read and written once (float32)."""


def resnet50_params(device: torch.device) -> tuple[list[torch.nn.Parameter], list]:
    net = Net(parse_net(loads(CONFIG.read_text(), str(CONFIG)), Source(str(CONFIG))), "TRAIN",
              device=device)
    net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    learnable = net.learnable_params()
    return [lp.param for lp in learnable], [(lp.lr_mult, lp.decay_mult) for lp in learnable]


def time_ms(fn: Callable[[], None], repeats: int) -> float:
    for _ in range(20):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    device = torch.device("cuda")
    solver = parse_solver({"net_param": {"name": "n"}, "base_lr": 0.1, "max_iter": 100,
                           "momentum": 0.9, "weight_decay": 1e-4, "lr_policy": "fixed"},
                          Source())
    params, mults = resnet50_params(device)
    elements = sum(w.numel() for w in params)
    big = torch.empty(elements * 8, device=device)
    copy_ms = time_ms(lambda: big[: elements * 4].copy_(big[elements * 4:]), args.repeats)
    copy_gbs = 2 * elements * 4 * 4 / copy_ms / 1e6
    rows = []
    for layout in ("separate", "flat"):
        if layout == "flat":
            flat = FlatParams(params)
            flat.rebind_grads()
        for w in params:
            if w.grad is None or layout == "separate":
                w.grad = torch.randn_like(w) * 1e-3
        for fused in (None, False):
            up = Updater(solver, params, mults, fused=fused)
            rates = torch.tensor(up.scales(0.1, 0), device=device)
            ms = time_ms(lambda up=up, rates=rates: up.apply_scales(rates), args.repeats)
            kind = "one kernel" if up.fused else "op by op (foreach)"
            gbs = elements * BYTES_PER_ELEMENT / ms / 1e6
            rows.append(f"| {layout} | {kind} | {ms * 1e3:.0f} | {gbs:.0f} | "
                        f"{gbs / copy_gbs:.0%} |")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{torch.cuda.get_device_name()} ({platform.node()}), torch {torch.__version__}, "
          f"{when}, `python benchmarks/sgd_update.py --repeats {args.repeats}`: ResNet-50, "
          f"{len(params)} tensors, {elements / 1e6:.1f} M elements; a device copy moved "
          f"{copy_gbs:.0f} GB/s (read + written)\n")
    print("| parameters | update | us | GB/s (24 B an element) | of the copy's rate |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
