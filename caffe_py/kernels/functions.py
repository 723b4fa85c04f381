"""The CUDA kernels as autograd Functions (forward and backward are the custom kernels).

Tensors reach the kernels in one dense memory layout: contiguous, or channels_last for 4-D and
5-D tensors (the per-channel ops then see the channel as the fastest axis). Anything else is
made contiguous first; a gradient that arrives in another layout is copied into the input's.

In place (``inplace=True``) overwrites x, marks it dirty for autograd and keeps the output
for the backward: only kinds whose derivative follows from the output allow it (ReLU with a
negative_slope >= 0, ELU with alpha >= 0, Sigmoid, TanH). Autograd's version counter then
raises if anything else needed the overwritten input, so a wrong in-place choice fails loudly
instead of giving wrong gradients.
"""
from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from . import build
from .reference import ELU, RELU

_FORMATS = (torch.contiguous_format, torch.channels_last, torch.channels_last_3d)
_CHANNEL_LAST = {2: torch.contiguous_format, 4: torch.channels_last, 5: torch.channels_last_3d}
"""Per dimension, the layout in which the channel (axis 1) is the fastest axis."""


def _ext():
    """The loaded extension: a global read per call once loaded (no lock, no checks)."""
    module = build._module
    return module if module is not None else build.load()


def memory_format(x: torch.Tensor) -> torch.memory_format | None:
    """The dense layout the kernels can stream x in, or None (x must be copied first)."""
    if x.is_contiguous():
        return torch.contiguous_format
    if x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if x.dim() == 5 and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return None


def dense(x: torch.Tensor) -> torch.Tensor:
    return x if memory_format(x) is not None else x.contiguous()


def like(t: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """t in ref's memory layout (ref is dense)."""
    if t.is_contiguous() and ref.is_contiguous():  # the common case, two flag reads
        return t
    fmt = memory_format(ref)
    assert fmt is not None, "ref must be dense"
    if t.is_contiguous(memory_format=fmt) and memory_format(t) == fmt:
        return t
    return t.contiguous(memory_format=fmt)


def channel_view(x: torch.Tensor, axis: int, channels: int) -> tuple[int, int]:
    """(C, inner) of x viewed in memory order as [outer, C, inner] for channel ``axis``.

    ``channels`` == 1 is a shared parameter: one channel over everything.
    """
    if channels == 1:
        return 1, max(1, x.numel())
    if memory_format(x) is torch.contiguous_format:
        return channels, max(1, math.prod(x.shape[axis + 1:]))
    return channels, 1  # channels_last: the channel is the fastest axis (axis is 1 here)


def output_derivable(kind: int, p: float) -> bool:
    """Whether the backward can use the output alone (what in place and bias fusion need)."""
    return not ((kind == RELU or kind == ELU) and p < 0.0)


def _as_param(param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A parameter as the kernels read it: detached, x's dtype, contiguous (no copy if so)."""
    p = param.detach()
    if p.dtype != dtype:
        p = p.to(dtype)
    return p if p.is_contiguous() else p.contiguous()


def _as_grad(grad: torch.Tensor, dtype: torch.dtype, shape: torch.Size) -> torch.Tensor:
    """The kernels' [C] float (double) reduction as the parameter's gradient."""
    if grad.dtype != dtype:
        grad = grad.to(dtype)
    return grad if grad.shape == shape else grad.view(shape)


class _Activation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, kind: int, p: float, inplace: bool) -> torch.Tensor:
        from_output = output_derivable(kind, p)
        xd = dense(x)
        inplace = inplace and from_output and xd is x
        out = x if inplace else torch.empty_like(xd)
        _ext().act_forward(xd, out, kind, p)
        if inplace:
            ctx.mark_dirty(x)
        ctx.save_for_backward(out if from_output else xd)
        ctx.kind, ctx.p, ctx.from_output = kind, p, from_output
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        (saved,) = ctx.saved_tensors
        g = like(g, saved)
        grad_in = torch.empty_like(saved)
        _ext().act_backward(g, saved, grad_in, ctx.kind, ctx.p, ctx.from_output)
        return grad_in, None, None, None


class _PReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
        xd = dense(x)
        a = _as_param(slope, xd.dtype)
        C, inner = channel_view(xd, 1, a.numel())
        out = torch.empty_like(xd)
        _ext().prelu_forward(xd, a, out, C, inner)
        ctx.save_for_backward(xd, a)
        ctx.slope_dtype, ctx.slope_shape = slope.dtype, slope.shape
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        x, a = ctx.saved_tensors
        g = like(g, x)
        C, inner = channel_view(x, 1, a.numel())
        grad_x = torch.empty_like(x)
        dslope = _ext().prelu_backward(g, x, a, grad_x, C, inner)
        return grad_x, _as_grad(dslope, ctx.slope_dtype, ctx.slope_shape)


class _BiasActivation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, bias: torch.Tensor, kind: int, p: float, axis: int,
                inplace: bool) -> torch.Tensor:
        if not output_derivable(kind, p):
            raise ValueError("the fused bias + activation needs ReLU's negative_slope >= 0 "
                             "or ELU's alpha >= 0")
        xd = dense(x)
        inplace = inplace and xd is x
        b = _as_param(bias, xd.dtype)
        C, inner = channel_view(xd, axis, b.numel())
        out = x if inplace else torch.empty_like(xd)
        _ext().bias_act_forward(xd, b, out, C, inner, kind, p)
        if inplace:
            ctx.mark_dirty(x)
        ctx.save_for_backward(out, b)
        ctx.kind, ctx.p, ctx.axis = kind, p, axis
        ctx.bias_dtype, ctx.bias_shape = bias.dtype, bias.shape
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        y, b = ctx.saved_tensors
        g = like(g, y)
        C, inner = channel_view(y, ctx.axis, b.numel())
        grad_x = torch.empty_like(y)
        dbias = _ext().bias_act_backward(g, y, b, grad_x, C, inner, ctx.kind, ctx.p)
        return grad_x, _as_grad(dbias, ctx.bias_dtype, ctx.bias_shape), None, None, None, None


