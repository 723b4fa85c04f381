"""The block of the recurrent layers, RNN and LSTM."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Message, field
from .shared import FillerParameter


@dataclass
class RecurrentParameter(Message):
    """Caffe's RecurrentParameter (shared by RNN and LSTM)."""

    num_output: int = field(0, "the hidden size H (required)", min=0)
    weight_filler: FillerParameter | None = field(None, "initial weights (default: zeros)")
    bias_filler: FillerParameter | None = field(None, "initial biases (default: zeros)")
    debug_info: bool = field(False, "log the mean |h_t| (and |c_t|) of every time step")
    expose_hidden: bool = field(False, "add bottoms h_0 [c_0] and tops h_T [c_T] "
                                       "(1 x N x H) to carry the state explicitly")
