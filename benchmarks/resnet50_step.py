"""One training step of ResNet-50 on one device: torchvision's model against caffe-py's Net.

    python benchmarks/resnet50_step.py --out "$OUT"                     # GPU, batch 256
    python benchmarks/resnet50_step.py --device cpu --batch 2 --width 1/16 --steps 2 --warmup 1

Every variant runs the same loop: bfloat16 autocast, channels_last, torch.optim.SGD
(momentum 0.9, weight decay 1e-4), a constant input (no per-step host work), ``--warmup``
untimed steps, then ``--steps`` timed ones between two torch.cuda.synchronize calls.

Variants:
- torchvision   torchvision.models.resnet50 with F.cross_entropy (the usual PyTorch way)
- caffe-py      Net(configs/resnet50_dummy.yaml), every fusion on (the default)
- ... with one change undone at a time, so the table shows what each change buys:
  ``fuse_batchnorm_relu`` off (the ReLU back in its own op), ``batchnorm_kernels`` off
  (PyTorch's batch_norm, the ReLU in its own op), ``fuse_batchnorm_scale`` off,
  ``fuse_bias_activation`` off, and those fusions off with the Scale/Bias bf16 cast undone
  (float32 blobs promote activations to float32, as before)
- caffe-py, max_pool_kernel off  pool1 on PyTorch's channels_last kernels instead of
  csrc/max_pool.cu
- caffe-py + inplace_activations  the opt-in in-place ReLU (batch_norm's backward keeps its
  input, not the output the ReLU overwrites)

``--variants`` runs only the caffe-py variants whose names hold one of its comma-separated words
(e.g. ``--variants default,max_pool``). ``--width`` divides every Convolution's num_output (a
quick CPU check of the script);
torchvision runs only at width 1. A torch.profiler table of the default caffe-py step (top 15
CUDA kernels by self time) and the markdown table are written to ``--out``.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import platform
import sys
import time
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml

import caffe_py.layers.normalization as normalization
from caffe_py.net import Net
from caffe_py.spec.net_spec import parse_net
from caffe_py.spec.schema import Source
from caffe_py.spec.yamlio import loads

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "resnet50_dummy.yaml"


# --- the nets --------------------------------------------------------------------------------
def benchmark_spec(batch: int, width: Fraction) -> dict:
    """configs/resnet50_dummy.yaml at ``batch``, constant DummyData, convolutions * width."""
    spec = yaml.safe_load(CONFIG.read_text())
    for layer in spec["layer"]:
        if layer["type"] == "DummyData":
            p = layer["dummy_data_param"]
            for shape in p["shape"]:
                shape["dim"][0] = batch
            p["data_filler"] = [{"type": "constant", "value": 0.5}, {"type": "constant"}]
        elif layer["type"] == "Convolution" and width != 1:
            p = layer["convolution_param"]
            p["num_output"] = max(1, int(p["num_output"] * width))
    return spec


def build_net(spec: dict, device: torch.device, options: dict) -> Net:
    text = yaml.safe_dump(spec, sort_keys=False)
    net = Net(parse_net(loads(text, str(CONFIG)), Source(str(CONFIG))), "TRAIN",
              device=device, options=options)
    return net.to(device=device, memory_format=torch.channels_last)


@contextlib.contextmanager
def scale_promotes_to_float32() -> Iterator[None]:
    """Undo the Scale/Bias cast for one variant: float32 blobs promote bf16 activations."""
    saved = normalization.as_dtype
    normalization.as_dtype = lambda operand, x: operand
    try:
        yield
    finally:
        normalization.as_dtype = saved


# --- the loop ----------------------------------------------------------------------------------
def sgd(params: list[torch.nn.Parameter]) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=1e-4)


def caffe_step(net: Net) -> Callable[[], torch.Tensor]:
    return lambda: net().loss


def torchvision_step(batch: int, device: torch.device) -> tuple[Callable, list]:
    import torchvision  # only where the baseline runs (it is on the GPU machine)

    model = torchvision.models.resnet50().to(device=device, memory_format=torch.channels_last)
    x = torch.full((batch, 3, 224, 224), 0.5, device=device).contiguous(
        memory_format=torch.channels_last)
    y = torch.zeros(batch, dtype=torch.long, device=device)
    return (lambda: F.cross_entropy(model(x), y)), list(model.parameters())


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_steps(loss_fn: Callable[[], torch.Tensor], opt: torch.optim.Optimizer,
              device: torch.device, n: int) -> float:
    """Seconds for ``n`` steps (forward, backward, SGD), synchronised at both ends."""
    sync(device)
    start = time.perf_counter()
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_fn()
        loss.backward()
        opt.step()
    sync(device)
    return time.perf_counter() - start


def measure(name: str, make: Callable[[], tuple[Callable, list]], args: argparse.Namespace,
            device: torch.device) -> dict:
    built = time.perf_counter()
    loss_fn, params = make()
    built = time.perf_counter() - built
    opt = sgd(params)
    run_steps(loss_fn, opt, device, args.warmup)
    seconds = run_steps(loss_fn, opt, device, args.steps)
    ms = 1000.0 * seconds / args.steps
    row = {"variant": name, "ms": ms, "img_s": args.batch * args.steps / seconds,
           "build_s": built}
    print(f"{name}: {ms:.1f} ms/step, {row['img_s']:.0f} img/s (built in {built:.1f} s)",
          flush=True)
    return row


def profile_table(net: Net, device: torch.device, out: Path) -> None:
    """torch.profiler over 5 steps of ``net``; the 15 costliest kernels by device self time."""
    from torch.profiler import ProfilerActivity, profile

    opt = sgd([p.param for p in net.learnable_params()])
    run_steps(caffe_step(net), opt, device, 2)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        run_steps(caffe_step(net), opt, device, 5)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=sort, row_limit=15, max_name_column_width=70)
    path = out / "resnet50_profile.txt"
    path.write_text(f"torch.profiler, 5 steps of caffe-py's ResNet-50 (all fusions), sorted by "
                    f"{sort}\n{table}\n")
    print(f"profile: {path}")


# --- the table -----------------------------------------------------------------------------------
def markdown(rows: list[dict], args: argparse.Namespace, device: torch.device) -> str:
    machine = (torch.cuda.get_device_name(device) if device.type == "cuda"
               else f"CPU ({platform.processor() or platform.machine()})")
    base = next((r["ms"] for r in rows if r["variant"] == "torchvision"), None)
    lines = [f"Machine: {machine}; torch {torch.__version__}; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"Command: `python {' '.join(sys.argv)}`",
             f"Batch {args.batch}, width {args.width}, bf16 autocast, channels_last, SGD "
             f"momentum 0.9; {args.warmup} warm-up + {args.steps} timed steps.", "",
             "| variant | ms/step | img/s | vs torchvision |", "|---|---:|---:|---:|"]
    for r in rows:
        ratio = f"{r['ms'] / base:.2f}x" if base else "-"
        lines.append(f"| {r['variant']} | {r['ms']:.1f} | {r['img_s']:.0f} | {ratio} |")
    return "\n".join(lines) + "\n"


def variants(spec: dict, device: torch.device) -> list[tuple[str, dict, bool]]:
    """(name, net options, undo the Scale/Bias cast) for every caffe-py variant."""
    return [("caffe-py (all fusions, default)", {}, False),
            ("caffe-py, fuse_batchnorm_relu off", {"fuse_batchnorm_relu": False}, False),
            ("caffe-py, batchnorm_kernels off", {"batchnorm_kernels": False}, False),
            ("caffe-py, fuse_batchnorm_scale off", {"fuse_batchnorm_scale": False}, False),
            ("caffe-py, fuse_bias_activation off", {"fuse_bias_activation": False}, False),
            ("caffe-py, every fusion off + float32 Scale (before)",
             {"fuse_batchnorm_scale": False, "fuse_bias_activation": False,
              "fuse_batchnorm_relu": False}, True),
            ("caffe-py + inplace_activations", {"inplace_activations": True}, False),
            ("caffe-py, max_pool_kernel off", {"max_pool_kernel": False}, False)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=Fraction, default=Fraction(1),
                    help="multiply every Convolution's num_output (e.g. 1/16 for a CPU check)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("/tmp/cpy_resnet50"))
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--variants", default="",
                    help="comma-separated words: only the caffe-py variants whose names hold "
                         "one (default: all)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("resnet50_step: no CUDA device here; use --device cpu --batch 2 --width 1/16")
    args.out.mkdir(parents=True, exist_ok=True)
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    spec = benchmark_spec(args.batch, args.width)
    rows = []
    if args.width == 1:
        try:
            rows.append(measure("torchvision", lambda: torchvision_step(args.batch, device),
                                args, device))
        except ImportError:
            print("torchvision is not installed here: its row is left out", flush=True)
    default_net = None
    words = [w for w in args.variants.split(",") if w]
    for name, options, promote in variants(spec, device):
        if words and not any(w in name for w in words):
            continue
        with scale_promotes_to_float32() if promote else contextlib.nullcontext():
            net = build_net(spec, device, options)
            make = lambda net=net: (caffe_step(net), [p.param for p in net.learnable_params()])
            rows.append(measure(name, make, args, device))
        if not options:
            default_net = net
            print(f"fused: {len(net.fused_norm)} BatchNorm+Scale pairs, "
                  f"{len(net.fused)} bias+activation pairs", flush=True)
        else:
            del net
    if not args.no_profile and default_net is not None:
        profile_table(default_net, device, args.out)
    table = markdown(rows, args, device)
    (args.out / "resnet50_step.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
