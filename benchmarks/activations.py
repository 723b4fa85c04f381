"""Speed of the CUDA activation kernels against PyTorch's ops, and of whole training steps.

Run on a CUDA machine (benchmarks/gpu_kernels.sh does, after building and testing):

    python benchmarks/activations.py [--sizes-mb 64 256] [--dtypes float32 bfloat16]

For each tensor size and dtype it measures the device-to-device copy bandwidth (x.copy_ and
clone), then each kernel's forward and backward against PyTorch's op (F.relu, F.leaky_relu,
F.prelu, F.elu, torch.sigmoid, torch.tanh and their backward ops), and the fused bias + ReLU
against PyTorch's two ops (x + b[None, :, None, None], then relu). Bandwidth counts the bytes
each op must read and write (parameters aside); a timing is the median over repeats of a
back-to-back loop between two CUDA events. It then checks DEFAULT_BACKEND against the
measured winner per layer kind, times calls at small sizes (where host time rules), and times
LeNet and ResNet-50 training steps (forward + backward) with the activations on PyTorch
(TORCH), as DEFAULT picks, on the kernels (CUDA: fused as the Net builds; unfused; in place).

The markdown table goes to stdout, and to $OUT/kernels.md when OUT is set (or --out).

    python benchmarks/activations.py --variants

instead builds the forward launch sweep (benchmarks/fwd_variants.py) and times the forward
(float32 and bfloat16, 64 and 256 MB) of ReLU for each of the 54 kFwd variants, and of ELU,
Sigmoid and TanH for each of the 12 kFwdMath variants, with the shipped kernel, PyTorch's op
and x.copy_, interleaved over rounds (medians; inputs rotate among 3 buffers so L2 cannot
help); it checks each variant's output against PyTorch first, and prints the kFwd and kFwdMath
lines of caffe_py/kernels/csrc/common.cuh that win (report: $OUT/fwd_variants.md).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fwd_variants  # noqa: E402  (benchmarks/fwd_variants.py, beside this script)

from caffe_py.kernels import build  # noqa: E402
from caffe_py.kernels import reference as ref  # noqa: E402

aten = torch.ops.aten


def timed(fn: Callable[[], object], iters: int = 20, repeats: int = 7) -> float:
    """Median seconds per call of ``fn``, run ``iters`` times back to back per repeat."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / iters)
    return statistics.median(samples)


@dataclass
class Row:
    op: str
    dtype: str
    mb: int
    fwd_ours: float  # GB/s
    fwd_torch: float
    bwd_ours: float
    bwd_torch: float
    copy: float

    def cells(self) -> list[str]:
        def pct(v: float) -> str:
            return f"{100 * v / self.copy:.0f}%"

        return [self.op, self.dtype, str(self.mb),
                f"{self.fwd_ours:.0f}", f"{self.fwd_torch:.0f}", pct(self.fwd_ours),
                f"{self.fwd_ours / self.fwd_torch:.2f}x",
                f"{self.bwd_ours:.0f}", f"{self.bwd_torch:.0f}", pct(self.bwd_ours),
                f"{self.bwd_ours / self.bwd_torch:.2f}x"]


HEADER = ["op", "dtype", "MB", "fwd GB/s", "torch fwd", "fwd/copy", "fwd vs torch",
          "bwd GB/s", "torch bwd", "bwd/copy", "bwd vs torch"]


