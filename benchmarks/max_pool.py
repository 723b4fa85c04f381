"""Max pooling of channels_last tensors: caffe-py's kernels (csrc/max_pool.cu) against PyTorch's
channels_last kernels and its NCHW kernels reached through layout copies, on ResNet-50's pool1
(bf16, batch 256, 64 x 112 x 112, kernel 3, stride 2, Caffe's ceil rounding), every way's output
and input gradient checked bit for bit against PyTorch's channels_last kernels first.

    python benchmarks/max_pool.py                 # a CUDA device
    python benchmarks/max_pool.py --smoke         # a small shape on the CPU: the checks only

Ways (each the forward with indices, then the backward of a fixed output gradient):

* *channels_last*: ``F.max_pool2d`` on the channels_last input and autograd's backward, PyTorch's
  NHWC kernels (what caffe-py's Pooling layer runs on a channels_last net);
* *NCHW backward*: the same forward; the backward through PyTorch's NCHW kernel on contiguous
  copies of the output gradient and the indices, the input gradient copied back to channels_last;
* *NCHW both*: the input copied to NCHW, forward and backward there, the output and the input
  gradient copied back to channels_last;
* *caffe-py's kernels*: csrc/max_pool.cu (``functions.max_pool``'s two calls), where the
  extension builds;
* *NCHW input* (a reference, not a way for a channels_last net): a contiguous input throughout.

Prints one table (milliseconds a call, the median of ``--reps`` timed calls after warm-up)."""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ATEN = torch.ops.aten
CL = torch.channels_last


def pool_with_indices(x: torch.Tensor, k: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    return ATEN.max_pool2d_with_indices(x, [k, k], [s, s], [0, 0], [1, 1], True)


def backward(g: torch.Tensor, x: torch.Tensor, idx: torch.Tensor, k: int, s: int) -> torch.Tensor:
    return ATEN.max_pool2d_with_indices_backward(g, x, [k, k], [s, s], [0, 0], [1, 1], True, idx)


def way_channels_last(x, g, k, s):
    y, idx = pool_with_indices(x, k, s)
    return y, backward(g, x, idx, k, s)


def way_nchw_backward(x, g, k, s):
    y, idx = pool_with_indices(x, k, s)
    shape = torch.empty(x.shape, dtype=x.dtype, device=x.device)   # sizes and layout only
    gi = backward(g.contiguous(), shape, idx.contiguous(), k, s)
    return y, gi.contiguous(memory_format=CL)


def way_nchw_both(x, g, k, s):
    xc = x.contiguous()
    y, idx = pool_with_indices(xc, k, s)
    gi = backward(g.contiguous(), xc, idx, k, s)
    return y.contiguous(memory_format=CL), gi.contiguous(memory_format=CL)


def way_nchw_input(x, g, k, s):
    y, idx = pool_with_indices(x, k, s)
    return y, backward(g, x, idx, k, s)


def way_kernels(x, g, k, s):
    from caffe_py.kernels import build

    ext = build.load()
    out = g.shape[2:]
    y, offsets = ext.max_pool_forward(x, k, k, s, s, 0, 0, *out)
    return y, ext.max_pool_backward(g, offsets, *x.shape[2:], k, k, s, s, 0, 0)


WAYS: dict[str, Callable] = {"channels_last": way_channels_last,
                             "NCHW backward": way_nchw_backward,
                             "NCHW both": way_nchw_both}


def kernels_build() -> str | None:
    """Why caffe-py's kernels are left out, or None where they build."""
    from caffe_py.kernels import build

    try:
        build.load()
    except build.BuildError as exc:
        return str(exc)
    return None


def timed(fn: Callable[[], object], reps: int, cuda: bool) -> float:
    """Milliseconds a call, the median of ``reps`` (on CUDA, by events: sgd_update.time_ms)."""
    if cuda:
        from sgd_update import time_ms

        return time_ms(fn, reps)
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="a small shape on the CPU")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if cuda else "cpu")
    n, c, hw = (256, 64, 112) if cuda else (4, 8, 15)
    dtype = torch.bfloat16 if cuda else torch.float32
    k, s = 3, 2
    gen = torch.Generator(device=device).manual_seed(0)
    # values on a coarse grid, so that windows hold ties: the first maximum must win everywhere
    x = (torch.randint(0, 16, (n, c, hw, hw), generator=gen, device=device).to(dtype)
         .contiguous(memory_format=CL))
    out = -(-(hw - k) // s) + 1
    g = torch.randn((n, c, out, out), generator=gen, device=device).to(dtype) \
        .contiguous(memory_format=CL)
    want_y, want_gi = way_channels_last(x, g, k, s)
    autograd_x = x.detach().clone().requires_grad_()
    F.max_pool2d(autograd_x, k, s, 0, ceil_mode=True).backward(g)
    failed = not torch.equal(autograd_x.grad, want_gi)
    rows = []
    ways = dict(WAYS)
    why = kernels_build() if cuda else "no CUDA device"
    if why is None:
        ways["caffe-py's kernels"] = way_kernels
    else:
        print(f"caffe-py's kernels left out: {why}")
    for name, way in ways.items():
        y, gi = way(x, g, k, s)
        same = torch.equal(y, want_y) and torch.equal(gi, want_gi)
        layout = gi.is_contiguous(memory_format=CL) and y.is_contiguous(memory_format=CL)
        failed |= not (same and layout)
        rows.append((name, timed(lambda way=way: way(x, g, k, s), args.reps, cuda),
                     "yes" if same else "NO", "yes" if layout else "NO"))
    xc, gc = x.contiguous(), g.contiguous()
    rows.append(("NCHW input (reference)", timed(lambda: way_nchw_input(xc, gc, k, s),
                                                 args.reps, cuda), "-", "-"))
    name = torch.cuda.get_device_name(0) if cuda else "CPU"
    print(f"{name}, torch {torch.__version__}: max pooling {n} x {c} x {hw} x {hw} {dtype}, "
          f"kernel {k}, stride {s}, ceil; forward with indices + backward, ms a call "
          f"(median of {args.reps} after warm-up)\n")
    print("| way | ms | same bits as channels_last | outputs channels_last |")
    print("|---|---:|---|---|")
    for row_name, ms, same, layout in rows:
        print(f"| {row_name} | {ms:.3f} | {same} | {layout} |")
    print("\nautograd's gradient equals the channels_last way's:",
          torch.equal(autograd_x.grad, want_gi))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
