"""Layer family: spatial layers built on the vision ones (SPP, Im2col), as Caffe 1.0 computes
them (spp_layer.cpp, im2col_layer.cpp).

SPP is Caffe's composition of Pooling layers (one per pyramid level, each flattened, then
concatenated); here the same Pooling layers do the pooling, so Caffe's rounding and padding
rules hold. Im2col lays out every convolution window as a column, as the im2col step of
Caffe's convolution does: channel-major, then kernel position, then output position.
"""
from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from ..spec.layer_params.vision import PoolingParameter
from ..spec.net_spec import LayerParameter
from ..spec.schema import Location, Origin, location
from .base import Layer, Shape, canonical_axis
from .registry import register
from .vision import Pooling, _per_axis, conv_out_size


# --- SPP ------------------------------------------------------------------------------------
def level_geometry(level: int, size: int) -> tuple[int, int]:
    """Caffe's SPP window for one axis at pyramid ``level``: (kernel = stride, pad)."""
    bins = 2 ** level
    kernel = math.ceil(size / bins)
    return kernel, (kernel * bins - size + 1) // 2


def written(msg, keys: tuple[str, ...], where: Location | None):
    """``msg`` with ``keys`` marked as written (Caffe's has_<field>()), as if read at ``where``."""
    object.__setattr__(msg, "_origin", Origin(where or Location("", 0, ""),
                                              written=frozenset(keys)))
    return msg


@register("SPP")
class SPP(Layer):
    """Spatial pyramid pooling of (N, C, H, W): level i pools a 2^i x 2^i grid of windows of
    ceil(size / 2^i) (stride = kernel, the remainder padded). One level gives the pooled
    (N, C, 1, 1) itself; more give (N, C * sum 4^i), the levels flattened and concatenated.
    STOCHASTIC samples in both phases, as Caffe's inner Pooling layers are built for TRAIN."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        shape = bottom_shapes[0]
        self.require_axes(0, shape, 4)
        if p.pyramid_height < 1:
            raise self.fail("spp_param.pyramid_height is not set", "set it to 1 or more")
        if min(shape[2:]) < 1:
            raise self.bottom_error(0, f"has shape {list(shape)}; H and W must be >= 1")
        self.height, self.method = p.pyramid_height, p.pool
        self._levels: dict[tuple[int, int], list[Pooling]] = {}
        pooled = [layer.top_shapes[0] for layer in self._pooling(shape[2], shape[3])]
        if self.height == 1:
            return [pooled[0]]
        return [(shape[0], sum(c * h * w for _, c, h, w in pooled))]

    def _pooling(self, height: int, width: int) -> list[Pooling]:
        """The Pooling layer of each level for an H x W input (built once per size)."""
        levels = self._levels.get((height, width))
        if levels is None:
            for level in range(self.height):
                self._check_level(level, height, width)
            ctx = dataclasses.replace(self.ctx, phase="TRAIN")
            levels = [Pooling(self._level_spec(i, height, width), [self.bottom_shapes[0][:2]
                                                                    + (height, width)], ctx)
                      for i in range(self.height)]
            self._levels[(height, width)] = levels
        return levels

    def _check_level(self, level: int, height: int, width: int) -> None:
        """Caffe's Pooling needs pad < kernel: a small input cannot have many levels."""
        (kh, ph), (kw, pw) = level_geometry(level, height), level_geometry(level, width)
        if ph >= kh or pw >= kw:
            raise self.fail(f"pyramid level {level} of a {height} x {width} input needs "
                            f"{kh} x {kw} windows padded by {ph} x {pw}, and Caffe's pooling "
                            "takes a pad smaller than the window",
                            "use a larger input or a smaller pyramid_height")

    def _level_spec(self, level: int, height: int, width: int) -> LayerParameter:
        (kh, ph), (kw, pw) = level_geometry(level, height), level_geometry(level, width)
        keys = ("pool", "kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w")
        values = (self.method, kh, kw, kh, kw, ph, pw)
        param = written(PoolingParameter(**dict(zip(keys, values, strict=True))), keys, None)
        spec = LayerParameter(name=f"{self.name} level {level}", type="Pooling",
                              bottom=self.spec.bottom[:1], top=[f"{self.spec.top[0]}_{level}"])
        spec.params = {"pooling_param": param}
        return written(spec, (), location(self.spec))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        levels = self._pooling(x.shape[2], x.shape[3])
        if self.height == 1:
            return levels[0](x)
        return torch.cat([layer(x).flatten(1) for layer in levels], 1)