class _BiasAdd(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        b = _as_param(bias, y.dtype)
        y.add_(_on_channels(b, y.dim()))
        ctx.mark_dirty(y)
        ctx.C, ctx.inner = b.numel(), max(1, math.prod(y.shape[2:]))
        ctx.bias_dtype, ctx.bias_shape = bias.dtype, bias.shape
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        dbias = _ext().bias_grad(g if g.is_contiguous() else g.contiguous(), ctx.C, ctx.inner)
        return g, _as_grad(dbias, ctx.bias_dtype, ctx.bias_shape)


class _BatchNormReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, gamma: torch.Tensor | None, beta: torch.Tensor | None,
                residual: torch.Tensor | None, mean_sum: torch.Tensor, var_sum: torch.Tensor,
                count: torch.Tensor, eps: float, maf: float, p: float) -> torch.Tensor:
        y = torch.empty_like(x)
        g = None if gamma is None else gamma.detach()
        b = None if beta is None else beta.detach()
        coef = _ext().bn_relu_forward(x, g, b, residual, y, mean_sum, var_sum, count, eps, maf,
                                      p)
        ctx.save_for_backward(x, coef, residual)
        ctx.p, ctx.affine = p, gamma is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        x, coef, residual = ctx.saved_tensors
        dx = torch.empty_like(x)
        dr = None if residual is None else torch.empty_like(x)
        grad = _ext().bn_relu_backward(like(g, x), x, residual, coef, dx, dr, ctx.p)
        dgamma, dbeta = (grad[0], grad[1]) if ctx.affine else (None, None)
        return dx, dgamma, dbeta, dr, None, None, None, None, None, None


def batchnorm_relu_fits(x: torch.Tensor, *params: torch.Tensor | None,
                        residual: torch.Tensor | None = None) -> bool:
    """Whether :func:`batchnorm_relu` takes x: float32, float16 or bfloat16 on a GPU with the
    channel its fastest axis (an (N, C) matrix, channels_last), at least 2 values a channel,
    every parameter and running sum a float32 tensor on x's device, and the residual (if
    any) of x's shape, dtype, device and strides."""
    if not x.is_cuda or x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        return False
    layout = _CHANNEL_LAST.get(x.dim())
    if layout is None or not x.is_contiguous(memory_format=layout):
        return False
    if x.shape[1] != 1 and x.stride(1) != 1:   # size-1 axes make both layouts match
        return False
    if x.numel() < 2 * x.shape[1]:
        return False
    if residual is not None and (residual.dtype != x.dtype or residual.device != x.device
                                 or residual.shape != x.shape
                                 or residual.stride() != x.stride()):
        return False
    return all(t is None or (t.dtype == torch.float32 and t.device == x.device) for t in params)


def batchnorm_relu(x: torch.Tensor, gamma: torch.Tensor | None, beta: torch.Tensor | None,
                   mean_sum: torch.Tensor, var_sum: torch.Tensor, count: torch.Tensor,
                   eps: float, maf: float, p: float = 0.0,
                   residual: torch.Tensor | None = None) -> torch.Tensor:
    """Caffe's training BatchNorm (batch statistics over every axis but 1), the folded Scale's
    ``gamma`` and ``beta`` (both or neither), a ``residual`` added after it (the Eltwise SUM
    of a residual block) and a ReLU with negative_slope ``p`` (1: no activation), in three
    passes each way (csrc/batchnorm.cu); x must pass :func:`batchnorm_relu_fits`. The running
    sums are updated in place as BatchNorm's own path does: s = maf * s + batch (the variance
    unbiased), count = maf * count + 1. The backward gives dx, dgamma, dbeta and the
    residual's gradient."""
    return _BatchNormReLU.apply(x, gamma, beta, residual, mean_sum, var_sum, count,
                                float(eps), float(maf), float(p))


