"""Layer family: the mobile and attention nets' fork layers.

- ``ConvolutionDepthwise`` (the caffe-mobilenet layer ShuffleNet's and MobileNet ports'
  prototxts use): one k x k filter per input channel, blobs weight (C, 1, kh, kw) and bias (C,);
  the top has the bottom's C channels whatever num_output says (the fork never reads it).
- ``ShuffleChannel`` (farmingyard/ShuffleNet): channel ``g * (C / group) + k`` moves to
  ``k * group + g``.
- ``Axpy`` (hujie-frank/SENet): bottoms a (N, C[, 1, 1]), x and y (N, C, ...): top = a * x + y,
  the Squeeze-and-Excitation rescaling and the residual sum in one layer.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..spec.layer_params.mobile import ShuffleChannelParameter
from ..spec.layer_params.vision import ConvolutionParameter
from ..spec.schema import is_set
from .base import Layer, Shape
from .registry import register


def _pair(p: ConvolutionParameter, name: str, default: int) -> tuple[int, int]:
    """The fork's reading of one setting: name_h and name_w when both are set, else the
    repeated field's first value (and second, when given), else ``default``."""
    h, w = f"{name}_h", f"{name}_w"
    if hasattr(p, h) and is_set(p, h) and is_set(p, w):
        return getattr(p, h), getattr(p, w)
    values = getattr(p, "kernel_size" if name == "kernel" else name)
    if not values:
        return default, default
    return values[0], values[1] if len(values) > 1 else values[0]


@register("ConvolutionDepthwise")
class ConvolutionDepthwise(Layer):
    """Depthwise 2-D convolution (module docstring); bias_term adds one bias per channel."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        (shape,) = bottom_shapes
        self.require_axes(0, shape, 4)
        p: ConvolutionParameter = self.param()
        n, c, h, w = shape
        kernel = _pair(p, "kernel", 0)
        if min(kernel) < 1:
            raise self.fail("convolution_param gives no kernel size",
                            "give kernel_size, or kernel_h and kernel_w")
        self.kernel, self.stride = kernel, _pair(p, "stride", 1)
        self.pad, self.dilation = _pair(p, "pad", 0), _pair(p, "dilation", 1)
        out = [(size + 2 * pad - (d * (k - 1) + 1)) // s + 1 for size, k, s, pad, d in
               zip((h, w), self.kernel, self.stride, self.pad, self.dilation, strict=True)]
        if min(out) < 1:
            raise self.fail(f"the {kernel[0]} x {kernel[1]} kernel does not fit the {h} x {w} "
                            "input", "use a smaller kernel or more pad")
        self.channels = c
        self.add_blob("weight", (c, 1, *kernel), p.weight_filler)
        self.bias_term = p.bias_term
        if self.bias_term:
            self.add_blob("bias", (c,), p.bias_filler)
        return [(n, c, *out)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias if self.bias_term else None
        return F.conv2d(x, self.weight, bias, self.stride, self.pad, self.dilation,
                        groups=self.channels)


@register("ShuffleChannel")
class ShuffleChannel(Layer):
    """ShuffleNet's channel shuffle of (N, C, ...): C must be a multiple of ``group``."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        (shape,) = bottom_shapes
        self.require_axes(0, shape, (2, 3, 4, 5))
        p: ShuffleChannelParameter = self.param()
        if shape[1] % p.group:
            raise self.bottom_error(0, f"has {shape[1]} channels, not a multiple of "
                                       f"shuffle_channel_param.group {p.group}")
        self.group = p.group
        return [shape]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c = x.shape[:2]
        rest = x.shape[2:]
        return x.reshape(n, self.group, c // self.group, *rest).transpose(1, 2).reshape(x.shape)


@register("Axpy")
class Axpy(Layer):
    """SENet's Axpy: a (N, C) or (N, C, 1, 1), x and y (N, C, ...) of one shape -> a * x + y."""

    bottoms = (3, 3)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        a, x, y = bottom_shapes
        if len(a) < 2 or a[:2] != x[:2] or any(d != 1 for d in a[2:]):
            raise self.bottom_error(0, f"(the scale) has shape {list(a)}; expected "
                                       f"{list(x[:2])} or {list(x[:2]) + [1, 1]} (one value per "
                                       "item and channel of x)")
        if tuple(x) != tuple(y):
            raise self.bottom_error(2, f"has shape {list(y)} but x has {list(x)}",
                                    "give y the shape of x")
        self.trailing = len(x) - 2
        return [x]

    def forward(self, a: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        scale = a.reshape(*a.shape[:2], *([1] * self.trailing))
        return torch.addcmul(y, scale, x)
