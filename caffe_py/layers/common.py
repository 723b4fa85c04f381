"""Layer family: common (InnerProduct, Flatten, Reshape, Concat, Slice, Split, Eltwise, Silence,
Softmax, Dropout).

Shape inference follows Caffe's Reshape() of each layer, with its rules and its error cases
made into one-line errors that name the layer and the blob. Every ``forward`` works from the
tensors it gets, so a batch size other than the build one is fine.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..spec.layer_params.common import ReshapeParameter
from ..spec.schema import is_set
from .base import Layer, Shape, canonical_axis, count
from .registry import register


def given(msg: Any, name: str) -> bool:
    """Caffe's ``has_<name>()``: written in the spec, or set in code to a non-default value."""
    if is_set(msg, name):
        return True
    f = next(f for f in dataclasses.fields(msg) if f.name == name)
    if f.default_factory is not dataclasses.MISSING:
        default = f.default_factory()
    else:
        default = f.default
    return getattr(msg, name) != default


def same_shapes(layer: Layer, shapes: list[Shape], rule: str) -> None:
    """Fail naming the first bottom whose shape differs from bottom 0's."""
    for i, shape in enumerate(shapes[1:], start=1):
        if shape != shapes[0]:
            raise layer.bottom_error(
                i, f"has shape {list(shape)} but bottom '{layer.spec.bottom[0]}' (index 0) has "
                   f"{list(shapes[0])}", rule)


