"""The torch reference (the kernels' oracle): its gradient formulas against autograd."""
from __future__ import annotations

import pytest
import torch

from caffe_py.kernels import reference as ref
from caffe_py.kernels.functions import channel_view, memory_format, output_derivable


def away_from_zero(*shape, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(*shape, generator=g, dtype=torch.float64) * 1.9 + 0.1
    return x * (torch.randint(0, 2, shape, generator=g).to(torch.float64) * 2 - 1)


KINDS = [(ref.RELU, 0.0), (ref.RELU, 0.1), (ref.RELU, -0.4), (ref.ELU, 1.0), (ref.ELU, 0.3),
         (ref.ELU, -0.5), (ref.SIGMOID, 0.0), (ref.TANH, 0.0)]


@pytest.mark.parametrize(("kind", "p"), KINDS)
def test_activation_backward_formula_matches_autograd(kind, p):
    x = away_from_zero(3, 4, 5, seed=kind).requires_grad_()
    g = torch.randn(3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    y = ref.activation(x, kind, p)
    (expected,) = torch.autograd.grad(y, x, g)
    from_output = output_derivable(kind, p)
    saved = y.detach() if from_output else x.detach()
    got = ref.activation_backward(g, saved, kind, p, from_output)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    if kind == ref.ELU:  # from the input works for every alpha
        got = ref.activation_backward(g, x.detach(), kind, p, from_output=False)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("kind", "p"), [k for k in KINDS if output_derivable(*k)])
def test_in_place_reference_matches_out_of_place(kind, p):
    x = away_from_zero(6, 7, seed=3)
    expected = ref.activation(x, kind, p)
    y = x.clone()
    assert ref.activation(y, kind, p, inplace=True) is y
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_relu_negative_slope_is_caffes_formula():
    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0])
    for slope in (0.0, 0.25, -0.5):
        expected = torch.clamp(x, min=0) + slope * torch.clamp(x, max=0)
        torch.testing.assert_close(ref.relu(x, slope), expected, rtol=0, atol=0)
    assert ref.relu(torch.tensor([float("-inf"), float("nan")])).tolist()[0] == 0.0


@pytest.mark.parametrize("shared", [False, True])
def test_prelu_backward_formula_matches_autograd(shared):
    x = away_from_zero(2, 3, 4, 5, seed=4).requires_grad_()
    slope = (torch.tensor([0.3]) if shared else torch.tensor([0.1, -0.2, 0.7])).double()
    slope.requires_grad_()
    g = torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    y = ref.prelu(x, slope)
    gx, gs = torch.autograd.grad(y, (x, slope), g)
    got_x, got_s = ref.prelu_backward(g, x.detach(), slope.detach())
    torch.testing.assert_close(got_x, gx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_s, gs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("kind", "p", "axis"), [(ref.RELU, 0.0, 1), (ref.RELU, 0.2, 1),
                                                 (ref.ELU, 1.0, 1), (ref.SIGMOID, 0.0, 2),
                                                 (ref.TANH, 0.0, 3)])
def test_bias_activation_backward_formula_matches_autograd(kind, p, axis):
    x = away_from_zero(2, 3, 4, 5, seed=6).requires_grad_()
    bias = torch.linspace(-0.05, 0.05, x.shape[axis], dtype=torch.float64).requires_grad_()
    g = torch.randn(2, 3, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = ref.bias_activation(x, bias, kind, p, axis)
    shape = [1] * 4
    shape[axis] = -1
    torch.testing.assert_close(y, ref.activation(x + bias.reshape(shape), kind, p))
    gx, gb = torch.autograd.grad(y, (x, bias), g)
    got_x, got_b = ref.bias_activation_backward(g, y.detach(), kind, p, axis)
    torch.testing.assert_close(got_x, gx, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_b, gb, rtol=1e-12, atol=1e-12)


def test_channel_view_follows_the_memory_layout():
    x = torch.zeros(2, 3, 4, 5)
    assert memory_format(x) is torch.contiguous_format
    assert channel_view(x, 1, 3) == (3, 20)
    assert channel_view(x, 3, 5) == (5, 1)
    assert channel_view(x, 1, 1) == (1, 120)  # a shared slope: one channel over everything
    cl = x.contiguous(memory_format=torch.channels_last)
    assert memory_format(cl) is torch.channels_last
    assert channel_view(cl, 1, 3) == (3, 1)
    assert memory_format(x.transpose(2, 3)) is None
    assert channel_view(torch.zeros(4, 6), 1, 6) == (6, 1)
    assert output_derivable(ref.RELU, 0.0) and not output_derivable(ref.RELU, -0.1)
    assert output_derivable(ref.SIGMOID, -3.0) and not output_derivable(ref.ELU, -1.0)
