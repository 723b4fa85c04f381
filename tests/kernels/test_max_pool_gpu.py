"""Max pooling's kernels (csrc/max_pool.cu, functions.max_pool) against PyTorch's max_pool2d on
the same channels_last input: the values, and the input's gradient, bit for bit, with ties in
every window; and the Pooling layer on them against the layer with ``max_pool_kernel: false``.
Skipped without CUDA; run with `pytest -m gpu`."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from caffe_py.kernels import functions
from caffe_py.layers.vision import MAX_POOL_KERNEL
from caffe_py.net import Net

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CL = torch.channels_last
# (N, C, H, W), kernel, stride, pad, ceil_mode
WINDOWS = [
    ((2, 16, 23, 23), (3, 3), (2, 2), (0, 0), True),      # ResNet-50's pool1, ceil rounding
    ((3, 16, 24, 24), (2, 2), (2, 2), (0, 0), False),     # LeNet's pools
    ((2, 32, 13, 17), (3, 3), (2, 2), (1, 1), True),      # padding, odd sizes, a clipped edge
    ((2, 16, 7, 7), (7, 7), (1, 1), (0, 0), False),       # a global pooling
    ((1, 64, 12, 12), (3, 3), (1, 1), (1, 1), False),     # each input in up to 9 windows
    ((2, 24, 10, 11), (2, 3), (1, 2), (1, 1), True),      # rectangular windows and strides
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def grid_values(shape, dtype, seed, levels=4):
    """Values on a coarse grid, so that most windows hold ties (the first maximum must win)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randint(0, levels, shape, generator=g, device="cuda").to(dtype) - 1.5) \
        .contiguous(memory_format=CL)


def pytorchs(x, kernel, stride, pad, ceil, g):
    xr = x.detach().clone().requires_grad_()
    y = F.max_pool2d(xr, kernel, stride, pad, ceil_mode=ceil)
    y.backward(g)
    return y.detach(), xr.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,kernel,stride,pad,ceil", WINDOWS)
def test_values_and_gradient_are_pytorchs(shape, kernel, stride, pad, ceil, dtype):
    x = grid_values(shape, dtype, seed=1)
    out = F.max_pool2d(x, kernel, stride, pad, ceil_mode=ceil).shape[2:]
    gen = torch.Generator(device="cuda").manual_seed(2)
    g = torch.randn((*shape[:2], *out), generator=gen, device="cuda").to(dtype) \
        .contiguous(memory_format=CL)
    want_y, want_gx = pytorchs(x, kernel, stride, pad, ceil, g)
    assert functions.max_pool_fits(x, kernel)
    xk = x.detach().clone().requires_grad_()
    y = functions.max_pool(xk, kernel, stride, pad, tuple(out))
    y.backward(g)
    assert y.is_contiguous(memory_format=CL) and xk.grad.is_contiguous(memory_format=CL)
    assert torch.equal(y, want_y)
    assert torch.equal(xk.grad, want_gx)


def test_a_gradient_in_another_layout_and_two_runs_give_the_same_bits():
    x = grid_values((2, 16, 23, 23), torch.bfloat16, seed=3).requires_grad_()
    y = functions.max_pool(x, (3, 3), (2, 2), (0, 0), (11, 11))
    g = torch.randn(y.shape, device="cuda").to(torch.bfloat16)   # contiguous, not channels_last
    first, = torch.autograd.grad(y, x, g, retain_graph=True)
    second, = torch.autograd.grad(y, x, g)
    _, want = pytorchs(x, (3, 3), (2, 2), (0, 0), True, g.contiguous(memory_format=CL))
    assert torch.equal(first, want) and torch.equal(second, want)


def test_a_nan_wins_its_window_as_in_pytorch():
    x = grid_values((1, 8, 6, 6), torch.float32, seed=4)
    x[0, 0, 1, 1] = float("nan")
    x[0, 3, 4, 5] = float("nan")
    x[0, 3, 5, 5] = float("nan")   # a later NaN in the same window
    g = torch.randn((1, 8, 3, 3), device="cuda").contiguous(memory_format=CL)
    want_y, want_gx = pytorchs(x, (2, 2), (2, 2), (0, 0), False, g)
    xk = x.detach().clone().requires_grad_()
    y = functions.max_pool(xk, (2, 2), (2, 2), (0, 0), (3, 3))
    y.backward(g)
    assert torch.equal(y.isnan(), want_y.isnan()) and int(y.isnan().sum()) == 2
    assert torch.equal(y.nan_to_num(), want_y.nan_to_num())
    assert torch.equal(xk.grad, want_gx)


def test_what_the_kernels_take():
    x = grid_values((2, 16, 8, 8), torch.float32, seed=5)
    assert functions.max_pool_fits(x, (3, 3))
    assert not functions.max_pool_fits(x.contiguous(), (3, 3))               # NCHW
    assert not functions.max_pool_fits(x.double(), (3, 3))
    assert not functions.max_pool_fits(x[:, :6].contiguous(memory_format=CL), (3, 3))
    assert functions.max_pool_fits(x[:, :4].contiguous(memory_format=CL), (3, 3))  # float32: 4
    assert not functions.max_pool_fits(x[:, :4].half().contiguous(memory_format=CL), (3, 3))
    assert not functions.max_pool_fits(x, (16, 16))                          # 256 > 255
    assert not functions.max_pool_fits(x.cpu(), (3, 3))


POOL_NET = """
name: pool
layer:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [4, 16, 15, 15]}}}
  - {name: conv1, type: Convolution, bottom: data, top: conv1,
     convolution_param: {num_output: 16, kernel_size: 3, pad: 1,
                         weight_filler: {type: gaussian, std: 0.1}}}
  - {name: pool1, type: Pooling, bottom: conv1, top: pool1,
     pooling_param: {pool: MAX, kernel_size: 3, stride: 2}}
  - {name: pool2, type: Pooling, bottom: pool1, top: pool2,
     pooling_param: {pool: MAX, kernel_size: 2, stride: 2, pad: 1}}
"""


def test_the_pooling_layer_on_the_kernels_trains_as_on_pytorchs(spec_of, monkeypatch):
    for flag, value in (("allow_tf32", False), ("deterministic", True), ("benchmark", False)):
        monkeypatch.setattr(torch.backends.cudnn, flag, value)
    x = grid_values((4, 16, 15, 15), torch.float32, seed=6)
    results = {}
    for on in (True, False):
        net = Net(spec_of(POOL_NET), device="cuda", seed=2, options={MAX_POOL_KERNEL: on})
        net.to(memory_format=CL)
        assert [net.layer_by_name(n).max_kernel for n in ("pool1", "pool2")] == [on, on]
        out = net(x)
        assert (type(out.grad_fn).__name__ == "_MaxPoolBackward") == on
        out.square().sum().backward()
        results[on] = (out.detach(), [lp.param.grad for lp in net.learnable_params()])
    assert torch.equal(results[True][0], results[False][0])
    for a, b in zip(results[True][1], results[False][1], strict=True):
        assert torch.equal(a, b)
