"""Layer family: normalization (BatchNorm, MVN) and the per-channel affine pair that follows
BatchNorm (Scale, Bias), as Caffe 1.0 defines them (batch_norm_layer.cpp, mvn_layer.cpp,
scale_layer.cpp, bias_layer.cpp).

Caffe's BatchNorm has no affine part: a Scale layer with ``bias_term: true`` follows it. Its
three blobs are running *sums*, not running means: ``mean_sum`` and ``var_sum`` (C) decay by
``moving_average_fraction`` and add the batch statistics, and ``count`` (1) decays the same way
and adds 1, so the global statistics are ``mean_sum / count`` and ``var_sum / count``.

Mixed precision: under bfloat16/float16 autocast a float32 blob would promote a low-precision
activation to float32 (and every following convolution would cast it back), so Scale and Bias
cast their operand to the activation's dtype; float32 and float64 runs compute exactly as
before. The fusion pass (caffe_py/passes.py) lets a BatchNorm apply the following
Scale's blobs inside its own normalisation (:meth:`BatchNorm.attach_affine`), and the in-place
ReLU after them (:meth:`BatchNorm.attach_relu`).

On a GPU, batch statistics run in caffe-py's BatchNorm kernels (csrc/batchnorm.cu: statistics,
normalisation, the folded Scale and ReLU and the running sums, three passes each way) when the
input's channel is its fastest axis (channels_last, or an (N, C) matrix) in float32, float16 or
bfloat16; anything else, and every net with the net option ``batchnorm_kernels: false``, runs
PyTorch's batch_norm, the kernels' test oracle.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..kernels import build, functions
from ..spec.layer_params.normalization import BatchNormParameter, BiasParameter, ScaleParameter
from ..spec.layer_params.shared import FillerParameter
from .base import Layer, Shape, canonical_axis
from .registry import register

_ONE = FillerParameter(type="constant", value=1.0)
BATCHNORM_KERNELS = "batchnorm_kernels"
"""The net option that keeps BatchNorm on PyTorch's batch_norm when false."""


