"""Plain PyTorch activations: the CPU path of every activation layer and the kernels' oracle.

Each function follows Caffe's formula (CAFFE_REFERENCE.md) and lets autograd differentiate it.
The ``*_backward`` functions spell out the gradient the CUDA kernels compute from a saved
tensor (the input, or the output where that is enough); the GPU tests compare the kernels with
them, and the CPU tests check them against autograd of the forward functions.

``inplace=True`` overwrites the input through PyTorch's own in-place ops, so autograd's version
counters still catch a use of the overwritten tensor.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

RELU, ELU, SIGMOID, TANH = 0, 1, 2, 3
"""Activation kinds, shared with the CUDA code (csrc/common.cuh, enum Kind)."""

KIND_NAMES = {RELU: "ReLU", ELU: "ELU", SIGMOID: "Sigmoid", TANH: "TanH"}


def relu(x: torch.Tensor, negative_slope: float = 0.0, inplace: bool = False) -> torch.Tensor:
    """Caffe's ReLU: max(x, 0) + negative_slope * min(x, 0) (leaky when the slope is not 0)."""
    if negative_slope == 0.0:
        return F.relu(x, inplace=inplace)
    if negative_slope > 0.0:
        return F.leaky_relu(x, negative_slope, inplace=inplace)
    # leaky_relu's backward tests the output's sign, which a negative slope flips.
    out = torch.where(x > 0, x, x * negative_slope)
    return x.copy_(out) if inplace else out


def elu(x: torch.Tensor, alpha: float = 1.0, inplace: bool = False) -> torch.Tensor:
    """Caffe's ELU: x where x > 0, alpha * (exp(x) - 1) elsewhere."""
    if alpha >= 0.0:
        return F.elu(x, alpha, inplace=inplace)
    out = torch.where(x > 0, x, alpha * torch.expm1(x))
    return x.copy_(out) if inplace else out


def sigmoid(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    return x.sigmoid_() if inplace else torch.sigmoid(x)


def tanh(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    return x.tanh_() if inplace else torch.tanh(x)


def activation(x: torch.Tensor, kind: int, p: float = 0.0, inplace: bool = False) -> torch.Tensor:
    """One of the four kinds; ``p`` is ReLU's negative_slope or ELU's alpha."""
    if kind == RELU:
        return relu(x, p, inplace)
    if kind == ELU:
        return elu(x, p, inplace)
    if kind == SIGMOID:
        return sigmoid(x, inplace)
    if kind == TANH:
        return tanh(x, inplace)
    raise ValueError(f"unknown activation kind {kind}")


def prelu(x: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
    """Caffe's PReLU over axis 1: max(x, 0) + slope[c] * min(x, 0); slope has C or 1 values."""
    shape = [1] * x.dim()
    if slope.numel() > 1:
        shape[1] = slope.numel()
    a = slope.to(x.dtype).reshape(shape)
    return torch.where(x > 0, x, a * x)


def bias_activation(x: torch.Tensor, bias: torch.Tensor, kind: int, p: float = 0.0,
                    axis: int = 1, inplace: bool = False) -> torch.Tensor:
    """The two ops the fused kernel replaces: x + bias (along ``axis``), then the activation."""
    shape = [1] * x.dim()
    shape[axis] = bias.numel()
    b = bias.to(x.dtype).reshape(shape)
    pre = x.add_(b) if inplace else x + b
    return activation(pre, kind, p, inplace=True)


# ---- the gradients the kernels compute, as formulas --------------------------------------------
def activation_backward(g: torch.Tensor, saved: torch.Tensor, kind: int, p: float = 0.0,
                        from_output: bool = True) -> torch.Tensor:
    """dL/dx from dL/dy and the saved tensor (y when ``from_output``, else x)."""
    pos = saved > 0
    if kind == RELU:
        return torch.where(pos, g, g * p if p != 0.0 else torch.zeros_like(g))
    if kind == ELU:
        neg = g * (saved + p) if from_output else g * p * torch.exp(saved)
        return torch.where(pos, g, neg)
    if kind == SIGMOID:
        return g * (1 - saved) * saved
    if kind == TANH:
        return g * (1 - saved * saved)
    raise ValueError(f"unknown activation kind {kind}")


def channel_sum(t: torch.Tensor, axis: int = 1) -> torch.Tensor:
    """Sum over every axis but ``axis``: a bias's or a per-channel slope's gradient."""
    dims = [d for d in range(t.dim()) if d != axis]
    return t.sum(dim=dims) if dims else t


def bias_grad(g: torch.Tensor, C: int, inner: int) -> torch.Tensor:
    """csrc/bias_grad.cu's result: g viewed as [outer, C, inner] summed to [C], in float32."""
    return channel_sum(g.reshape(-1, C, inner).float())


def prelu_backward(g: torch.Tensor, x: torch.Tensor, slope: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/dx, dL/dslope): Caffe sums g * x over x <= 0, per channel or over everything."""
    shape = [1] * x.dim()
    if slope.numel() > 1:
        shape[1] = slope.numel()
    a = slope.to(x.dtype).reshape(shape)
    pos = x > 0
    gx = torch.where(pos, g, a * g)
    contrib = torch.where(pos, torch.zeros_like(g), g * x)
    ds = channel_sum(contrib) if slope.numel() > 1 else contrib.sum().reshape(1)
    return gx, ds


def bias_activation_backward(g: torch.Tensor, y: torch.Tensor, kind: int, p: float = 0.0,
                             axis: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/dx, dL/dbias) of bias + activation, from the output y."""
    gx = activation_backward(g, y, kind, p, from_output=True)
    return gx, channel_sum(gx, axis)
