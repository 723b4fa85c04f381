"""A Convolution's bias through functions.bias_add, on the CPU with the kernel stood in for by
its reference (kernels/reference.py bias_grad): the autograd Function and the layer's routing.
The kernel itself is held to a float64 sum on a GPU (test_bias_grad_gpu.py)."""
from __future__ import annotations

import pytest
import torch
from support import CONV_BIAS_NET

from caffe_py.kernels import functions, reference
from caffe_py.layers.vision import BIAS_GRAD_KERNEL
from caffe_py.net import Net


class _Reference:
    """The extension's bias_grad, as its reference computes it; counts its calls."""

    def __init__(self):
        self.calls = []

    def bias_grad(self, g, C, inner):
        self.calls.append((tuple(g.shape), C, inner, g.is_contiguous()))
        return reference.bias_grad(g, C, inner)


@pytest.fixture
def stand_in(monkeypatch):
    ext = _Reference()
    monkeypatch.setattr(functions, "_ext", lambda: ext)
    monkeypatch.setattr(functions, "bias_add_fits", lambda y, bias: y.dim() >= 2
                        and y.is_contiguous() and y.shape[1] == bias.numel())
    return ext


def build(spec_of, kernel):
    net = Net(spec_of(CONV_BIAS_NET), seed=3)
    for name in ("conv1", "up"):
        net.layer_by_name(name).bias_kernel = kernel
    return net


def test_the_bias_through_bias_add_trains_as_through_the_convolution(spec_of, stand_in):
    x = torch.randn(4, 3, 9, 9, generator=torch.Generator().manual_seed(1))
    results = []
    for kernel in (True, False):
        net = build(spec_of, kernel)
        out = net(x)
        assert (type(out.grad_fn).__name__ == "_BiasAddBackward") == kernel
        (out * torch.arange(out.numel()).view_as(out).cos()).sum().backward()
        results.append((out.detach(), [lp.param.grad for lp in net.learnable_params()]))
    assert stand_in.calls == [((4, 2, 14, 14), 2, 196, True), ((4, 5, 7, 7), 5, 49, True)]
    (out_k, grads_k), (out_t, grads_t) = results
    torch.testing.assert_close(out_k, out_t, rtol=1e-6, atol=1e-6)
    assert len(grads_k) == 4
    for a, b in zip(grads_k, grads_t, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_without_gradients_or_with_the_option_off_the_convolution_adds_its_bias(spec_of,
                                                                                stand_in):
    x = torch.randn(4, 3, 9, 9)
    net = build(spec_of, True)
    with torch.no_grad():
        assert net(x).grad_fn is None
    net.layer_by_name("conv1").bias.requires_grad_(False)   # a frozen bias: nothing to sum
    net.layer_by_name("up").bias_kernel = False
    out = net(x)
    assert type(out.grad_fn).__name__ == "ConvolutionBackward0"
    out.sum().backward()
    assert stand_in.calls == []
    off = Net(spec_of(CONV_BIAS_NET), device="cpu", options={BIAS_GRAD_KERNEL: False})
    assert not off.layer_by_name("conv1").bias_kernel


def test_a_gradient_in_another_layout_is_made_contiguous_first(stand_in):
    y = torch.randn(2, 3, 4, 4)
    bias = torch.randn(3, requires_grad=True)
    out = functions.bias_add(y, bias)
    assert out is y
    g = torch.randn(2, 4, 4, 3).permute(0, 3, 1, 2)   # channels_last strides
    (db,) = torch.autograd.grad(out, bias, g)
    assert stand_in.calls == [((2, 3, 4, 4), 3, 16, True)]
    torch.testing.assert_close(db, g.sum((0, 2, 3)))
