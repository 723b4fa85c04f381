"""The blocks of the utility layers: Crop, Tile, Reduction, ArgMax, Embed, Parameter (Filter and
BatchReindex take none)."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Message, field
from .shared import BlobShape, FillerParameter


@dataclass
class CropParameter(Message):
    """Crop bottom 0 to bottom 1's size from ``axis`` on (Caffe's CropParameter)."""

    axis: int = field(2, "the first axis cropped; earlier axes keep bottom 0's size "
                         "(negative counts from the end)")
    offset: list[int] = field([], "where the crop starts: once for every cropped axis, or once "
                                  "per cropped axis (none: 0)", min=0)


@dataclass
class TileParameter(Message):
    """Copies of the bottom along one axis (Caffe's TileParameter)."""

    axis: int = field(1, "the axis tiled (negative counts from the end)")
    tiles: int | None = field(None, "the number of copies, > 0 (required)", min=1)


@dataclass
class ReductionParameter(Message):
    """Reduce every axis from ``axis`` on to one value (Caffe's ReductionParameter)."""

    operation: str = field("SUM", "SUM, ASUM (sum of |x|), SUMSQ (sum of x^2) or MEAN",
                           choices={"SUM": 1, "ASUM": 2, "SUMSQ": 3, "MEAN": 4})
    axis: int = field(0, "the first axis reduced; the top keeps the axes before it "
                         "(0: a scalar)")
    coeff: float = field(1.0, "multiplies the result")


@dataclass
class ArgMaxParameter(Message):
    """The top_k indices (and values) of the largest entries (Caffe's ArgMaxParameter)."""

    out_max_val: bool = field(False, "also output the values (with axis: the values only)")
    top_k: int = field(1, "how many of the largest entries", min=1)
    axis: int | None = field(None, "the axis searched (none: everything after axis 0, flattened)")


@dataclass
class EmbedParameter(Message):
    """A learned lookup table of input_dim rows of num_output values (Caffe's EmbedParameter)."""

    num_output: int = field(0, "the size N of each embedding (required)", min=0)
    input_dim: int = field(0, "the number K of rows: inputs are integers in [0, K) (required)",
                           min=0)
    bias_term: bool = field(True, "add a learnable bias of shape (N,)")
    weight_filler: FillerParameter | None = field(None, "weight init (none: zeros, as Caffe)")
    bias_filler: FillerParameter | None = field(None, "bias init (none: zeros, as Caffe)")


@dataclass
class ParameterParameter(Message):
    """A learnable blob given as the layer's top (Caffe's ParameterParameter)."""

    shape: BlobShape = field(BlobShape(), "the blob's shape")
