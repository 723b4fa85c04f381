"""Layer family: utility (Crop, Tile, Reduction, ArgMax, Embed, Filter, BatchReindex, Parameter),
as Caffe 1.0 computes them (crop_layer.cpp, tile_layer.cpp, reduction_layer.cpp,
argmax_layer.cpp, embed_layer.cpp, filter_layer.cpp, batch_reindex_layer.cpp,
parameter_layer.hpp).

Inputs that Caffe reads as indices (Embed's ids, BatchReindex's permutation, Filter's
selector, Crop's reference) get no gradient, as in Caffe, whose backward refuses or skips them.
Indices are truncated to integers as Caffe's static_cast<int> does; one out of range is a
DataError naming the layer (one host sync per batch).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import DataError
from ..spec.schema import message_at
from .base import Layer, Shape, canonical_axis, count
from .registry import register


def check_index_range(layer: Layer, index: torch.Tensor, size: int, what: str) -> None:
    """A DataError when an index is outside [0, size)."""
    bad = (index < 0) | (index >= size)
    if bool(bad.any()):
        value = int(index[bad].flatten()[0])
        raise DataError(message_at(layer.spec, f"{what} {value} is outside [0, {size})",
                                   f"check bottom '{layer.spec.bottom[-1]}'", named=True))


# --- Crop -----------------------------------------------------------------------------------
@register("Crop")
class Crop(Layer):
    """Bottom 0 cut to bottom 1's size on every axis from ``axis`` on, starting at ``offset``."""

    bottoms = (2, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        data, reference = bottom_shapes
        self.axis = canonical_axis(self, p.axis, len(data))
        cropped = len(data) - self.axis
        if len(p.offset) > 1 and len(p.offset) != cropped:
            raise self.fail(f"{len(p.offset)} offsets for the {cropped} axes cropped from axis "
                            f"{self.axis}", "give one offset, or one per cropped axis")
        if len(reference) != len(data):
            raise self.bottom_error(1, f"has {len(reference)} axes {list(reference)} but bottom "
                                       f"'{self.spec.bottom[0]}' has {len(data)} {list(data)}",
                                    "the reference needs as many axes as the input")
        self.offsets = [p.offset[0] if len(p.offset) == 1 else p.offset[i] if p.offset else 0
                        for i in range(cropped)]
        return [self._top_shape(data, reference)]

    def _top_shape(self, data: Shape, reference: Shape) -> Shape:
        for i, offset in enumerate(self.offsets):
            axis = self.axis + i
            if data[axis] - offset < reference[axis]:
                raise self.fail(f"the crop of axis {axis} is out of bounds: size "
                                f"{reference[axis]} at offset {offset} in "
                                f"{data[axis]} (bottom '{self.spec.bottom[0]}' {list(data)})",
                                "use a smaller offset or a larger input")
        return tuple(data[:self.axis]) + tuple(reference[self.axis:])

    def forward(self, x: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        self._top_shape(tuple(x.shape), tuple(reference.shape))
        index = [slice(None)] * self.axis + [
            slice(o, o + n) for o, n in zip(self.offsets, reference.shape[self.axis:],
                                            strict=True)]
        return x[tuple(index)]


# --- Tile -----------------------------------------------------------------------------------
@register("Tile")
class Tile(Layer):
    """``tiles`` copies of the bottom one after another along ``axis``."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        shape = bottom_shapes[0]
        if p.tiles is None:
            raise self.fail("tile_param.tiles is not set", "set the number of copies")
        self.axis = canonical_axis(self, p.axis, len(shape))
        self.repeats = [1] * len(shape)
        self.repeats[self.axis] = p.tiles
        return [tuple(n * r for n, r in zip(shape, self.repeats, strict=True))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(self.repeats)


# --- Reduction ------------------------------------------------------------------------------
@register("Reduction")
class Reduction(Layer):
    """SUM, ASUM, SUMSQ or MEAN of every axis from ``axis`` on, times ``coeff``: the top has
    the axes before ``axis`` (none for axis 0). ASUM's gradient at 0 is 0 (Caffe's sign)."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        shape = bottom_shapes[0]
        self.axis = canonical_axis(self, p.axis, len(shape)) if shape else 0
        self.operation, self.coeff = p.operation, p.coeff
        return [tuple(shape[:self.axis])]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(*x.shape[:self.axis], -1)  # (outer..., dim)
        if self.operation == "ASUM":
            flat = flat.abs()
        elif self.operation == "SUMSQ":
            flat = flat * flat
        y = flat.sum(-1)
        coeff = self.coeff / flat.shape[-1] if self.operation == "MEAN" else self.coeff
        return y if coeff == 1.0 else y * coeff


# --- ArgMax ---------------------------------------------------------------------------------
@register("ArgMax")
class ArgMax(Layer):
    """The indices (as floats) of the top_k largest entries, and with ``out_max_val`` their
    values; ties go to the higher index (Caffe sorts (value, index) pairs). No gradient.

    Without ``axis`` each item's entries after axis 0 are searched together and the top is
    (N, 1 or 2, top_k, 1, ...) with at least 3 axes; with ``axis`` the top is the bottom's
    shape with top_k along ``axis``, holding indices, or the values alone with out_max_val.
    """

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        shape = bottom_shapes[0]
        self.top_k, self.out_max_val = p.top_k, p.out_max_val
        self.axis = None if p.axis is None else canonical_axis(self, p.axis, len(shape))
        if self.axis is not None:
            limit, where = shape[self.axis], f"axis {self.axis}"
            top = list(shape)
            top[self.axis] = self.top_k
        else:
            limit, where = count(shape, 1), "the entries of one item"
            top = [1] * max(3, len(shape))
            top[0], top[2] = shape[0], self.top_k
            top[1] = 2 if self.out_max_val else 1
        if self.top_k > limit:
            raise self.fail(f"top_k {self.top_k} exceeds the {limit} of {where} of bottom "
                            f"'{self.spec.bottom[0]}' {list(shape)}",
                            f"use argmax_param.top_k <= {limit}")
        return [tuple(top)]

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim = self.axis if self.axis is not None else 1
        values = x if self.axis is not None else x.reshape(x.shape[0], -1)
        # stable descending sort of the reversed axis: among equal values the higher index wins
        n = values.shape[dim]
        best, index = torch.sort(values.flip(dim), dim=dim, descending=True, stable=True)
        best = best.narrow(dim, 0, self.top_k)
        index = (n - 1 - index.narrow(dim, 0, self.top_k)).to(x.dtype)
        if self.axis is not None:
            return best if self.out_max_val else index
        out = torch.stack([index, best], 1) if self.out_max_val else index.unsqueeze(1)
        return out.reshape(x.shape[0], -1, self.top_k, *([1] * (max(3, x.dim()) - 3)))


# --- Embed ----------------------------------------------------------------------------------
@register("Embed")
class Embed(Layer):
    """Row ``x`` of a learned (K, N) table (plus a bias of N) for every integer x of the
    bottom: shape (...) -> (..., N). The ids get no gradient; the table's rows accumulate."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        if p.num_output < 1 or p.input_dim < 1:
            missing = "num_output" if p.num_output < 1 else "input_dim"
            raise self.fail(f"embed_param.{missing} is not set", f"set {missing} > 0")
        self.input_dim = p.input_dim
        self.add_blob("weight", (p.input_dim, p.num_output), p.weight_filler)
        self.has_bias = p.bias_term
        if p.bias_term:
            self.add_blob("bias", (p.num_output,), p.bias_filler)
        return [tuple(bottom_shapes[0]) + (p.num_output,)]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        index = ids.detach().long()
        check_index_range(self, index, self.input_dim, "id")
        y = F.embedding(index, self.weight)
        return y + self.bias if self.has_bias else y


# --- Filter ---------------------------------------------------------------------------------
@register("Filter")
class Filter(Layer):
    """The items (along axis 0) of each bottom whose selector (the last bottom, N x 1 x ...)
    is non-zero; one top per other bottom. The build-time top shapes keep all N items, as
    Caffe's first Reshape does; later batches give as many items as are selected."""

    bottoms = (2, None)
    tops = (1, None)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        *data, selector = bottom_shapes
        if len(self.spec.top) != len(data):
            raise self.fail(f"has {len(data)} bottoms to filter but {len(self.spec.top)} tops",
                            "name one top per bottom, the selector (last bottom) excluded")
        last = len(bottom_shapes) - 1
        if not selector or any(d != 1 for d in selector[1:]):
            raise self.bottom_error(last, f"(the selector) has shape {list(selector)}; it must "
                                          "be N x 1 x ... (one flag per item)")
        for i, shape in enumerate(data):
            if not shape or shape[0] != selector[0]:
                raise self.bottom_error(i, f"has shape {list(shape)} but the selector has "
                                           f"{selector[0]} items", "give both the same axis 0")
        return [tuple(s) for s in data]

    def forward(self, *bottoms: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        *data, selector = bottoms
        keep = torch.nonzero(selector.detach().reshape(-1)).flatten()
        tops = tuple(x.index_select(0, keep) for x in data)
        return tops[0] if len(tops) == 1 else tops


# --- BatchReindex ---------------------------------------------------------------------------
@register("BatchReindex")
class BatchReindex(Layer):
    """top[i] = bottom[index[i]] along axis 0; the index (a 1-axis bottom) may repeat or drop
    items, and the gradient of a repeated item is the sum of its copies'."""

    bottoms = (2, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        data, index = bottom_shapes
        self.require_axes(1, index, 1)
        if not data:
            raise self.bottom_error(0, "is a scalar; BatchReindex needs an axis 0 to index")
        return [(index[0],) + tuple(data[1:])]

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        rows = index.detach().long()
        check_index_range(self, rows, x.shape[0], "index")
        return x.index_select(0, rows)


# --- Parameter ------------------------------------------------------------------------------
@register("Parameter")
class Parameter(Layer):
    """A learnable blob of ``parameter_param.shape`` (zeros, as Caffe) given as the top."""

    bottoms = (0, 0)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        shape = tuple(self.param().shape.dim)
        self.add_blob("blob", shape)
        return [shape]

    def forward(self) -> torch.Tensor:
        return self.blob


__all__ = ["Crop", "Tile", "Reduction", "ArgMax", "Embed", "Filter", "BatchReindex",
           "Parameter", "check_index_range"]
