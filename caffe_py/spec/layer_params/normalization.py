"""The blocks of the normalization layers: BatchNorm, Scale, Bias, MVN."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Message, field
from .shared import FillerParameter


@dataclass
class BatchNormParameter(Message):
    """Caffe's BatchNormParameter."""

    use_global_stats: bool | None = field(
        None, "normalise with the stored statistics instead of the batch's "
              "(default: true in TEST, false in TRAIN)")
    moving_average_fraction: float = field(
        0.999, "decay of the running sums per iteration", min=0.0, max=1.0)
    eps: float = field(1e-5, "added to the variance before the square root", min=0.0)


@dataclass
class ScaleParameter(Message):
    """Caffe's ScaleParameter."""

    axis: int = field(1, "the first axis of bottom[0] the scale applies along "
                         "(negative counts from the end)")
    num_axes: int = field(1, "how many axes the learned scale spans (-1: to the end; 0: a "
                             "scalar); ignored with a second bottom, whose shape decides",
                          min=-1)
    filler: FillerParameter | None = field(None, "initial scale (default: constant 1)")
    bias_term: bool = field(False, "also learn a bias of the same shape, added after scaling")
    bias_filler: FillerParameter | None = field(None, "initial bias (default: zeros)")


@dataclass
class BiasParameter(Message):
    """Caffe's BiasParameter."""

    axis: int = field(1, "the first axis of bottom[0] the bias applies along "
                         "(negative counts from the end)")
    num_axes: int = field(1, "how many axes the learned bias spans (-1: to the end; 0: a "
                             "scalar); ignored with a second bottom, whose shape decides",
                          min=-1)
    filler: FillerParameter | None = field(None, "initial bias (default: zeros)")


@dataclass
class MVNParameter(Message):
    """Caffe's MVNParameter: mean (and variance) normalisation per item and channel."""

    normalize_variance: bool = field(True, "divide by the standard deviation (false: subtract "
                                           "the mean only)")
    across_channels: bool = field(False, "normalise over C x H x W together instead of per "
                                         "channel")
    eps: float = field(1e-9, "added to the standard deviation before dividing")
