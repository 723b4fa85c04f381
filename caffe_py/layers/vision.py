"""Layer family: vision (Convolution, Deconvolution, Pooling, LRN).

Each forward is one torch op where PyTorch's rule is Caffe's. Where they differ (Pooling's
output rounding in a few corner cases, pad larger than half the kernel) the input is padded
explicitly so that the same op computes Caffe's numbers; ``caffe_pool_size`` is Caffe's rule.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..kernels import build, functions
from ..spec.layer_params.vision import ConvolutionParameter, PoolingParameter
from .base import Layer, Shape, canonical_axis
from .common import given, same_shapes
from .registry import register

FLT_MAX = 3.4028234663852886e38
FLT_MIN = 1.1754943508222875e-38


# --- Convolution and Deconvolution ----------------------------------------------------------
def _per_axis(layer: Layer, p: ConvolutionParameter, name: str, n: int,
              default: int | None) -> tuple[int, ...]:
    """Caffe's per-spatial-axis value of ``name`` (kernel_size, pad, stride or dilation)."""
    stem = name.removesuffix("_size")
    h, w = f"{stem}_h", f"{stem}_w"
    values = list(getattr(p, name))
    if name != "dilation" and (given(p, h) or given(p, w)):
        if n != 2:
            raise layer.fail(f"{h} and {w} apply to 2-D convolution only; this bottom has "
                             f"{n} spatial axes", f"use {name}")
        if values:
            raise layer.fail(f"both {name} and {h}/{w} are set", "keep one of them")
        if not (given(p, h) and given(p, w)):
            raise layer.fail(f"only one of {h} and {w} is set", f"set both, or use {name}")
        return (getattr(p, h), getattr(p, w))
    if not values:
        if default is None:
            raise layer.fail("no kernel size is set", "set kernel_size (or kernel_h and kernel_w)")
        return (default,) * n
    if len(values) not in (1, n):
        raise layer.fail(f"{name} is given {len(values)} times for {n} spatial axes",
                         "give it once, or once per spatial axis")
    return tuple(values) * n if len(values) == 1 else tuple(values)


def conv_out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    """Convolution's output length (floor)."""
    return (size + 2 * p - (d * (k - 1) + 1)) // s + 1


def deconv_out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    """Deconvolution's output length: the input length of the matching convolution."""
    return s * (size - 1) + d * (k - 1) + 1 - 2 * p


BIAS_GRAD_KERNEL = "bias_grad_kernel"
"""The net option that lets a GPU Convolution's bias gradient be summed by the kernel of
csrc/bias_grad.cu (default true)."""


MAX_POOL_KERNEL = "max_pool_kernel"
"""The net option that lets a GPU MAX Pooling on a channels_last input run the kernels of
csrc/max_pool.cu (default true; false keeps PyTorch's kernels, with the same numbers)."""