@register("BatchNorm")
class BatchNorm(Layer):
    """y = (x - mean) / sqrt(var + eps) per channel (axis 1; a 1-axis blob is one channel).

    TRAIN (use_global_stats false) uses the batch mean and biased variance over N and the
    spatial axes and updates the running sums in place (the unbiased variance, m / (m - 1)
    with m values per channel, goes into ``var_sum``); a TEST net sharing the buffers sees the
    update. Global statistics divide the sums by ``count``; a zero count means "no statistics
    yet" and, as in Caffe, uses mean 0 and variance 0.
    """


    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        (shape,) = bottom_shapes
        if len(shape) < 1:
            raise self.bottom_error(0, "is a scalar; BatchNorm needs at least a batch axis")
        p: BatchNormParameter = self.param()
        self.use_global_stats = (self.phase == "TEST" if p.use_global_stats is None
                                 else p.use_global_stats)
        self.maf = p.moving_average_fraction
        self.eps = p.eps
        self.channels = shape[1] if len(shape) > 1 else 1
        self.add_blob("mean_sum", (self.channels,), learnable=False)
        self.add_blob("var_sum", (self.channels,), learnable=False)
        self.add_blob("count", (1,), learnable=False)
        self._affine: tuple[Any] | None = None
        self._relu: tuple[Any] | None = None
        self.deferred_to: str | None = None
        """The Eltwise that normalises this layer's input (fuse_batchnorm_eltwise), or None."""
        self.kernels_allowed = (torch.device(self.ctx.device).type == "cuda"
                                and bool(self.ctx.options.get(BATCHNORM_KERNELS, True))
                                and build.available())
        """Batch statistics run in the fused kernels (csrc/batchnorm.cu) where they take the
        input: a CUDA net, the net option ``batchnorm_kernels`` (default true), the
        extension built."""
        return [shape]

    def attach_affine(self, scale_layer: Any) -> None:
        """Apply ``scale_layer``'s (C,) scale and bias blobs in this layer's batch_norm call
        (the fusion pass calls this and makes the Scale an identity). The blobs stay the
        Scale's (same objects, same Caffe order) and are read at every forward, so weight
        sharing that re-points them is followed. Held in a tuple: not a submodule."""
        self._affine = (scale_layer,)

    def attach_relu(self, relu_layer: Any) -> None:
        """Apply ``relu_layer`` (a ReLU in place on this layer's top, after the folded Scale if
        there is one) here: in the fused kernels when they take the input; elsewhere by
        calling the ReLU's own activation on this layer's output, the same operations the
        unfused net runs. The fusion pass calls this and makes the ReLU an identity."""
        self._relu = (relu_layer,)

    @property
    def fused_relu(self) -> str | None:
        """The name of the ReLU folded into this one, or None."""
        return None if self._relu is None else self._relu[0].name

    @property
    def fused_scale(self) -> str | None:
        """The name of the Scale layer folded into this one, or None."""
        return None if self._affine is None else self._affine[0].name

    def _weight_bias(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        if self._affine is None:
            return None, None
        scale_layer = self._affine[0]
        return scale_layer.scale, scale_layer.bias

    def defer_to(self, eltwise_name: str) -> None:
        """Leave this layer's normalisation to the Eltwise named (the fusion pass
        ``fuse_batchnorm_eltwise``): this layer then passes its bottom through, and the Eltwise
        calls :meth:`normalize` or :meth:`normalize_sum` on it."""
        self.deferred_to = eltwise_name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.deferred_to is not None else self.normalize(x)

    def normalize_sum(self, x: torch.Tensor, residual: torch.Tensor,
                      slope: float) -> torch.Tensor | None:
        """relu_slope(this layer's output for x + residual) in the fused kernels (slope 1: no
        activation), or None where they do not take x and the residual."""
        return self._in_kernels(x, slope, residual)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """This layer's output for x (with the folded Scale and ReLU, if any)."""
        shape = x.shape
        if x.dim() == 1:
            x = x.view(-1, 1)  # (N,) is N values of one channel
        slope = self._relu[0].p if self._relu is not None else 1.0  # 1: no activation
        fused = self._in_kernels(x, slope)
        if fused is not None:
            return fused.view(shape)
        weight, bias = self._weight_bias()
        if self.use_global_stats:
            y = self._normalize_global(x, weight, bias)
        elif x.numel() // self.channels > 1 and self.eps > 0:
            y = self._normalize_batch(x, weight, bias)
        else:   # one value per channel, or eps 0 (Caffe's, which PyTorch refuses in training)
            y = self._normalize_plain(x, weight, bias)
        y = y.view(shape)
        return y if self._relu is None else self._relu[0].activate(y)

    def _in_kernels(self, x: torch.Tensor, slope: float,
                    residual: torch.Tensor | None = None) -> torch.Tensor | None:
        """relu_slope(this layer's output for x [+ residual]) in the fused kernels, or None
        unless they take it: batch statistics, the kernels allowed, a layout and dtype they
        stream (torch.compile traces the plain operations instead)."""
        if self.use_global_stats or not self.kernels_allowed or torch.compiler.is_compiling():
            return None
        weight, bias = self._weight_bias()
        if not functions.batchnorm_relu_fits(x, weight, bias, self.mean_sum, self.var_sum,
                                             self.count, residual=residual):
            return None
        return functions.batchnorm_relu(x, weight, bias, self.mean_sum, self.var_sum, self.count,
                                        self.eps, self.maf, slope, residual=residual)

    def _normalize_global(self, x: torch.Tensor, weight: torch.Tensor | None,
                          bias: torch.Tensor | None) -> torch.Tensor:
        # 1 / count, or 0 before any statistics were gathered (Caffe's scale_factor)
        inv = torch.where(self.count == 0, torch.zeros_like(self.count), self.count.reciprocal())
        return F.batch_norm(x, self.mean_sum * inv, self.var_sum * inv, weight, bias,
                            training=False, eps=self.eps)

    def _normalize_batch(self, x: torch.Tensor, weight: torch.Tensor | None,
                         bias: torch.Tensor | None) -> torch.Tensor:
        # With momentum 1 PyTorch writes the batch mean and the unbiased (m / (m - 1)) variance
        # into the two scratch vectors, so one fused kernel gives both the output and the
        # statistics that Caffe's update needs. One (2, C) allocation: one fill kernel.
        stat_dtype = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
        mean, var = torch.zeros(2, self.channels, dtype=stat_dtype, device=x.device)
        y = F.batch_norm(x, mean, var, weight, bias, training=True, momentum=1.0, eps=self.eps)
        self._update_stats(mean, var)
        return y

    def _normalize_plain(self, x: torch.Tensor, weight: torch.Tensor | None,
                         bias: torch.Tensor | None) -> torch.Tensor:
        # Caffe's arithmetic in plain ops, where PyTorch's batch_norm refuses: one value per
        # channel (N = 1, no spatial axes: variance 0, an output of 0 and, m / (m - 1)
        # undefined, a bias correction of 1), or eps 0.
        dims = [0] + list(range(2, x.dim()))
        m = x.numel() // self.channels
        mean = x.mean(dim=dims, keepdim=True)
        centred = x - mean
        var = centred.square().mean(dim=dims, keepdim=True)
        y = centred / torch.sqrt(var + self.eps)
        unbiased = var * (m / (m - 1)) if m > 1 else var
        self._update_stats(mean.detach().flatten(), unbiased.detach().flatten())
        if weight is not None and bias is not None:  # a fused Scale gives both
            trailing = x.dim() - 2
            y = torch.addcmul(trailing_view(as_dtype(bias, y), trailing), y,
                              trailing_view(as_dtype(weight, y), trailing))
        return y

    @torch.no_grad()
    def _update_stats(self, mean: torch.Tensor, unbiased_var: torch.Tensor) -> None:
        # sum = maf * sum + batch, for the three blobs: one multi-tensor multiply, then the
        # adds (the same float operations, in the same order, as one mul_/add_ per blob).
        sums = [self.count, self.mean_sum, self.var_sum]
        torch._foreach_mul_(sums, self.maf)
        self.count.add_(1.0)
        torch._foreach_add_(sums[1:], [mean.to(self.mean_sum.dtype),
                                       unbiased_var.to(self.var_sum.dtype)])

    def extra_repr(self) -> str:
        fused = f", fused scale '{self.fused_scale}'" if self._affine is not None else ""
        if self._relu is not None:
            fused += f", fused relu '{self.fused_relu}'"
        if self.deferred_to is not None:
            fused += f", applied by '{self.deferred_to}'"
        return f"{super().extra_repr()}{fused}"


def operand_shape(layer: Layer, bottom_shapes: list[Shape], axis: int,
                  num_axes: int) -> tuple[int, Shape]:
    """(axis, shape) of the scale or bias that broadcasts over bottom 0 from ``axis`` on.

    With two bottoms the second is the operand and must match bottom 0's axes from ``axis``;
    with one the learned blob spans ``num_axes`` axes (-1: all remaining).
    """
    shape = bottom_shapes[0]
    if len(bottom_shapes) == 2:
        other = bottom_shapes[1]
        if len(other) == 0:
            return 0, other
        axis = canonical_axis(layer, axis, len(shape))
        first = f"bottom '{layer.spec.bottom[0]}'"
        if axis + len(other) > len(shape):
            raise layer.bottom_error(
                1, f"has {len(other)} axes, which from axis {axis} extend past {first} of "
                   f"shape {list(shape)}", f"use an axis <= {len(shape) - len(other)}")
        span = shape[axis:axis + len(other)]
        if span != other:
            raise layer.bottom_error(
                1, f"has shape {list(other)} but {first} has {list(span)} at axes "
                   f"{axis}..{axis + len(other) - 1} (shape {list(shape)})",
                f"give bottom 1 the shape {list(span)} or change axis")
        return axis, other
    if num_axes == 0:
        return 0, ()
    axis = canonical_axis(layer, axis, len(shape))
    end = len(shape) if num_axes == -1 else axis + num_axes
    if end > len(shape):
        raise layer.fail(f"axis {axis} with num_axes {num_axes} extends past bottom "
                         f"'{layer.spec.bottom[0]}' of shape {list(shape)}",
                         f"use num_axes <= {len(shape) - axis} or -1")
    return axis, shape[axis:end]


def trailing_view(operand: torch.Tensor, trailing: int) -> torch.Tensor:
    """``operand`` with ``trailing`` size-1 axes so that it broadcasts against bottom 0."""
    return operand.view(*operand.shape, *([1] * trailing))


_LOW_PRECISION = (torch.bfloat16, torch.float16)


def as_dtype(operand: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``operand`` cast to ``x``'s dtype when ``x`` is bfloat16/float16 (autocast): type
    promotion would otherwise turn the whole activation into float32. The gradient still
    reaches a float32 parameter through the cast. Any other pair is left to promotion, so
    float32 and float64 runs compute exactly as without it."""
    if x.dtype in _LOW_PRECISION and operand.dtype != x.dtype and operand.is_floating_point():
        return operand.to(x.dtype)
    return operand


@register("Scale")
class Scale(Layer):
    """y = x * scale (+ bias), the scale broadcast along bottom 0's axes from ``axis``.

    One bottom: the scale is a learned blob (Caffe order: scale, then bias when bias_term).
    Two bottoms: the second bottom is the scale, and only the bias (if any) is learned.
    """

    bottoms = (1, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p: ScaleParameter = self.param()
        self.axis, shape = operand_shape(self, bottom_shapes, p.axis, p.num_axes)
        self.trailing = len(bottom_shapes[0]) - self.axis - len(shape)
        if len(bottom_shapes) == 1:
            self.add_blob("scale", shape, p.filler or _ONE)
        self.bias_term = p.bias_term
        if p.bias_term:
            self.add_blob("bias", shape, p.bias_filler)
        self.folded_into: str | None = None
        """The BatchNorm that applies this layer's blobs (fusion pass); this layer then
        passes its bottom through."""
        return [bottom_shapes[0]]

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        if self.folded_into is not None:
            return x
        s = trailing_view(as_dtype(self.scale if scale is None else scale, x), self.trailing)
        if self.bias_term:
            return torch.addcmul(trailing_view(as_dtype(self.bias, x), self.trailing), x, s)
        return x * s

    def extra_repr(self) -> str:
        folded = f", folded into '{self.folded_into}'" if self.folded_into else ""
        return f"{super().extra_repr()}{folded}"


@register("Bias")
class Bias(Layer):
    """y = x + bias, the bias broadcast along bottom 0's axes from ``axis`` (a learned blob,
    or the second bottom)."""

    bottoms = (1, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p: BiasParameter = self.param()
        self.axis, shape = operand_shape(self, bottom_shapes, p.axis, p.num_axes)
        self.trailing = len(bottom_shapes[0]) - self.axis - len(shape)
        if len(bottom_shapes) == 1:
            self.add_blob("bias", shape, p.filler)
        return [bottom_shapes[0]]

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return x + trailing_view(as_dtype(self.bias if bias is None else bias, x), self.trailing)


class _MVNFunction(torch.autograd.Function):
    """y = (x - mean) / (std + eps) per row of a (rows, dim) tensor, with Caffe's backward
    dx = (dy - mean(dy) - y mean(y dy)) / (std + eps), which treats the eps as part of the
    standard deviation (the exact derivative differs by a term of relative size eps / std)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float) -> torch.Tensor:
        centred = x - x.mean(1, keepdim=True)
        std = centred.square().mean(1, keepdim=True).sqrt() + eps  # (rows, 1)
        y = centred / std
        ctx.save_for_backward(y, std)
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor) -> tuple[torch.Tensor, None]:
        y, std = ctx.saved_tensors
        dx = dy - dy.mean(1, keepdim=True) - y * (y * dy).mean(1, keepdim=True)
        return dx / std, None


@register("MVN")
class MVN(Layer):
    """Subtract the mean (and divide by the standard deviation plus eps) over H x W per item
    and channel, or over C x H x W per item with ``across_channels``. The variance is the
    biased one (divided by the count). Like Caffe (num/channels/height/width) the bottom has at
    most 4 axes, a missing axis counts as 1, and the top is N x C x H x W: (N, C) gives
    (N, C, 1, 1)."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        (shape,) = bottom_shapes
        if not 1 <= len(shape) <= 4:
            raise self.bottom_error(0, f"has shape {list(shape)}; MVN takes 1 to 4 axes "
                                       "(N, C, H, W)")
        p = self.param()
        self.normalize_variance, self.across, self.eps = (
            p.normalize_variance, p.across_channels, p.eps)
        return [tuple(shape) + (1,) * (4 - len(shape))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0] if self.across or x.dim() < 2 else x.shape[0] * x.shape[1]
        flat = x.reshape(rows, -1)  # (rows, dim)
        if self.normalize_variance:
            y = _MVNFunction.apply(flat, self.eps)
        else:
            y = flat - flat.mean(1, keepdim=True)
        return y.reshape(*x.shape, *([1] * (4 - x.dim())))