# --- Im2col ---------------------------------------------------------------------------------
def im2col(x: torch.Tensor, kernel: Shape, stride: Shape, pad: Shape,
           dilation: Shape) -> torch.Tensor:
    """(B, C, *spatial) -> (B, C * prod(kernel), *out): every window as a column, in Caffe's
    order (channel, then kernel offsets, outermost axis first)."""
    batch, channels = x.shape[:2]
    if len(kernel) == 2:  # one op for the common case
        cols = F.unfold(x, kernel, dilation, pad, stride)  # (B, C * kh * kw, oh * ow)
        out = [conv_out_size(*a) for a in zip(x.shape[2:], kernel, stride, pad, dilation,
                                              strict=True)]
        return cols.reshape(batch, -1, *out)
    pads = [p for p in reversed(pad) for _ in range(2)]  # F.pad wants the last axis first
    cols = F.pad(x, pads)
    for i, (k, s, d) in enumerate(zip(kernel, stride, dilation, strict=True)):
        cols = cols.unfold(2 + i, d * (k - 1) + 1, s)  # appends the window axis
    n = len(kernel)
    cols = cols[(...,) + tuple(slice(None, None, d) for d in dilation)]  # (B, C, *out, *k)
    order = [0, 1] + list(range(2 + n, 2 + 2 * n)) + list(range(2, 2 + n))
    cols = cols.permute(order)  # (B, C, *k, *out)
    return cols.reshape(batch, channels * math.prod(kernel), *cols.shape[2 + n:])


@register("Im2col")
class Im2col(Layer):
    """Convolution's im2col as a layer: (..., C, *spatial) -> (..., C * prod(kernel), *out),
    with convolution_param's kernel, stride, pad, dilation and axis (any number of spatial
    axes); the backward is col2im (autograd's sum over overlapping windows)."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        shape = bottom_shapes[0]
        self.axis = canonical_axis(self, p.axis, len(shape))
        n = len(shape) - self.axis - 1
        if n < 1:
            raise self.bottom_error(0, f"has shape {list(shape)}: no spatial axis after the "
                                       f"channel axis {self.axis}")
        self.kernel = _per_axis(self, p, "kernel_size", n, None)
        self.stride = _per_axis(self, p, "stride", n, 1)
        self.pad = _per_axis(self, p, "pad", n, 0)
        self.dilation = _per_axis(self, p, "dilation", n, 1)
        if min(self.kernel) < 1 or min(self.stride) < 1 or min(self.dilation) < 1:
            raise self.fail(f"kernel {list(self.kernel)}, stride {list(self.stride)} and "
                            f"dilation {list(self.dilation)} must be >= 1",
                            "set positive sizes")
        out = [conv_out_size(*a) for a in zip(shape[self.axis + 1:], self.kernel, self.stride,
                                              self.pad, self.dilation, strict=True)]
        if min(out) < 1:
            raise self.bottom_error(0, f"of spatial size {list(shape[self.axis + 1:])} is "
                                       f"smaller than the (dilated, padded) kernel",
                                    "use a smaller kernel or more pad")
        columns = shape[self.axis] * math.prod(self.kernel)
        return [tuple(shape[:self.axis]) + (columns, *out)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:self.axis]  # the axes before the channel axis act as the batch
        cols = im2col(x.reshape(-1, *x.shape[self.axis:]), self.kernel, self.stride, self.pad,
                      self.dilation)
        return cols.reshape(*lead, *cols.shape[1:])