def kernel_rows(ext, mb: int, dtype: torch.dtype) -> tuple[list[Row], dict[str, float]]:
    """Every kernel at one size and dtype; tensors (N, 64, 64, 64) of ``mb`` megabytes."""
    esize = torch.empty((), dtype=dtype).element_size()
    n_elems = mb * 2 ** 20 // esize
    shape = (n_elems // (64 * 64 * 64), 64, 64, 64)
    nbytes = n_elems * esize
    x = torch.randn(shape, device="cuda").to(dtype)
    g = torch.randn(shape, device="cuda").to(dtype)
    y = torch.empty_like(x)
    gi = torch.empty_like(x)
    C, inner = 64, 64 * 64
    slope = torch.full((C,), 0.25, device="cuda", dtype=dtype)
    bias = torch.randn(C, device="cuda", dtype=dtype)

    copy_s = timed(lambda: y.copy_(x))
    clone_s = timed(lambda: x.clone())
    copy_bw = 2 * nbytes / copy_s / 1e9
    copies = {"copy_": copy_bw, "clone": 2 * nbytes / clone_s / 1e9}

    def gbps(seconds: float, passes: int) -> float:
        return passes * nbytes / seconds / 1e9

    rows = []

    def add(name, ours_f, torch_f, ours_b, torch_b, bwd_passes=3):
        rows.append(Row(name, str(dtype).replace("torch.", ""), mb,
                        gbps(timed(ours_f), 2), gbps(timed(torch_f), 2),
                        gbps(timed(ours_b), bwd_passes), gbps(timed(torch_b), bwd_passes),
                        copy_bw))

    ext.act_forward(x, y, ref.RELU, 0.0)
    add("ReLU", lambda: ext.act_forward(x, y, ref.RELU, 0.0), lambda: F.relu(x),
        lambda: ext.act_backward(g, y, gi, ref.RELU, 0.0, True),
        lambda: aten.threshold_backward(g, y, 0))
    add("ReLU slope 0.1", lambda: ext.act_forward(x, y, ref.RELU, 0.1),
        lambda: F.leaky_relu(x, 0.1),
        lambda: ext.act_backward(g, x, gi, ref.RELU, 0.1, True),
        lambda: aten.leaky_relu_backward(g, x, 0.1, False))
    ext.act_forward(x, y, ref.ELU, 1.0)
    add("ELU", lambda: ext.act_forward(x, y, ref.ELU, 1.0), lambda: F.elu(x),
        lambda: ext.act_backward(g, y, gi, ref.ELU, 1.0, True),
        lambda: aten.elu_backward(g, 1.0, 1, 1, True, y))
    ext.act_forward(x, y, ref.SIGMOID, 0.0)
    add("Sigmoid", lambda: ext.act_forward(x, y, ref.SIGMOID, 0.0), lambda: torch.sigmoid(x),
        lambda: ext.act_backward(g, y, gi, ref.SIGMOID, 0.0, True),
        lambda: aten.sigmoid_backward(g, y))
    ext.act_forward(x, y, ref.TANH, 0.0)
    add("TanH", lambda: ext.act_forward(x, y, ref.TANH, 0.0), lambda: torch.tanh(x),
        lambda: ext.act_backward(g, y, gi, ref.TANH, 0.0, True),
        lambda: aten.tanh_backward(g, y))

    xg = x.detach().requires_grad_()
    wg = slope.detach().requires_grad_()
    torch_prelu = F.prelu(xg, wg)
    add("PReLU (per channel)", lambda: ext.prelu_forward(x, slope, y, C, inner),
        lambda: F.prelu(x, slope),
        lambda: ext.prelu_backward(g, x, slope, gi, C, inner),
        lambda: torch.autograd.grad(torch_prelu, (xg, wg), g, retain_graph=True))

    b4 = bias[None, :, None, None]
    ext.bias_act_forward(x, bias, y, C, inner, ref.RELU, 0.0)
    add("bias + ReLU (fused vs 2 ops)",
        lambda: ext.bias_act_forward(x, bias, y, C, inner, ref.RELU, 0.0),
        lambda: F.relu(x + b4),
        lambda: ext.bias_act_backward(g, y, bias, gi, C, inner, ref.RELU, 0.0),
        lambda: (aten.threshold_backward(g, y, 0).sum((0, 2, 3))))
    xl = x.contiguous(memory_format=torch.channels_last)
    yl, gl, gil = torch.empty_like(xl), g.contiguous(memory_format=torch.channels_last), \
        torch.empty_like(xl)
    ext.bias_act_forward(xl, bias, yl, C, 1, ref.RELU, 0.0)
    add("bias + ReLU, channels_last",
        lambda: ext.bias_act_forward(xl, bias, yl, C, 1, ref.RELU, 0.0),
        lambda: F.relu(xl + b4),
        lambda: ext.bias_act_backward(gl, yl, bias, gil, C, 1, ref.RELU, 0.0),
        lambda: (aten.threshold_backward(gl, yl, 0).sum((0, 2, 3))))
    return rows, copies


SMALL_SHAPES = [(64, 500), (64, 4096), (64, 64, 32, 32)]


def small_row(ext, shape: tuple[int, ...]) -> list[str]:
    """Microseconds per call at one small size, where host time rules: the raw op, and
    forward + backward through autograd for ReLU and the fused bias + ReLU against PyTorch."""
    from caffe_py.kernels import functions

    x = torch.randn(shape, device="cuda", requires_grad=True)
    g = torch.randn(shape, device="cuda")
    b = torch.randn(shape[1], device="cuda", requires_grad=True)
    bview = b.view(-1, *([1] * (len(shape) - 2)))
    y = torch.empty_like(x)
    xd = x.detach()

    def us(fn: Callable[[], object]) -> str:
        return f"{timed(fn, iters=50, repeats=5) * 1e6:.1f}"

    return ["x".join(map(str, shape)),
            us(lambda: ext.act_forward(xd, y, ref.RELU, 0.0)),
            us(lambda: torch.relu(xd)),
            us(lambda: functions.activation(x, ref.RELU).backward(g)),
            us(lambda: F.relu(x).backward(g)),
            us(lambda: functions.bias_activation(x, b, ref.RELU).backward(g)),
            us(lambda: F.relu(x + bview).backward(g))]


SMALL_HEADER = ["shape (float32)", "raw act_forward us", "torch.relu us", "ReLU f+b us",
                "torch ReLU f+b us", "bias+ReLU f+b us", "torch bias+ReLU f+b us"]

# benchmark row name -> the layer kind of DEFAULT_BACKEND (caffe_py/layers/activation.py)
ROW_KINDS = {"ReLU": "ReLU", "ReLU slope 0.1": "ReLU", "ELU": "ELU", "Sigmoid": "Sigmoid",
             "TanH": "TanH", "PReLU (per channel)": "PReLU",
             "bias + ReLU (fused vs 2 ops)": "bias + activation",
             "bias + ReLU, channels_last": "bias + activation"}


def default_check(rows: list[Row]) -> list[str]:
    """Per layer kind: the backend this run measured faster (the kernels only if they beat
    PyTorch forward and backward in every row of that kind) against DEFAULT_BACKEND."""
    from caffe_py.layers.activation import DEFAULT_BACKEND

    worst: dict[str, float] = {}
    for r in rows:
        kind = ROW_KINDS[r.op]
        ratio = min(r.fwd_ours / r.fwd_torch, r.bwd_ours / r.bwd_torch)
        worst[kind] = min(worst.get(kind, ratio), ratio)
    lines = []
    for kind, ratio in worst.items():
        measured = "cuda" if ratio >= 1.0 else "torch"
        table_says = DEFAULT_BACKEND[kind]
        verdict = "agrees" if measured == table_says else "DISAGREES: change DEFAULT_BACKEND"
        lines.append(f"- {kind}: slowest kernel/torch ratio {ratio:.2f}x -> {measured}; "
                     f"table {table_says} ({verdict})")
    return lines


LENET = """
name: LeNet
layer:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [64, 1, 28, 28]}}}
  - {name: label, type: Input, top: label, input_param: {shape: {dim: [64]}}}
  - {name: conv1, type: Convolution, bottom: data, top: conv1,
     convolution_param: {num_output: 20, kernel_size: 5, stride: 1,
                         weight_filler: {type: xavier}, bias_filler: {type: constant}}}
  - {name: pool1, type: Pooling, bottom: conv1, top: pool1,
     pooling_param: {pool: MAX, kernel_size: 2, stride: 2}}
  - {name: conv2, type: Convolution, bottom: pool1, top: conv2,
     convolution_param: {num_output: 50, kernel_size: 5, stride: 1,
                         weight_filler: {type: xavier}, bias_filler: {type: constant}}}
  - {name: pool2, type: Pooling, bottom: conv2, top: pool2,
     pooling_param: {pool: MAX, kernel_size: 2, stride: 2}}
  - {name: ip1, type: InnerProduct, bottom: pool2, top: ip1,
     inner_product_param: {num_output: 500, weight_filler: {type: xavier},
                           bias_filler: {type: constant}}}
  - {name: relu1, type: ReLU, bottom: ip1, top: ip1}
  - {name: ip2, type: InnerProduct, bottom: ip1, top: ip2,
     inner_product_param: {num_output: 10, weight_filler: {type: xavier},
                           bias_filler: {type: constant}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip2, label], top: loss}
"""


def net_rows(resnet_batch: int) -> list[list[str]]:
    """Training-step times (forward + backward) per net and activation setting."""
    try:
        from caffe_py.net import Net
        from caffe_py.spec.net_spec import parse_net
        from caffe_py.spec.schema import Source
        from caffe_py.spec.yamlio import loads
    except ImportError as exc:  # the Net is not there yet: the kernel table still stands
        print(f"(skipping whole-net steps: {exc})", file=sys.stderr)
        return []
    nets = [("LeNet (batch 64)", LENET, lambda: {
        "data": torch.rand(64, 1, 28, 28, device="cuda"),
        "label": torch.randint(0, 10, (64,), device="cuda").float()})]
    resnet = ROOT / "configs" / "resnet50_dummy.yaml"
    if resnet.exists():
        text = resnet.read_text().replace("dim: [256, 3, 224, 224]}, {dim: [256]}",
                                          f"dim: [{resnet_batch}, 3, 224, 224]}}, "
                                          f"{{dim: [{resnet_batch}]}}")
        nets.append((f"ResNet-50 (batch {resnet_batch})", text, lambda: None))
    else:
        print(f"(skipping ResNet-50: {resnet} is missing)", file=sys.stderr)
    # The Net runs the fusion pass when it is built: net.fused lists what each setting fused.
    settings = [("TORCH", {"activation_engine": "TORCH"}),
                ("DEFAULT", {}),
                ("CUDA (fused at build)", {"activation_engine": "CUDA"}),
                ("CUDA, no fusion", {"activation_engine": "CUDA", "fuse_bias_activation": False}),
                ("CUDA + in place", {"activation_engine": "CUDA", "inplace_activations": True})]
    rows = []
    for title, text, make_inputs in nets:
        spec = parse_net(loads(text, "bench.yaml"), Source("bench.yaml"))
        base = None
        for label, options in settings:
            net = Net(spec, device="cuda", options=options)
            inputs = make_inputs()
            torch.cuda.reset_peak_memory_stats()

            def step(net=net, inputs=inputs):
                for p in net.parameters():
                    p.grad = None
                net(inputs).loss.backward()

            seconds = timed(step, iters=5, repeats=7)
            peak = torch.cuda.max_memory_allocated() / 2 ** 30
            base = base or seconds
            kernels = sum(getattr(m, "backend", None) == "cuda" for m in net.layers)
            rows.append([title, label, f"{seconds * 1e3:.2f}", f"{base / seconds:.3f}x",
                         f"{peak:.2f}", str(kernels), str(len(net.fused))])
            del net, inputs
            torch.cuda.empty_cache()
    return rows


@dataclass(frozen=True)
class SweepOp:
    """One forward op of the sweep: its kind and parameter for the kernels, PyTorch's op, and
    the launch of common.cuh its variants compete for."""

    name: str
    kind: int
    p: float
    torch_name: str
    torch_fn: Callable[[torch.Tensor], torch.Tensor]
    launch: str  # "kFwd" (ReLU grid, outputs exactly torch's) or "kFwdMath" (math grid)

    def variant(self, module, i: int, x: torch.Tensor, y: torch.Tensor) -> None:
        if self.launch == "kFwd":
            module.relu(x, y, i)
        else:
            module.math(x, y, self.kind, self.p, i)

    def ok(self, got: torch.Tensor, x: torch.Tensor) -> bool:
        """ReLU: exactly torch.relu. Math ops: within the GPU tests' tolerance of one rounding
        to the dtype (tests/kernels/test_cuda_kernels.py TOL) of the op in double."""
        if self.launch == "kFwd":
            return bool(torch.equal(got, self.torch_fn(x)))
        rtol, atol = SWEEP_TOL[x.dtype]
        return bool(torch.allclose(got.double(), self.torch_fn(x.double()), rtol=rtol,
                                   atol=atol, equal_nan=True))


SWEEP_TOL = {torch.float32: (1e-6, 1e-6), torch.bfloat16: (8e-3, 1e-3)}
SWEEP_OPS = [SweepOp("ReLU", ref.RELU, 0.0, "torch.relu", torch.relu, "kFwd"),
             SweepOp("ELU", ref.ELU, 1.0, "F.elu", F.elu, "kFwdMath"),
             SweepOp("Sigmoid", ref.SIGMOID, 0.0, "torch.sigmoid", torch.sigmoid, "kFwdMath"),
             SweepOp("TanH", ref.TANH, 0.0, "torch.tanh", torch.tanh, "kFwdMath")]


def sweep_case(op: SweepOp, module, variants, ext, dtype: torch.dtype, mb: int, rounds: int,
               iters: int) -> tuple[dict[str, float], dict[str, bool], float]:
    """One op's forward at one dtype and size: (seconds per call by name, output ok by name,
    bytes).

    Names are the variants' names plus "shipped", the torch op's name and "x.copy_". Each
    round times every candidate once, in an order rotated by one per round, ``iters`` calls
    between two events; the result is the median over rounds.
    """
    esize = torch.empty((), dtype=dtype).element_size()
    n = mb * 2 ** 20 // esize
    gen = torch.Generator(device="cuda").manual_seed(mb)
    xs = [torch.randn(n, device="cuda", generator=gen).to(dtype) for _ in range(3)]
    y = torch.empty_like(xs[0])
    cands: dict[str, Callable[[torch.Tensor], object]] = {
        op.torch_name: op.torch_fn, "x.copy_": y.copy_,
        "shipped": lambda x: ext.act_forward(x, y, op.kind, op.p)}
    for i, v in enumerate(variants):
        cands[v.name] = lambda x, i=i: op.variant(module, i, x, y)
    ok = {}
    for name, fn in cands.items():  # each writes y (or returns) op(xs[0])
        if name == "x.copy_":
            continue
        y.fill_(float("nan"))
        out = fn(xs[0])
        ok[name] = op.ok(out if name == op.torch_name else y, xs[0])
    names = list(cands)
    samples: dict[str, list[float]] = {name: [] for name in names}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = cands[name]
            fn(xs[1])
            fn(xs[2])
            start.record()
            for k in range(iters):
                fn(xs[k % 3])
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / 1e3 / iters)
    return {k: statistics.median(v) for k, v in samples.items()}, ok, 2 * n * esize


