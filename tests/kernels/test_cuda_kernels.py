"""The CUDA kernels against the torch reference (float64 oracle), forward and backward.

Every raw kernel call writes into an output filled with NaN first, so an element a kernel
fails to write shows up as NaN. Shapes cover the vector path, the scalar tail (sizes that are
not a multiple of the 16-byte pack), misaligned views (x[1:]), empty tensors, channels_last,
both reduction paths of the per-channel backward (long rows, and short rows with one or
several block rows), and grids of many blocks with a partial or a full last block. Skipped
without CUDA; run with `pytest -m gpu`.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from caffe_py.kernels import build, functions
from caffe_py.kernels import reference as ref

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
# (rtol, atol) of one rounding to the dtype after float (double) arithmetic
TOL = {torch.float32: (1e-6, 1e-6), torch.float16: (1e-3, 1e-4),
       torch.bfloat16: (8e-3, 1e-3), torch.float64: (1e-12, 1e-12)}
KINDS = [(ref.RELU, 0.0), (ref.RELU, 0.1), (ref.RELU, -0.3), (ref.ELU, 1.0), (ref.ELU, 0.5),
         (ref.ELU, -0.5), (ref.SIGMOID, 0.0), (ref.TANH, 0.0)]
SHAPES = [(1,), (7,), (13, 17), (3, 5, 7, 11), (4, 16, 9, 9), (2, 8, 40, 40)]
_seeds = itertools.count(1)


@pytest.fixture(scope="module")
def ext():
    return build.load()


def rand(shape, dtype, layout="contiguous", scale=2.0):
    """Fresh random values (a new seed per call) in ``dtype`` and ``layout``."""
    g = torch.Generator(device="cuda").manual_seed(next(_seeds))
    x = (torch.randn(shape, generator=g, device="cuda") * scale).to(dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def nan_like(x: torch.Tensor) -> torch.Tensor:
    return torch.full_like(x, float("nan"))


def check(got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.double(), expected.double(), rtol=rtol, atol=atol)


def check_sum(got: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor) -> None:
    """A float-accumulated reduction: error bounded by the sum of |terms|, not the result."""
    err = (got.double() - expected).abs()
    bound = 1e-5 * magnitude + 1e-6 * expected.abs() + 1e-9
    assert bool((err <= bound).all()), f"max error {err.max().item()} over bound"


def layouts(shape):
    return ["contiguous", "channels_last"] if len(shape) == 4 else ["contiguous"]


# ---- elementwise -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("kind", "p"), KINDS)
def test_activation_forward_and_backward(ext, kind, p, dtype):
    from_output = functions.output_derivable(kind, p)
    for shape in SHAPES:
        for layout in layouts(shape):
            x = rand(shape, dtype, layout)
            y = nan_like(x)
            ext.act_forward(x, y, kind, p)
            check(y, ref.activation(x.double(), kind, p), dtype)
            g = rand(shape, dtype, layout)
            saved = y if from_output else x
            gi = nan_like(x)
            ext.act_backward(g, saved, gi, kind, p, from_output)
            check(gi, ref.activation_backward(g.double(), saved.double(), kind, p, from_output),
                  dtype)
    if kind == ref.ELU:  # the input-based ELU backward, for any alpha
        x, g = rand((1000,), dtype), rand((1000,), dtype)
        gi = nan_like(x)
        ext.act_backward(g, x, gi, kind, p, False)
        check(gi, ref.activation_backward(g.double(), x.double(), kind, p, False), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_misaligned_views_and_exact_bounds(ext, dtype):
    for n in (1, 9, 1001):
        base = rand((n + 2,), dtype)
        out = nan_like(base)
        x, y = base[1:-1], out[1:-1]  # 2 or 4 bytes past a 16-byte boundary
        ext.act_forward(x, y, ref.TANH, 0.0)
        check(y, torch.tanh(x.double()), dtype)
        assert out[0].isnan() and out[-1].isnan()  # nothing written outside the view
        g, gi_base = rand((n + 2,), dtype), nan_like(base)
        ext.act_backward(g[1:-1], y, gi_base[1:-1], ref.TANH, 0.0, True)
        check(gi_base[1:-1], ref.activation_backward(g[1:-1].double(), y.double(), ref.TANH),
              dtype)
        assert gi_base[0].isnan() and gi_base[-1].isnan()


def test_in_place_raw_and_empty(ext):
    x = rand((3, 1001), torch.float32)
    expected = ref.elu(x.double(), 0.7)
    ext.act_forward(x, x, ref.ELU, 0.7)
    check(x, expected, torch.float32)
    empty = torch.empty(0, 3, device="cuda")
    ext.act_forward(empty, empty, ref.RELU, 0.0)
    ext.act_backward(empty, empty, empty, ref.RELU, 0.0, True)


def test_more_than_one_wave(ext):
    x = rand((2 ** 23 + 5,), torch.float32)
    y = nan_like(x)
    ext.act_forward(x, y, ref.RELU, 0.2)
    check(y, ref.relu(x.double(), 0.2), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_full_last_block_still_writes_the_tail(ext, dtype):
    """n = 2 blocks of 128 threads x 4 whole packs (a whole number of the forward's blocks too),
    plus V - 1 elements after the last pack."""
    v = 16 // torch.empty((), dtype=dtype).element_size()
    n = 2 * 512 * v + v - 1
    x, g = rand((n,), dtype), rand((n,), dtype)
    y, gi = nan_like(x), nan_like(x)
    ext.act_forward(x, y, ref.SIGMOID, 0.0)
    check(y, torch.sigmoid(x.double()), dtype)
    ext.act_backward(g, y, gi, ref.SIGMOID, 0.0, True)
    check(gi, ref.activation_backward(g.double(), y.double(), ref.SIGMOID), dtype)
    bias = rand((1,), dtype)
    ext.bias_act_forward(x, bias, y.fill_(float("nan")), 1, n, ref.RELU, 0.0)
    check(y, ref.relu(x.double() + bias.double()), dtype)


# ---- PReLU -----------------------------------------------------------------------------------
# (shape, layout): inner 1056 (rows path, vector), 25 (columns), 1023 (rows, scalar: inner is
# not a multiple of the pack), channels_last (columns with inner 1), 2-D.
PRELU_CASES = [((2, 3, 32, 33), "contiguous"), ((4, 6, 5, 5), "contiguous"),
               ((2, 5, 31, 33), "contiguous"), ((3, 16, 7, 9), "channels_last"),
               ((37, 24), "contiguous"), ((2, 3, 1, 1000), "contiguous"),
               ((8, 16, 24, 24), "channels_last")]  # columns path with several block rows


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shared", [False, True], ids=["per_channel", "shared"])
def test_prelu_forward_backward_and_slope_gradient(ext, dtype, shared):
    for shape, layout in PRELU_CASES:
        x = rand(shape, dtype, layout)
        slope = (rand((1 if shared else shape[1],), dtype, scale=0.3) + 0.25).to(dtype)
        C, inner = functions.channel_view(x, 1, slope.numel())
        y = nan_like(x)
        ext.prelu_forward(x, slope, y, C, inner)
        check(y, ref.prelu(x.double(), slope.double()), dtype)
        g = rand(shape, dtype, layout)
        gx = nan_like(x)
        dslope = ext.prelu_backward(g, x, slope, gx, C, inner)
        want_x, want_s = ref.prelu_backward(g.double(), x.double(), slope.double())
        check(gx, want_x, dtype)
        terms = (g.double() * x.double()).abs() * (x <= 0)
        magnitude = ref.channel_sum(terms) if not shared else terms.sum().reshape(1)
        check_sum(dslope, want_s, magnitude)


def test_prelu_autograd_function_and_layouts():
    for layout in ("contiguous", "channels_last"):
        x = rand((2, 4, 6, 6), torch.float64, layout)
        x = (x + torch.sign(x) * 0.1).requires_grad_()  # away from the kink at 0
        assert functions.memory_format(x) is (torch.channels_last if layout == "channels_last"
                                              else torch.contiguous_format)
        slope = torch.tensor([0.1, 0.2, -0.3, 0.4], dtype=torch.float64, device="cuda",
                             requires_grad=True)
        assert torch.autograd.gradcheck(functions.prelu, (x, slope))
        shared = torch.tensor(0.3, dtype=torch.float64, device="cuda", requires_grad=True)
        assert torch.autograd.gradcheck(functions.prelu, (x, shared))  # a 0-axis blob


# ---- fused bias + activation -----------------------------------------------------------------
BIAS_CASES = [((2, 3, 32, 33), "contiguous", 1), ((4, 6, 5, 5), "contiguous", 1),
              ((3, 16, 7, 9), "channels_last", 1), ((37, 24), "contiguous", 1),
              ((2, 5, 31, 33), "contiguous", 1), ((5, 3, 7), "contiguous", 2),
              # columns path: LeNet's ip1 (one block row, no atomics), and enough rows for
              # several block rows adding with atomics
              ((64, 500), "contiguous", 1), ((3000, 24), "contiguous", 1),
              ((8, 16, 24, 24), "channels_last", 1)]
FUSED_KINDS = [k for k in KINDS if functions.output_derivable(*k)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("kind", "p"), FUSED_KINDS)
def test_bias_activation_forward_backward_and_bias_gradient(ext, kind, p, dtype):
    for shape, layout, axis in BIAS_CASES:
        x = rand(shape, dtype, layout)
        bias = rand((shape[axis],), dtype, scale=0.5)
        C, inner = functions.channel_view(x, axis, bias.numel())
        y = nan_like(x)
        ext.bias_act_forward(x, bias, y, C, inner, kind, p)
        check(y, ref.bias_activation(x.double(), bias.double(), kind, p, axis), dtype)
        g = rand(shape, dtype, layout)
        gx = nan_like(x)
        dbias = ext.bias_act_backward(g, y, bias, gx, C, inner, kind, p)
        want_x, want_b = ref.bias_activation_backward(g.double(), y.double(), kind, p, axis)
        check(gx, want_x, dtype)
        check_sum(dbias, want_b, ref.channel_sum(want_x.abs(), axis))


def test_bias_activation_in_place_and_empty(ext):
    x = rand((2, 8, 24, 24), torch.float32)
    bias = rand((8,), torch.float32)
    expected = ref.bias_activation(x.double(), bias.double(), ref.RELU, 0.0)
    ext.bias_act_forward(x, bias, x, 8, 576, ref.RELU, 0.0)
    check(x, expected, torch.float32)
    empty = torch.empty(0, 8, 3, 3, device="cuda")
    dbias = ext.bias_act_backward(empty, empty, bias, empty, 8, 9, ref.RELU, 0.0)
    assert dbias.tolist() == [0.0] * 8


# ---- the autograd Functions and the layers ----------------------------------------------------
@pytest.mark.parametrize(("kind", "p"), KINDS)
def test_autograd_functions_gradcheck(kind, p):
    x = rand((3, 4, 5), torch.float64)
    x = (x + torch.sign(x) * 0.1).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: functions.activation(t, kind, p), (x,))
    if functions.output_derivable(kind, p):
        bias = torch.linspace(-0.05, 0.05, 4, dtype=torch.float64, device="cuda",
                              requires_grad=True)
        assert torch.autograd.gradcheck(
            lambda t, b: functions.bias_activation(t, b, kind, p, 1), (x, bias))


def test_in_place_function_marks_dirty_and_keeps_gradients():
    w = torch.tensor(1.5, device="cuda", requires_grad=True)
    x = rand((64, 100), torch.float32)
    pre = x * w
    y = functions.activation(pre, ref.SIGMOID, 0.0, inplace=True)
    assert y is pre and pre._version > 0
    y.sum().backward()
    s = torch.sigmoid(x * 1.5)
    torch.testing.assert_close(w.grad, (s * (1 - s) * x).sum(), rtol=1e-5, atol=1e-5)
    # Overwriting a tensor that another backward needs is caught, not silently wrong.
    a = rand((10,), torch.float32).requires_grad_()
    b = torch.exp(a)  # exp saves its output
    functions.activation(b, ref.RELU, 0.0, inplace=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        b.sum().backward()


def test_gradients_in_another_layout_are_converted():
    x = rand((2, 3, 4, 5), torch.float32, "channels_last").requires_grad_()
    y = functions.activation(x, ref.TANH, 0.0)
    g = rand((2, 3, 4, 5), torch.float32)  # contiguous, y is channels_last
    (gx,) = torch.autograd.grad(y, x, g)
    check(gx, ref.activation_backward(g.double(), y.detach().double(), ref.TANH), torch.float32)


CHAIN = """
name: chain
input: [data, target]
input_shape: [{dim: [8, 3, 16, 16]}, {dim: [8, 10]}]
layer:
  - {name: conv, type: Convolution, bottom: data, top: conv,
     convolution_param: {num_output: 16, kernel_size: 3, weight_filler: {type: xavier},
                         bias_filler: {type: gaussian, std: 0.3}}}
  - {name: relu, type: ReLU, bottom: conv, top: conv}
  - {name: prelu, type: PReLU, bottom: conv, top: p}
  - {name: ip, type: InnerProduct, bottom: p, top: ip,
     inner_product_param: {num_output: 10, weight_filler: {type: xavier},
                           bias_filler: {type: gaussian, std: 0.3}}}
  - {name: elu, type: ELU, bottom: ip, top: ip}
  - {name: loss, type: EuclideanLoss, bottom: [ip, target], top: loss}
"""


def chain(spec_of, options, fuse=False):
    from caffe_py.net import Net

    net = Net(spec_of(CHAIN), device="cuda", seed=2,
              options={**options, "fuse_bias_activation": fuse})
    fused = net.fused
    g = torch.Generator().manual_seed(3)
    inputs = {"data": torch.randn(8, 3, 16, 16, generator=g).cuda(),
              "target": torch.randn(8, 10, generator=g).cuda()}
    out = net(inputs)
    out.loss.backward()
    return net, fused, out.loss.item(), [p.param.grad for p in net.learnable_params()]


def test_conv_relu_in_place_ip_chain_on_the_kernels(spec_of, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # compare float32 to float32
    torch_net, _, loss, grads = chain(spec_of, {"activation_engine": "TORCH"})
    assert torch_net.layer_by_name("relu").backend == "torch"
    cuda = {"activation_engine": "CUDA"}
    for options, fuse in ((cuda, False), ({**cuda, "inplace_activations": True}, False),
                          (cuda, True)):
        net, fused, got_loss, got = chain(spec_of, options, fuse)
        assert net.layer_by_name("relu").backend == "cuda"
        assert net.layer_by_name("prelu").backend == "cuda"
        assert fused == ([("conv", "relu"), ("ip", "elu")] if fuse else [])
        assert got_loss == pytest.approx(loss, rel=1e-5)
        for a, b in zip(grads, got, strict=True):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_default_engine_on_a_cuda_net_follows_the_table(spec_of):
    from caffe_py.layers.activation import DEFAULT_BACKEND

    net, fused, _, _ = chain(spec_of, {}, fuse=True)
    assert net.layer_by_name("relu").backend == DEFAULT_BACKEND["ReLU"]
    assert net.layer_by_name("prelu").backend == DEFAULT_BACKEND["PReLU"]
    assert fused == []  # 8 x 16 x 14 x 14 is below FUSE_MIN_ELEMENTS


def test_layer_engine_cuda_uses_the_kernels(spec_of):
    from caffe_py.net import Net

    text = CHAIN.replace("{name: relu, type: ReLU, bottom: conv, top: conv}",
                         "{name: relu, type: ReLU, bottom: conv, top: conv, "
                         "relu_param: {engine: CUDA, negative_slope: 0.01}}")
    # Unfused, so that the layer called on its own adds no Convolution bias.
    net = Net(spec_of(text), device="cuda", options={"fuse_bias_activation": False})
    layer = net.layer_by_name("relu")
    assert layer.backend == "cuda"
    x = rand((8, 16, 14, 14), torch.float32)
    check(layer(x), ref.relu(x.double(), 0.01), torch.float32)
    out = net({"data": rand((8, 3, 16, 16), torch.float32),
               "target": rand((8, 10), torch.float32)})
    assert math.isfinite(out.loss.item())