@register("Convolution")
class Convolution(Layer):
    """N-d convolution (1 to 3 spatial axes) with Caffe's weight (O, C/group, *kernel).

    Several bottoms share the weights and give one top each, as in Caffe. On a GPU, a bias
    on a channel-first output (NCHW) is added after the convolution by
    :func:`~caffe_py.kernels.functions.bias_add`, whose backward sums the bias gradient in one
    kernel; PyTorch's reduction over the batch and spatial axes of such an output keeps few
    blocks busy (LeNet's conv2 on an H200: 19 us). The net option ``bias_grad_kernel: false``
    leaves the bias to the convolution op, as does a CPU net, a channels_last output, float64,
    torch.compile or a forward without gradients.
    """

    bottoms = (1, None)
    tops = (1, None)
    _ops: tuple[Callable[..., torch.Tensor], ...] = (F.conv1d, F.conv2d, F.conv3d)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        if len(bottom_shapes) != len(self.spec.top):
            raise self.fail(f"has {len(bottom_shapes)} bottoms but {len(self.spec.top)} tops",
                            "name one top per bottom")
        same_shapes(self, bottom_shapes, f"all bottoms of a {self.type_name} share its weights "
                                         "and need the same shape")
        shape = bottom_shapes[0]
        self.axis = canonical_axis(self, p.axis, len(shape))
        n = len(shape) - self.axis - 1
        if not 1 <= n <= 3:
            raise self.bottom_error(0, f"has shape {list(shape)}: {n} spatial axes after the "
                                       f"channel axis {self.axis}",
                                    "1 to 3 spatial axes are supported")
        self.kernel = _per_axis(self, p, "kernel_size", n, None)
        self.stride = _per_axis(self, p, "stride", n, 1)
        self.pad = _per_axis(self, p, "pad", n, 0)
        self.dilation = _per_axis(self, p, "dilation", n, 1)
        for what, values in (("kernel size", self.kernel), ("stride", self.stride),
                             ("dilation", self.dilation)):
            if min(values) < 1:
                raise self.fail(f"{what} {list(values)} has a zero", f"every {what} is >= 1")
        self._check_groups(p, shape[self.axis])
        self.group = p.group
        self.has_bias = p.bias_term
        self.bias_kernel = (p.bias_term and torch.device(self.ctx.device).type == "cuda"
                            and bool(self.ctx.options.get(BIAS_GRAD_KERNEL, True))
                            and build.available())
        """Whether a forward with gradients may add the bias through functions.bias_add."""
        self.add_blob("weight", self._weight_shape(p.num_output, shape[self.axis]),
                      p.weight_filler)
        if p.bias_term:
            self.add_blob("bias", (p.num_output,), p.bias_filler)
        self._op = self._ops[n - 1]
        out = self._spatial_out(shape[self.axis + 1:])
        return [shape[:self.axis] + (p.num_output,) + out] * len(bottom_shapes)

    def _check_groups(self, p: ConvolutionParameter, channels: int) -> None:
        if p.num_output < 1:
            raise self.fail("num_output is not set", "set convolution_param.num_output")
        if channels % p.group:
            raise self.bottom_error(0, f"has {channels} channels, which group {p.group} does "
                                       f"not divide", "make channels a multiple of group")
        if p.num_output % p.group:
            raise self.fail(f"num_output {p.num_output} is not a multiple of group {p.group}",
                            "make num_output a multiple of group")

    def _weight_shape(self, num_output: int, channels: int) -> Shape:
        return (num_output, channels // self.group) + self.kernel

    def _spatial_out(self, sizes: Shape) -> Shape:
        out = tuple(conv_out_size(*a) for a in
                    zip(sizes, self.kernel, self.stride, self.pad, self.dilation, strict=True))
        if min(out) < 1:
            eff = [d * (k - 1) + 1 for k, d in zip(self.kernel, self.dilation, strict=True)]
            padded = [s + 2 * p for s, p in zip(sizes, self.pad, strict=True)]
            raise self.bottom_error(0, f"of spatial size {list(sizes)} padded to {padded} is "
                                       f"smaller than the (dilated) kernel {eff}",
                                    "use a smaller kernel_size or dilation, or more pad")
        return out

    def _conv(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self._op(x, self.weight, bias, self._stride_for(x), self.pad, self.dilation,
                        self.group)

    def _stride_for(self, x: torch.Tensor) -> tuple[int, ...]:
        """The stride, each axis at most one past the span the kernel slides over: a stride
        longer than that gives one output either way (Caffe's formula), and torch's CPU
        convolution crashes the process on such strides (100,000 on a 12 x 12 input)."""
        spans = (size + 2 * p - d * (k - 1) for size, p, d, k in
                 zip(x.shape[2:], self.pad, self.dilation, self.kernel, strict=True))
        return tuple(min(s, max(span, 0) + 1) for s, span in zip(self.stride, spans,
                                                                  strict=True))

    def forward(self, *bottoms: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        tops = tuple(self._convolve(x) for x in bottoms)
        return tops[0] if len(tops) == 1 else tops

    def _convolve(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.has_bias else None
        if self.axis == 1:
            if bias is not None and self.bias_kernel and bias.requires_grad \
                    and torch.is_grad_enabled() and not torch.compiler.is_compiling():
                return functions.bias_add(self._conv(x, None), bias)
            return self._conv(x, bias)
        lead = x.shape[:self.axis]  # the axes before the channel axis act as the batch
        y = self._conv(x.reshape(-1, *x.shape[self.axis:]), bias)
        return y.reshape(*lead, *y.shape[1:])


@register("Deconvolution")
class Deconvolution(Convolution):
    """Transposed convolution; Caffe's weight (C, num_output/group, *kernel) is torch's too."""

    _ops = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)

    def _weight_shape(self, num_output: int, channels: int) -> Shape:
        return (channels, num_output // self.group) + self.kernel

    def _spatial_out(self, sizes: Shape) -> Shape:
        out = tuple(deconv_out_size(*a) for a in
                    zip(sizes, self.kernel, self.stride, self.pad, self.dilation, strict=True))
        if min(out) < 1:
            raise self.bottom_error(0, f"of spatial size {list(sizes)} gives an output of "
                                       f"{list(out)} with pad {list(self.pad)}",
                                    "use less pad")
        return out

    def _conv(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # an axis of one input position: its stride moves nothing
        stride = tuple(1 if size == 1 else s for size, s in zip(x.shape[2:], self.stride,
                                                                 strict=True))
        return self._op(x, self.weight, bias, stride, self.pad, 0, self.group, self.dilation)


# --- Pooling --------------------------------------------------------------------------------
def caffe_pool_size(size: int, k: int, s: int, p: int, ceil: bool = True) -> int:
    """Caffe's pooled length: (size + 2p - k) / s rounded up (round_mode CEIL) or down, plus
    one; with padding, no window may start in the right padding. A kernel larger than the
    padded input gives a negative numerator, rounded the same way (a 1 x 1 input under a 2 x 2
    stride-2 window pools to 1 x 1)."""
    span = size + 2 * p - k
    out = (-(-span // s) if ceil else span // s) + 1
    if p > 0 and (out - 1) * s >= size + p:
        out -= 1
    return out


def torch_pool_size(size: int, k: int, s: int, p: int, ceil: bool = True) -> int:
    """PyTorch's length (its last-window rule applies in ceil mode, with or without padding)."""
    span = size + 2 * p - k
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


@dataclass(frozen=True)
class _PoolPlan:
    """How one input size is pooled: Caffe's output size and whether torch's op gives it."""

    out: tuple[int, int]
    direct: bool
    pads: tuple[int, int, int, int]  # F.pad's (left, right, top, bottom); right/bottom may crop
    stride: tuple[int, int] = (1, 1)
    """The stride each axis runs with: at most the padded input + 1, which gives the same
    windows (Caffe's and torch's formulas alike) and keeps torch's int arguments small."""
    live: tuple[int, int] = (0, 0)
    """Windows per axis that start inside the padded input's left pad and the input; the rest
    (a stride longer than the input) lie wholly in the right padding and are empty: -FLT_MAX
    for MAX, 0 for AVE and STOCHASTIC, as Caffe's loops give them. Only the live windows are
    computed, so a stride of 10^7 pads nothing."""

    @property
    def empty(self) -> tuple[int, int]:
        return (self.out[0] - self.live[0], self.out[1] - self.live[1])


@register("Pooling")
class Pooling(Layer):
    """MAX, AVE and STOCHASTIC pooling over (N, C, H, W) with Caffe's rounding.

    A second top (MAX only) is Caffe's argmax mask: the flat index h * W + w in the input plane.
    MAX pooling of a channels_last input on a GPU (a net in ``memory_format`` CHANNELS_LAST, or
    AUTO's choice) runs :func:`~caffe_py.kernels.functions.max_pool` where Caffe's window is
    PyTorch's and the input fits: PyTorch's values and gradients bit for bit, with one byte of
    argmax an output instead of eight, 3.5 times as fast on ResNet-50's pool1 (docs/kernels.md,
    "Max pooling"). A mask top, torch.compile, an input that does not fit or the net option
    ``max_pool_kernel: false`` leave it to PyTorch.
    """

    tops = (1, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        shape = bottom_shapes[0]
        self.require_axes(0, shape, 4)
        self.method = p.pool
        self.global_pooling = p.global_pooling
        self.ceil = p.round_mode == "CEIL"
        if len(self.spec.top) == 2 and p.pool != "MAX":
            raise self.fail(f"{p.pool} pooling has one top; only MAX gives a second top (the "
                            "argmax mask)", "remove the second top")
        if p.global_pooling:
            self._check_global(p)
            self.kernel, self.stride, self.pad = shape[2:], (1, 1), (0, 0)
        else:
            self.kernel = self._pair(p, "kernel_size", None)
            self.stride = self._pair(p, "stride", p.stride)
            self.pad = self._pair(p, "pad", p.pad)
            self._check_window(p, shape)
        self._plans: dict[tuple[int, int], _PoolPlan] = {}
        self.max_kernel = (p.pool == "MAX" and len(self.spec.top) == 1
                           and torch.device(self.ctx.device).type == "cuda"
                           and bool(self.ctx.options.get(MAX_POOL_KERNEL, True))
                           and build.available())
        """Whether MAX pooling may run csrc/max_pool.cu (functions.max_pool) where its input
        fits."""
        out = self._plan(shape[2], shape[3]).out
        return [shape[:2] + out] * len(self.spec.top)

    def _check_global(self, p: PoolingParameter) -> None:
        if any(given(p, k) for k in ("kernel_size", "kernel_h", "kernel_w")):
            raise self.fail("global_pooling takes the whole input as the window; a kernel size "
                            "is also set", "remove kernel_size/kernel_h/kernel_w")
        if any(given(p, k) for k in ("pad", "pad_h", "pad_w", "stride", "stride_h",
                                     "stride_w")):
            raise self.fail("global_pooling needs pad 0 and stride 1",
                            "remove pad and stride")

    def _pair(self, p: PoolingParameter, name: str, default: int | None) -> tuple[int, int]:
        stem = name.removesuffix("_size")
        h, w = f"{stem}_h", f"{stem}_w"
        if given(p, h) or given(p, w):
            if given(p, name):
                raise self.fail(f"both {name} and {h}/{w} are set", "keep one of them")
            if not (given(p, h) and given(p, w)):
                raise self.fail(f"only one of {h} and {w} is set", f"set both, or use {name}")
            return getattr(p, h), getattr(p, w)
        if default is None and not given(p, name):
            raise self.fail("no kernel size is set",
                            "set kernel_size (or kernel_h and kernel_w), or global_pooling")
        value = getattr(p, name)
        return value, value

    def _check_window(self, p: PoolingParameter, shape: Shape) -> None:
        if min(self.kernel) < 1 or min(self.stride) < 1:
            raise self.fail(f"kernel {list(self.kernel)} and stride {list(self.stride)} must be "
                            ">= 1", "set positive sizes")
        if max(self.pad) > 0 and p.pool == "STOCHASTIC":
            raise self.fail("STOCHASTIC pooling takes no padding",
                            "remove pad, or use MAX or AVE")
        if any(pd >= k for pd, k in zip(self.pad, self.kernel, strict=True)):
            raise self.fail(f"pad {list(self.pad)} must be smaller than the kernel "
                            f"{list(self.kernel)}", "use less pad")
        out = [caffe_pool_size(n, k, s, pd, self.ceil) for n, k, s, pd in
               zip(shape[2:], self.kernel, self.stride, self.pad, strict=True)]
        if min(out) < 1:
            raise self.bottom_error(0, f"of spatial size {list(shape[2:])} pools to {out} "
                                       f"under kernel {list(self.kernel)}, stride "
                                       f"{list(self.stride)}, pad {list(self.pad)} and "
                                       f"round_mode {p.round_mode}",
                                    "use a smaller kernel_size, more pad, or a larger input")

    def _plan(self, height: int, width: int) -> _PoolPlan:
        plan = self._plans.get((height, width))
        if plan is None:
            plan = self._plans[(height, width)] = self._make_plan(height, width)
        return plan

    def _make_plan(self, height: int, width: int) -> _PoolPlan:
        sizes = (height, width)
        kernel = sizes if self.global_pooling else self.kernel
        stride = tuple(min(s, n + 2 * p + 1) for n, s, p in zip(sizes, self.stride, self.pad,
                                                                strict=True))
        geometry = list(zip(sizes, kernel, stride, self.pad, strict=True))
        out = (caffe_pool_size(*geometry[0], self.ceil), caffe_pool_size(*geometry[1], self.ceil))
        # torch's op also refuses pad > kernel / 2 and a kernel larger than the padded input
        direct = all(caffe_pool_size(*g, self.ceil) == torch_pool_size(*g, self.ceil)
                     and g[3] <= g[1] // 2 and g[1] <= g[0] + 2 * g[3] for g in geometry)
        # Explicit padding: the input spans exactly the live windows, (live - 1) * s + k per
        # axis; a window starting at or past p + n holds no input
        live = tuple(min(o, -(-(p + n) // s)) for o, (n, k, s, p) in
                     zip(out, geometry, strict=True))
        ends = [(o - 1) * s + k - n - p for o, (n, k, s, p) in zip(live, geometry, strict=True)]
        pads = (self.pad[1], ends[1], self.pad[0], ends[0])
        return _PoolPlan(out=out, direct=direct, pads=pads, stride=(stride[0], stride[1]),
                         live=(live[0], live[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        plan = self._plan(x.shape[2], x.shape[3])
        kernel = tuple(x.shape[2:]) if self.global_pooling else self.kernel
        if self.method == "MAX":
            return self._max(x, plan, kernel)
        if self.method == "AVE":
            return self._ave(x, plan, kernel)
        if self.phase == "TRAIN":
            return self._stochastic_train(x, plan, kernel)
        return self._stochastic_test(x, plan, kernel)

    def _max(self, x: torch.Tensor, plan: _PoolPlan, kernel: Any) -> Any:
        want_mask = len(self.top_shapes) == 2
        # torch's stubs type return_indices only as Literal[True] / Literal[False], not bool
        if plan.direct:
            if self.max_kernel and functions.max_pool_fits(x, kernel) \
                    and not torch.compiler.is_compiling():
                return functions.max_pool(x, kernel, plan.stride, self.pad, plan.out)
            y = F.max_pool2d(x, kernel, plan.stride, self.pad, ceil_mode=self.ceil,  # type: ignore[call-overload]
                             return_indices=want_mask)
            if not want_mask:
                return y
            return y[0], y[1].to(x.dtype)
        # Caffe starts each window at -FLT_MAX, so padding with it reproduces empty windows too.
        xp = F.pad(x, plan.pads, value=-FLT_MAX)
        y = F.max_pool2d(xp, kernel, plan.stride,  # type: ignore[call-overload]
                         return_indices=want_mask)
        if not want_mask:
            return _with_empty(y, plan, -FLT_MAX)
        y, index = y
        index = self._unpad_index(index, xp.shape[3], x.shape[2], x.shape[3]).to(x.dtype)
        return _with_empty(y, plan, -FLT_MAX), _with_empty(index, plan, -1)

    def _unpad_index(self, index: torch.Tensor, padded_w: int, h: int, w: int) -> torch.Tensor:
        """Flat indices into the padded plane -> h * W + w in the input, -1 in the padding."""
        row = index // padded_w - self.pad[0]
        col = index % padded_w - self.pad[1]
        inside = (row >= 0) & (row < h) & (col >= 0) & (col < w)
        return torch.where(inside, row * w + col, torch.full_like(index, -1))

    def _ave(self, x: torch.Tensor, plan: _PoolPlan, kernel: Any) -> torch.Tensor:
        if self.global_pooling:
            return x.mean((2, 3), keepdim=True)
        if plan.direct:  # torch's divisor with count_include_pad is Caffe's: clipped to H + pad
            return F.avg_pool2d(x, kernel, plan.stride, self.pad, ceil_mode=self.ceil,
                                count_include_pad=True)
        sums = F.avg_pool2d(F.pad(x, plan.pads), kernel, plan.stride, divisor_override=1)
        return _with_empty(sums, plan, 0.0) / self._divisor(x, plan)

    def _divisor(self, x: torch.Tensor, plan: _PoolPlan) -> torch.Tensor:
        """Caffe's AVE divisor per output (H_out, W_out): the window clipped to H + pad."""
        sizes = []
        for n, o, k, s, p in zip(x.shape[2:], plan.out, self.kernel, plan.stride, self.pad,
                                 strict=True):
            start = torch.arange(o, device=x.device) * s - p
            end = torch.clamp(start + k, max=n + p)
            sizes.append((end - start).clamp(min=1))  # Caffe divides 0 by 0 in an empty window
        return (sizes[0][:, None] * sizes[1][None, :]).to(x.dtype)

    def _stochastic_train(self, x: torch.Tensor, plan: _PoolPlan, kernel: Any) -> torch.Tensor:
        # Sample one element per window with probability value / window sum (Caffe's cumulative
        # scan: the first element whose running sum reaches u * sum, u ~ U[0, 1)).
        # (Tensor.unfold gives strided views; F.unfold loops over the batch on the CPU.)
        xp = F.pad(x, plan.pads)
        windows = xp.unfold(2, kernel[0], plan.stride[0]).unfold(3, kernel[1], plan.stride[1])
        windows = windows.reshape(*x.shape[:2], *plan.live, -1)  # (N, C, oh, ow, kh*kw)
        running = windows.cumsum(-1)
        threshold = torch.rand_like(running[..., :1]) * running[..., -1:]
        pick = (running >= threshold).to(torch.uint8).argmax(-1, keepdim=True)  # first reached
        return _with_empty(windows.gather(-1, pick).squeeze(-1), plan, 0.0)

    def _stochastic_test(self, x: torch.Tensor, plan: _PoolPlan, kernel: Any) -> torch.Tensor:
        # The probability-weighted mean: sum(x^2) / sum(x), with Caffe's FLT_MIN against 0/0.
        both = F.pad(torch.cat([x * x, x], 1), plan.pads)
        sums = _with_empty(F.avg_pool2d(both, kernel, plan.stride, divisor_override=1), plan,
                           0.0)
        squares, values = sums.split(x.shape[1], 1)
        return squares / (values + FLT_MIN)


def _with_empty(y: torch.Tensor, plan: _PoolPlan, value: float) -> torch.Tensor:
    """``y`` (N, C, live h, live w) with the plan's empty windows appended as ``value``."""
    below, right = plan.empty
    if not below and not right:
        return y
    return F.pad(y, (0, right, 0, below), value=value)


# --- LRN ------------------------------------------------------------------------------------
@register("LRN")
class LRN(Layer):
    """b = a * (k + alpha/n * sum of a^2 over n channels)^-beta, or the WITHIN_CHANNEL form
    b = a * (1 + alpha * mean of a^2 over an n x n window, zero-padded)^-beta."""


    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        self.require_axes(0, bottom_shapes[0], 4)
        if p.local_size % 2 == 0:
            raise self.fail(f"local_size {p.local_size} is even; LRN needs an odd local_size",
                            f"use {p.local_size - 1} or {p.local_size + 1}")
        self.size, self.alpha, self.beta, self.k = p.local_size, p.alpha, p.beta, p.k
        self.across = p.norm_region == "ACROSS_CHANNELS"
        return [bottom_shapes[0]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.across:
            return F.local_response_norm(x, self.size, self.alpha, self.beta, self.k)
        # The window never passes H + pad here, so Caffe's divisor is always size^2.
        mean = F.avg_pool2d(x * x, self.size, 1, (self.size - 1) // 2, count_include_pad=True)
        return x * (1.0 + self.alpha * mean).pow(-self.beta)