def run_variants(rounds: int, iters: int, sizes_mb: list[int]) -> list[str]:
    """The forward sweep's report lines (markdown), ending with the kFwd and kFwdMath to ship."""
    ext = build.load()
    t0 = time.perf_counter()
    try:
        module, relu_variants, math_variants = fwd_variants.load()
    except Exception as exc:  # compiler errors: one line, then the build log has the rest
        sys.exit(f"Error: building the sweep module failed: {build._first_error(exc)}")
    grids = {"kFwd": relu_variants, "kFwdMath": math_variants}
    lines = [f"# Forward launch sweep: {torch.cuda.get_device_name()}", "",
             f"- torch {torch.__version__}, CUDA {torch.version.cuda}; sweep module built or "
             f"loaded in {time.perf_counter() - t0:.1f} s; ReLU over {len(relu_variants)} "
             f"variants (kFwd), ELU, Sigmoid and TanH over {len(math_variants)} (kFwdMath); "
             f"{rounds} interleaved rounds of {iters} calls, median", "",
             "GB/s counts bytes read + written; `vs torch` is the torch op's time / this one's "
             "(> 1.00x: faster); `ok`: ReLU matches torch.relu exactly, the math ops are within "
             "the GPU tests' tolerance of the op in double.", ""]
    ratios: dict[str, dict] = {name: {} for name in grids}
    shipped_ratios: dict[str, list[float]] = {name: [] for name in grids}
    summary: dict[str, list[str]] = {name: [] for name in grids}
    for op in SWEEP_OPS:
        variants = grids[op.launch]
        for dtype in (torch.float32, torch.bfloat16):
            esize = torch.empty((), dtype=dtype).element_size()
            for mb in sizes_mb:
                secs, ok, nbytes = sweep_case(op, module, variants, ext, dtype, mb, rounds,
                                              iters)
                torch.cuda.empty_cache()  # that case's buffers are gone with the call
                base = secs[op.torch_name]
                rows = sorted(secs, key=secs.get)
                lines += [f"## {op.name} {str(dtype)[6:]} {mb} MB", "",
                          table(["launch", "GB/s", "vs torch", "vs copy", "ok"],
                                [[name, f"{nbytes / secs[name] / 1e9:.0f}",
                                  f"{base / secs[name]:.3f}x",
                                  f"{secs['x.copy_'] / secs[name]:.1%}",
                                  "-" if name == "x.copy_" else
                                  ("yes" if ok[name] else "WRONG")] for name in rows]), ""]
                for v in variants:
                    if ok[v.name]:
                        ratios[op.launch][(esize, (op.name, mb), v)] = base / secs[v.name]
                win = next((n for n in rows if ok.get(n) and n not in (op.torch_name,
                                                                       "shipped")),
                           "(none correct)")
                shipped_ratios[op.launch].append(base / secs["shipped"])
                summary[op.launch].append(
                    f"- {op.name} {str(dtype)[6:]} {mb} MB: fastest {win} "
                    f"{base / secs.get(win, float('inf')):.3f}x {op.torch_name} "
                    f"({secs['x.copy_'] / secs.get(win, float('inf')):.1%} of copy); shipped "
                    f"{base / secs['shipped']:.3f}x ({secs['x.copy_'] / secs['shipped']:.1%} of "
                    f"copy); x.copy_ {base / secs['x.copy_']:.3f}x"
                    + ("" if all(ok.values()) else "; WRONG outputs: " +
                       ", ".join(n for n, good in ok.items() if not good)))
    # The per-case summaries first, the decisions last (they stay in a short tail).
    lines += ["## Verdict", "", *summary["kFwd"], *summary["kFwdMath"], ""]
    for name in grids:
        lines += verdict(name, ratios[name], shipped_ratios[name])
    return lines