# --- InnerProduct ---------------------------------------------------------------------------
@register("InnerProduct")
class InnerProduct(Layer):
    """y = x W^T + b over x flattened from ``axis``: (..., K) -> (..., N).

    A float32 batch on a GPU takes Caffe's own two steps, the product and then the bias added
    to it (:func:`linear_fp32`), not cuBLAS's fused ``addmm``: for outputs of a few columns that
    one runs a split-K sequence (a memset, a scale, the product, an epilogue) that is slower on
    the device and far slower to launch in a CUDA graph (docs/performance.md, "Fast by
    default")."""


    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        shape = bottom_shapes[0]
        if p.num_output < 1:
            raise self.fail("num_output is not set", "set inner_product_param.num_output")
        self.axis = canonical_axis(self, p.axis, len(shape))
        k = count(shape, self.axis)
        self.transpose = p.transpose
        self.add_blob("weight", (k, p.num_output) if p.transpose else (p.num_output, k),
                      p.weight_filler)
        self.has_bias = p.bias_term
        if p.bias_term:
            self.add_blob("bias", (p.num_output,), p.bias_filler)
        return [shape[:self.axis] + (p.num_output,)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(self.axis)  # (..., K)
        weight = self.weight.t() if self.transpose else self.weight  # (N, K)
        bias = self.bias if self.has_bias else None
        if x.dim() == 2 and x.is_cuda and x.dtype == torch.float32 \
                and not torch.is_autocast_enabled("cuda"):
            return linear_fp32(x, weight, bias)
        return F.linear(x, weight, bias)


def linear_fp32(x: torch.Tensor, weight: torch.Tensor,
                bias: torch.Tensor | None) -> torch.Tensor:
    """Caffe's InnerProduct forward for a (M, K) batch: ``x @ weight^T`` (M, N), then the bias
    added in place, each rounded once as Caffe's two gemm calls round them."""
    y = torch.mm(x, weight.t())
    return y.add_(bias) if bias is not None else y


# --- Flatten --------------------------------------------------------------------------------
@register("Flatten")
class Flatten(Layer):
    """Merges axes ``axis..end_axis`` into one: (N, C, H, W) -> (N, C*H*W) by default."""


    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        shape = bottom_shapes[0]
        self.start = canonical_axis(self, p.axis, len(shape), "axis")
        self.end = canonical_axis(self, p.end_axis, len(shape), "end_axis")
        if self.end < self.start:
            raise self.fail(f"end_axis {p.end_axis} comes before axis {p.axis} for a blob with "
                            f"{len(shape)} axes", "set end_axis >= axis")
        return [shape[:self.start] + (count(shape, self.start, self.end + 1),)
                + shape[self.end + 1:]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(self.start, self.end)


# --- Reshape --------------------------------------------------------------------------------
def reshape_target(layer: Layer, bottom: Shape, p: ReshapeParameter) -> Shape:
    """Caffe's ReshapeLayer::Reshape: the top shape for ``bottom``, or an error."""
    n = len(bottom)
    start = p.axis if p.axis >= 0 else n + p.axis + 1
    if not 0 <= start <= n:
        raise layer.fail(f"axis {p.axis} is out of range for a blob with {n} axes")
    end = n if p.num_axes == -1 else start + p.num_axes
    if end > n:
        raise layer.fail(f"axis {p.axis} + num_axes {p.num_axes} is past the {n} axes of "
                         f"bottom '{layer.spec.bottom[0]}' {list(bottom)}")
    dims = list(p.shape.dim)
    for i, d in enumerate(dims):
        if d == 0:
            if start + i >= end:
                raise layer.fail(f"shape dim {i} is 0 but there is no bottom axis {start + i} "
                                 f"to copy within the replaced axes",
                                 "write the size instead of 0")
            dims[i] = bottom[start + i]
    top = list(bottom[:start]) + dims + list(bottom[end:])
    total = count(bottom)
    if -1 in dims:
        known = count([d for d in top if d != -1])
        if known == 0 or total % known:
            raise layer.fail(f"cannot infer the -1 in shape {p.shape.dim}: bottom "
                             f"'{layer.spec.bottom[0]}' {list(bottom)} has {total} elements, "
                             f"not a multiple of {known}", "fix the other dims of shape")
        top[top.index(-1)] = total // known
    if count(top) != total:
        raise layer.fail(f"shape {top} has {count(top)} elements but bottom "
                         f"'{layer.spec.bottom[0]}' {list(bottom)} has {total}",
                         "make the counts match, or use -1 for one dim")
    return tuple(top)


@register("Reshape")
class Reshape(Layer):
    """A view of the bottom with a new shape (0 = copy a dim, -1 = infer one)."""


    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        self._targets = {bottom_shapes[0]: reshape_target(self, bottom_shapes[0], self.param())}
        return [self._targets[bottom_shapes[0]]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = tuple(x.shape)
        target = self._targets.get(shape)
        if target is None:  # another batch size: Caffe recomputes the shape in Reshape()
            target = self._targets[shape] = reshape_target(self, shape, self.param())
        return x.reshape(target)


# --- Concat ---------------------------------------------------------------------------------
@register("Concat")
class Concat(Layer):
    """Joins the bottoms along one axis; every other axis must match."""

    bottoms = (1, None)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        first = bottom_shapes[0]
        n = len(first)
        if given(p, "concat_dim"):
            if p.concat_dim >= n:
                raise self.fail(f"concat_dim {p.concat_dim} is out of range for a blob with {n} "
                                f"axes")
            self.axis = p.concat_dim
        else:
            self.axis = canonical_axis(self, p.axis, n)
        for i, shape in enumerate(bottom_shapes[1:], start=1):
            if len(shape) != n:
                raise self.bottom_error(i, f"has {len(shape)} axes {list(shape)} but bottom "
                                           f"'{self.spec.bottom[0]}' has {n} {list(first)}",
                                        "all inputs of Concat need the same number of axes")
            for j in range(n):
                if j != self.axis and shape[j] != first[j]:
                    raise self.bottom_error(
                        i, f"has shape {list(shape)} but bottom '{self.spec.bottom[0]}' has "
                           f"{list(first)}: they differ at axis {j}, not the concat axis "
                           f"{self.axis}", "all inputs must match except at the concat axis")
        size = sum(s[self.axis] for s in bottom_shapes)
        return [first[:self.axis] + (size,) + first[self.axis + 1:]]

    def forward(self, *bottoms: torch.Tensor) -> torch.Tensor:
        return bottoms[0] if len(bottoms) == 1 else torch.cat(bottoms, self.axis)


# --- Slice ----------------------------------------------------------------------------------
@register("Slice")
class Slice(Layer):
    """Cuts the bottom into the tops along one axis, at ``slice_point`` or in equal parts."""

    tops = (1, None)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        shape = bottom_shapes[0]
        if given(p, "slice_dim"):
            if p.slice_dim >= len(shape):
                raise self.fail(f"slice_dim {p.slice_dim} is out of range for a blob with "
                                f"{len(shape)} axes")
            self.axis = p.slice_dim
        else:
            self.axis = canonical_axis(self, p.axis, len(shape))
        self.sizes = self._sizes(p.slice_point, shape[self.axis], len(self.spec.top))
        return [shape[:self.axis] + (s,) + shape[self.axis + 1:] for s in self.sizes]

    def _sizes(self, points: list[int], size: int, tops: int) -> list[int]:
        where = f"axis {self.axis} of bottom '{self.spec.bottom[0]}' (size {size})"
        if not points:
            if size % tops:
                raise self.fail(f"{tops} tops do not evenly divide {where}",
                                "give slice_point, or a number of tops that divides the axis")
            return [size // tops] * tops
        if len(points) != tops - 1:
            raise self.fail(f"{len(points)} slice_point values for {tops} tops",
                            "give one fewer slice_point than tops")
        previous = 0
        for point in points:
            if point <= previous or point >= size:
                raise self.fail(f"slice_point {point} is out of range for {where}",
                                f"slice points increase strictly within 1..{size - 1}")
            previous = point
        return [b - a for a, b in zip([0] + points, points + [size], strict=True)]

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if len(self.sizes) == 1:
            return x
        return tuple(torch.split(x, self.sizes, self.axis))


# --- Split ----------------------------------------------------------------------------------
@register("Split")
class Split(Layer):
    """The bottom to every top; autograd sums the tops' gradients into the bottom's."""

    tops = (1, None)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        return [bottom_shapes[0]] * len(self.spec.top)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        n = len(self.top_shapes)
        return x if n == 1 else (x,) * n


# --- Eltwise --------------------------------------------------------------------------------
@register("Eltwise")
class Eltwise(Layer):
    """Element-wise product, weighted sum or maximum of bottoms of one shape."""

    bottoms = (2, None)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        if p.coeff and len(p.coeff) != len(bottom_shapes):
            raise self.fail(f"{len(p.coeff)} coeff values for {len(bottom_shapes)} bottoms",
                            "give one coefficient per bottom")
        if p.coeff and p.operation != "SUM":
            raise self.fail(f"coeff is given for operation {p.operation}",
                            "coefficients apply to SUM only; remove coeff")
        same_shapes(self, bottom_shapes, "Eltwise needs all bottoms the same shape")
        self.operation = p.operation
        self.coeff = list(p.coeff) or [1.0] * len(bottom_shapes)
        self._norm: tuple[Any, int] | None = None
        self._relu: tuple[Any] | None = None
        return [bottom_shapes[0]]

    def attach_batchnorm(self, bn_layer: Any, bottom: int) -> None:
        """Normalise bottom ``bottom`` here with ``bn_layer`` (a BatchNorm, with its folded
        Scale, that passes it through), in the fused kernels with the sum where they take it
        (the fusion pass ``fuse_batchnorm_eltwise`` calls this)."""
        self._norm = (bn_layer, bottom)

    def attach_relu(self, relu_layer: Any) -> None:
        """Apply ``relu_layer`` (in place on this layer's top) after the sum."""
        self._relu = (relu_layer,)

    @property
    def fused_batchnorm(self) -> str | None:
        """The name of the BatchNorm this layer applies, or None."""
        return None if self._norm is None else self._norm[0].name

    @property
    def fused_relu(self) -> str | None:
        """The name of the ReLU this layer applies, or None."""
        return None if self._relu is None else self._relu[0].name

    def forward(self, *bottoms: torch.Tensor) -> torch.Tensor:
        if self._norm is not None:
            return self._normalized_sum(bottoms)
        return self._combine(bottoms)

    def _normalized_sum(self, bottoms: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """The BatchNorm's output for bottom k, summed with the other bottom, then the ReLU:
        one fused call where the kernels take it, else the layers' own operations in order."""
        bn, k = self._norm  # type: ignore[misc]
        relu = None if self._relu is None else self._relu[0]
        fused = bn.normalize_sum(bottoms[k], bottoms[1 - k], 1.0 if relu is None else relu.p)
        if fused is not None:
            return fused
        parts = list(bottoms)
        parts[k] = bn.normalize(bottoms[k])
        out = self._combine(tuple(parts))
        return out if relu is None else relu.activate(out)

    def _combine(self, bottoms: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if self.operation == "PROD":
            out = bottoms[0] * bottoms[1]
            for x in bottoms[2:]:
                out = out * x
            return out
        if self.operation == "MAX":
            # Caffe's mask: bottom 1 wins a tie with bottom 0, later bottoms only when strictly
            # greater; torch.where sends each gradient to the winner alone, as Caffe does.
            out = torch.where(bottoms[0] > bottoms[1], bottoms[0], bottoms[1])
            for x in bottoms[2:]:
                out = torch.where(x > out, x, out)
            return out
        out = bottoms[0] if self.coeff[0] == 1.0 else bottoms[0] * self.coeff[0]
        for x, c in zip(bottoms[1:], self.coeff[1:], strict=True):
            out = torch.add(out, x, alpha=c)
        return out

    def extra_repr(self) -> str:
        fused = ""
        if self._norm is not None:
            fused += f", fused batchnorm '{self.fused_batchnorm}'"
        if self._relu is not None:
            fused += f", fused relu '{self.fused_relu}'"
        return f"{super().extra_repr()}{fused}"


# --- Silence --------------------------------------------------------------------------------
@register("Silence")
class Silence(Layer):
    """Consumes its bottoms so that they are not net outputs; no tops, zero gradient."""

    bottoms = (1, None)
    tops = (0, 0)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        return []

    def forward(self, *bottoms: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return ()


# --- Softmax --------------------------------------------------------------------------------
@register("Softmax")
class Softmax(Layer):
    """Probabilities along ``axis`` (softmax_param.axis, default the channel axis 1)."""


    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        self.axis = canonical_axis(self, self.param().axis, len(bottom_shapes[0]))
        return [bottom_shapes[0]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(x, dim=self.axis)


# --- Dropout --------------------------------------------------------------------------------
@register("Dropout")
class Dropout(Layer):
    """TRAIN: x * mask / (1 - ratio), mask ~ Bernoulli(1 - ratio); TEST: x (with SegNet's
    ``sample_weights_test``, TEST draws masks as TRAIN does).

    The phase is the net's (fixed when built), not ``module.training``. Masks come from
    torch's default generator of the tensor's device, so ``torch.manual_seed`` repeats them,
    unless :attr:`mask_source` is set.
    """

    mask_source: Callable[[tuple[int, ...]], torch.Tensor] | None = None
    """Where TRAIN masks come from instead: called with the input's shape, it returns a 0/1
    mask of that shape (caffe_py.pycaffe draws Caffe's own random stream here, so that a
    pycaffe script's dropout keeps exactly Caffe's units)."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        if not 0.0 <= p.dropout_ratio < 1.0:
            raise self.fail(f"dropout_ratio {p.dropout_ratio} is outside [0, 1)",
                            "use a value in [0, 1)")
        self.ratio = p.dropout_ratio
        self.scale_train = p.scale_train
        self.sampling = self.phase == "TRAIN" or p.sample_weights_test
        return [bottom_shapes[0]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sampling:
            if self.mask_source is not None:  # Caffe: x * mask * scale_, in float
                kept = x * self.mask_source(tuple(x.shape)).to(x.device, x.dtype)
                return kept * (1.0 / (1.0 - self.ratio)) if self.scale_train else kept
            if self.scale_train:
                return F.dropout(x, self.ratio, training=True)  # one fused op
            return x * torch.empty_like(x).bernoulli_(1.0 - self.ratio)
        return x if self.scale_train else x * (1.0 - self.ratio)