def activation(x: torch.Tensor, kind: int, p: float = 0.0, inplace: bool = False) -> torch.Tensor:
    """ReLU (p = negative_slope), ELU (p = alpha), Sigmoid or TanH through the CUDA kernels."""
    return _Activation.apply(x, kind, float(p), inplace)


def prelu(x: torch.Tensor, slope: torch.Tensor) -> torch.Tensor:
    """PReLU over axis 1 with C slopes, or one shared slope."""
    if x.dim() < 2 and slope.numel() > 1:
        raise ValueError(f"PReLU with {slope.numel()} slopes needs an input with a channel axis")
    if slope.numel() > 1 and x.shape[1] != slope.numel():
        raise ValueError(f"PReLU has {slope.numel()} slopes but the input has {x.shape[1]} "
                         "channels")
    return _PReLU.apply(x, slope)


def bias_activation(x: torch.Tensor, bias: torch.Tensor, kind: int, p: float = 0.0,
                    axis: int = 1, inplace: bool = False) -> torch.Tensor:
    """activation(x + bias along ``axis``) in one pass; backward gives dx and dbias."""
    if x.shape[axis] != bias.numel():
        raise ValueError(f"the bias has {bias.numel()} values but axis {axis} of the input has "
                         f"{x.shape[axis]}")
    if memory_format(x) is not torch.contiguous_format and axis != 1:
        x = x.contiguous()
    return _BiasActivation.apply(x, bias, kind, float(p), axis, inplace)


def bias_add_fits(y: torch.Tensor, bias: torch.Tensor) -> bool:
    """Whether :func:`bias_add` takes y: a contiguous (channel-first) float32, float16 or
    bfloat16 CUDA tensor of at least 2 axes with ``bias.numel()`` channels on axis 1. A
    channels_last output is left to PyTorch, whose reduction over its rows is fast."""
    return (y.is_cuda and y.dtype in (torch.float32, torch.float16, torch.bfloat16)
            and y.dim() >= 2 and y.is_contiguous() and y.shape[1] == bias.numel()
            and bias.device == y.device)


def _on_channels(bias: torch.Tensor, dims: int) -> torch.Tensor:
    """A (C,) bias viewed to broadcast along axis 1 of a tensor of ``dims`` axes."""
    return bias.view(1, -1, *([1] * (dims - 2)))


def bias_add(y: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """y + bias along axis 1, in place on y (a producer's fresh output, which its backward does
    not read). Where y passes :func:`bias_add_fits` the backward passes the gradient through
    and sums it to the bias gradient in one kernel (csrc/bias_grad.cu), the same bits on every
    run; elsewhere it is PyTorch's in-place add."""
    if not bias_add_fits(y, bias):
        return y.add_(_on_channels(bias, y.dim()))
    return _BiasAdd.apply(y, bias)


class _MaxPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int],
                pad: tuple[int, int], out: tuple[int, int]) -> torch.Tensor:
        y, offsets = _ext().max_pool_forward(x, *kernel, *stride, *pad, *out)
        ctx.save_for_backward(offsets)
        ctx.window = (*x.shape[2:], *kernel, *stride, *pad)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor):
        (offsets,) = ctx.saved_tensors
        g = g.contiguous(memory_format=torch.channels_last)
        if g.data_ptr() % 16:   # a view that starts inside a 16-byte pack
            g = g.clone(memory_format=torch.channels_last)
        return _ext().max_pool_backward(g, offsets, *ctx.window), None, None, None, None


MAX_POOL_WINDOW = 255
"""The most elements a window of :func:`max_pool` may hold (its argmax is kept in a byte)."""


