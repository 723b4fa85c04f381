"""The blocks of the mobile and attention nets' fork layers: ShuffleNet's ShuffleChannel
(ConvolutionDepthwise reads convolution_param; SENet's Axpy has no block)."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Message, field


@dataclass
class ShuffleChannelParameter(Message):
    """ShuffleNet's (farmingyard/ShuffleNet) channel shuffle."""

    group: int = field(1, "channels are split into this many groups and interleaved: channel "
                          "g * (C / group) + k goes to k * group + g", min=1)