def verdict(name: str, ratios: dict, shipped_ratios: list[float]) -> list[str]:
    """The decision lines for one launch of common.cuh (kFwd or kFwdMath)."""
    ops = "ReLU" if name == "kFwd" else "ELU, Sigmoid, TanH"
    if not ratios:
        return [f"- {name} ({ops}): no variant was correct; keep the shipped line"]
    best, worst = fwd_variants.choose(ratios)
    current = fwd_variants.shipped(name=name)
    cur_worst = min(shipped_ratios)  # the shipped module's own kernel, timed alongside
    lines = [f"- {name} ({ops}) best launch over all cases (worst case {worst:.3f}x PyTorch's "
             f"op): `{best.line(name)}`",
             f"- {name} shipped launch (worst case {cur_worst:.3f}x): `{current.line(name)}`"]
    if best == current or worst - cur_worst < 0.005 or cur_worst >= 0.995:
        lines.append(f"- KEEP the shipped {name} (within 0.5% of PyTorch's op or of the best).")
    else:
        lines.append(f"- SET in caffe_py/kernels/csrc/common.cuh: `{best.line(name)}` "
                     f"(+{(worst - cur_worst) * 100:.1f} points in the worst case).")
    meets = "meets" if worst >= 0.995 else "misses"
    lines.append(f"- {name}: the best launch {meets} 'never slower than PyTorch's op' "
                 f"(0.5% timing tolerance).")
    return lines


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--resnet-batch", type=int, default=64)
    ap.add_argument("--no-nets", action="store_true", help="kernels only")
    ap.add_argument("--out", help="also write the report here (default: $OUT/kernels.md, "
                    "$OUT/fwd_variants.md with --variants)")
    ap.add_argument("--variants", action="store_true",
                    help="time every forward launch variant instead (see the docstring)")
    ap.add_argument("--rounds", type=int, default=11, help="--variants: interleaved rounds")
    ap.add_argument("--iters", type=int, default=20, help="--variants: calls per timing")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("benchmarks/activations.py needs a CUDA device")
    if args.variants:
        report = "\n".join(run_variants(args.rounds, args.iters, args.sizes_mb)) + "\n"
        print(report)
        write_report(report, args.out, "fwd_variants.md")
        return
    t0 = time.perf_counter()
    where, build_s = build.build()
    ext = build.load()
    lines = [f"# Activation kernels: {torch.cuda.get_device_name()}", "",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
             f"- command: `python {' '.join(sys.argv)}`",
             f"- torch {torch.__version__}, CUDA {torch.version.cuda}, Python "
             f"{platform.python_version()}, TORCH_CUDA_ARCH_LIST="
             f"{os.environ.get('TORCH_CUDA_ARCH_LIST', '(all visible)')}",
             f"- extension build or load: {build_s:.1f} s in {where}", ""]
    rows, copy_lines = [], []
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for mb in args.sizes_mb:
            r, copies = kernel_rows(ext, mb, dtype)
            torch.cuda.empty_cache()  # the tensors of that size are gone with the call
            rows += r
            copy_lines.append(f"- copy {dtype_name} {mb} MB: x.copy_ {copies['copy_']:.0f} GB/s, "
                              f"clone {copies['clone']:.0f} GB/s")
    lines += ["## Device copy bandwidth (bytes read + written)", "", *copy_lines, "",
              "## Kernels (GB/s counts bytes read + written; fwd/copy against x.copy_)", "",
              table(HEADER, [r.cells() for r in rows]), ""]
    lines += ["## DEFAULT check (caffe_py/layers/activation.py DEFAULT_BACKEND)", "",
              *default_check(rows), "",
              "## Small tensors: microseconds per call (host time rules here)", "",
              table(SMALL_HEADER, [small_row(ext, s) for s in SMALL_SHAPES]), ""]
    if not args.no_nets:
        net_table = net_rows(args.resnet_batch)
        if net_table:
            lines += ["## Training step (forward + backward), median", "",
                      table(["net", "activations", "ms/step", "speed vs TORCH", "peak GiB",
                             "layers on kernels", "fused pairs"], net_table), ""]
    lines.append(f"Total benchmark time {time.perf_counter() - t0:.0f} s.")
    report = "\n".join(lines) + "\n"
    print(report)
    write_report(report, args.out, "kernels.md")


def write_report(report: str, out: str | None, default_name: str) -> None:
    """Write the report to ``out``, else to $OUT/default_name when OUT is set."""
    out = out or (os.path.join(os.environ["OUT"], default_name) if os.environ.get("OUT")
                  else None)
    if out:
        Path(out).write_text(report)
        print(f"(written to {out})", file=sys.stderr)


if __name__ == "__main__":
    main()