def max_pool_fits(x: torch.Tensor, kernel: tuple[int, int]) -> bool:
    """Whether :func:`max_pool` takes x: a channels_last 4-D float32, float16 or bfloat16 CUDA
    tensor whose channels fill whole 16-byte packs (a multiple of 4 in float32, of 8 in the
    half types) and that starts on a 16-byte boundary, a window of at most
    :data:`MAX_POOL_WINDOW` elements."""
    if not x.is_cuda or x.dim() != 4 or x.dtype not in (torch.float32, torch.float16,
                                                          torch.bfloat16):
        return False
    if x.shape[1] % (16 // x.element_size()) or kernel[0] * kernel[1] > MAX_POOL_WINDOW:
        return False
    return (x.is_contiguous(memory_format=torch.channels_last) and x.stride(1) == 1
            and x.data_ptr() % 16 == 0)


def max_pool(x: torch.Tensor, kernel: tuple[int, int], stride: tuple[int, int],
             pad: tuple[int, int], out: tuple[int, int]) -> torch.Tensor:
    """``F.max_pool2d(x, kernel, stride, pad)`` with the output size ``out`` (PyTorch's, floor or
    ceil), bit for bit, by csrc/max_pool.cu: each output's argmax kept as a byte (its offset in
    the window) instead of PyTorch's 64-bit index, and the backward a gather over the windows
    that hold each input. x must pass :func:`max_pool_fits`; the output and the input's gradient
    are channels_last."""
    return _MaxPool.apply(x, tuple(kernel), tuple(stride), tuple(pad), tuple(out))


def crop_transform(records: torch.Tensor, where: torch.Tensor, mean: torch.Tensor | None,
                   scale: float, reverse: bool, out: torch.Tensor) -> torch.Tensor:
    """Caffe's transform of whole records in one kernel (csrc/transform.cu): ``out`` (B, C, h,
    w) float32 = (the (h, w) window of each record (B, C, H, W; uint8 or float32) at its row
    (h0, w0, flip) of ``where`` ((B, 3) int32), mirrored where flip is set, its channels
    reversed with ``reverse``, minus ``mean`` (C values, or C x H x W read at the source
    pixel)) times ``scale``. Returns ``out``."""
    _ext().crop_transform(records, where, mean, scale, reverse, out)
    return out


def cropped_transform(crops: torch.Tensor, where: torch.Tensor, mean: torch.Tensor | None,
                      scale: float, flip_pixels: bool, out: torch.Tensor) -> torch.Tensor:
    """Caffe's transform of records already cropped, in one kernel (csrc/transform.cu): ``out``
    (B, C, h, w) float32 = (each crop (B, C, h, w; uint8 or float32), mirrored where its flip in
    ``where`` ((B, 3) int32 rows of (h0, w0, flip)) is set and ``flip_pixels`` is, minus
    ``mean`` (C values, or C x MH x MW read where the crop's pixel lay in its record: at
    (h0 + y, w0 + x), mirrored with the flip)) times ``scale``. Returns ``out``."""
    _ext().cropped_transform(crops, where, mean, scale, flip_pixels, out)
    return out


def softmax_loss(x: torch.Tensor, label: torch.Tensor, seen: torch.Tensor | None,
                 work: torch.Tensor, done: torch.Tensor, ignore: int | None, divisor: float,
                 count_valid: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Caffe's SoftmaxWithLoss on (N, C) float32 scores, one kernel each way
    (csrc/softmax_loss.cu) inside a C++ autograd Function (no Python in the backward): the
    loss -log(max(p_label, FLT_MIN)) summed over the rows whose label is not ``ignore`` and
    divided by ``divisor`` (or, with ``count_valid``, by the number of those rows, at least
    1); the gradient (p - onehot) * top diff / divisor. Labels (int64) outside [0, C) are
    clamped for the read and folded into ``seen`` = [min, max] (int64, on the device) when it
    is given. ``work`` holds 2N floats and ``done`` one int32 zero (the kernel leaves it
    zero): a layer keeps them between calls.

    Returns (loss, prob): the scalar loss and the probabilities (no gradient flows back
    through them, as in Caffe, whose backward reads the loss top alone)."""
    loss, prob = _ext().softmax_loss(x, label, seen, work, done,
                                     0 if ignore is None else ignore, ignore is not None,
                                     divisor, count_valid)
    return loss, prob


def sgd_update(weights: list[torch.Tensor], grads: list[torch.Tensor],
               history: list[torch.Tensor], group: list[int], rates: list[float] | torch.Tensor,
               decays: list[float], momentum: float, grad_scale: float, l1: bool) -> bool:
    """Caffe's SGD update of every parameter in place, in one launch (a few for a large net;
    csrc/sgd_update.cu): per element g = g * grad_scale (unless 1), g += decay * w (or
    * sign(w) with ``l1``), h = momentum * h + rate * g, w -= h, with parameter i's rate and
    decay those of its ``group[i]``. ``rates`` are host floats, or a float32 CUDA tensor of
    one rate per group (read when the kernel runs: what a CUDA graph replays). The numbers
    are the op-by-op pipeline's (caffe_py/solver/rules.py), bit for bit.

    Returns False, having written nothing, when a tensor is not float32 on the weights' GPU or
    a gradient or history does not share its weight's dense layout (the caller then takes the
    op-by-op path)."""
    on_device = isinstance(rates, torch.Tensor)
    return _ext().sgd_update(weights, grads, history, group, [] if on_device else rates,
                             rates if on_device else None, decays, momentum, grad_scale, l1)
