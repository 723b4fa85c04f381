"""The bias-gradient kernel (csrc/bias_grad.cu) against a float64 sum, and a GPU Convolution
whose bias it serves against the same net with the net option ``bias_grad_kernel: false``.
Skipped without CUDA; run with `pytest -m gpu`."""
from __future__ import annotations

import pytest
import torch
from support import CONV_BIAS_NET

from caffe_py.kernels import build, functions
from caffe_py.layers.vision import BIAS_GRAD_KERNEL
from caffe_py.net import Net

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# (rtol, atol) against the float64 sum of the same values: float accumulation of up to 2^20
# values of size ~1
TOL = {torch.float32: (1e-5, 1e-3), torch.float16: (1e-5, 1e-3), torch.bfloat16: (1e-5, 1e-3)}
SHAPES = [
    (64, 50, 8, 8),     # LeNet's conv2: one block a channel
    (64, 20, 24, 24),   # LeNet's conv1: several blocks a channel, then their partials
    (3, 7, 5, 5),       # rows of 25: not a whole number of packs (one element a load)
    (5, 3),             # an InnerProduct-like (N, C): rows of one
    (2, 4, 3, 5, 6),    # 3-D convolution output
    (1, 1, 300, 301),   # one channel, one long row
    (16, 1000, 7, 7),   # many channels
]


@pytest.fixture(scope="module")
def ext():
    return build.load()


def values(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, generator=g, device="cuda") + 0.5).to(dtype)


def want(g: torch.Tensor) -> torch.Tensor:
    dims = [0, *range(2, g.dim())]
    return g.double().sum(dims)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", list(TOL))
def test_the_bias_gradient_is_the_sum_over_every_axis_but_the_channel(ext, shape, dtype):
    g = values(shape, dtype, seed=sum(shape))
    inner = g[0, 0].numel()
    got = ext.bias_grad(g, shape[1], inner)
    assert got.dtype == torch.float32 and got.shape == (shape[1],)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.double(), want(g), rtol=rtol, atol=atol * g[:, 0].numel())
    assert torch.equal(ext.bias_grad(g, shape[1], inner), got)   # the same bits every run


def test_a_misaligned_view_and_an_empty_batch(ext):
    flat = values((1 + 4 * 6 * 8,), torch.float32, seed=3)
    g = flat[1:].view(4, 6, 8)   # 4 bytes past a 16-byte boundary: one element a load
    torch.testing.assert_close(ext.bias_grad(g, 6, 8).double(), want(g), rtol=1e-6, atol=1e-5)
    empty = torch.empty((0, 6, 8), device="cuda")
    assert torch.equal(ext.bias_grad(empty, 6, 8), torch.zeros(6, device="cuda"))


def test_bad_arguments_are_one_line_errors(ext):
    g = values((4, 6, 8), torch.float32, seed=4)
    with pytest.raises(RuntimeError, match="bias_grad: g must be contiguous"):
        ext.bias_grad(g.transpose(1, 2), 6, 8)
    with pytest.raises(RuntimeError, match=r"bias_grad: g's 192 elements do not split into "
                                           r"\[outer, 5, 8\]"):
        ext.bias_grad(g, 5, 8)
    with pytest.raises(RuntimeError, match="bias_grad: C and inner must be >= 1, got 0 and 8"):
        ext.bias_grad(g, 0, 8)
    with pytest.raises(RuntimeError, match="bias_grad: g must be float32, float16 or bfloat16"):
        ext.bias_grad(g.double(), 6, 8)


def test_bias_add_adds_in_place_and_passes_the_gradient_through(ext):
    y = values((8, 5, 6, 6), torch.float32, seed=5).requires_grad_()
    bias = torch.randn(5, device="cuda", requires_grad=True)
    out = functions.bias_add(y.clone(), bias)
    torch.testing.assert_close(out, y + bias.view(1, 5, 1, 1))
    g = values((8, 5, 6, 6), torch.float32, seed=6)
    dy, db = torch.autograd.grad(out, (y, bias), g)
    assert torch.equal(dy, g)
    torch.testing.assert_close(db.double(), want(g), rtol=1e-6, atol=1e-4)
    assert functions.bias_add_fits(out, bias)
    assert not functions.bias_add_fits(out.contiguous(memory_format=torch.channels_last), bias)
    assert not functions.bias_add_fits(out.double(), bias)


def test_a_convolutions_bias_on_the_kernel_trains_as_on_the_convolution_op(spec_of, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # float32 against float32
    x = values((4, 3, 9, 9), torch.float32, seed=8)
    grads = {}
    for on in (True, False):
        net = Net(spec_of(CONV_BIAS_NET), device="cuda", seed=2, options={BIAS_GRAD_KERNEL: on})
        assert [net.layer_by_name(n).bias_kernel for n in ("conv1", "up")] == [on, on]
        out = net(x)
        assert (type(out.grad_fn).__name__ == "_BiasAddBackward") == on
        out.square().sum().backward()
        grads[on] = [lp.param.grad for lp in net.learnable_params()]
        with torch.no_grad():   # a forward without gradients: the convolution's own bias
            torch.testing.assert_close(net(x), out.detach(), rtol=1e-6, atol=1e-6)
    assert len(grads[True]) == 4
    for a, b in zip(grads[True], grads[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


def test_a_channels_last_output_keeps_pytorchs_bias_gradient(spec_of, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    net = Net(spec_of(CONV_BIAS_NET), device="cuda", seed=2)
    x = values((4, 3, 9, 9), torch.float32, seed=9).contiguous(memory_format=torch.channels_last)
    net.to(memory_format=torch.channels_last)
    out = net.layer_by_name("conv1")(x)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert type(out.grad_fn).__name__ != "_BiasAddBackward"
    conv = net.layer_by_name("conv1")
    want_out = torch.nn.functional.conv2d(x, conv.weight, conv.bias)
    torch.testing.assert_close(out, want_out)
