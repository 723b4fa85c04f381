"""The blocks of the OCR forks' sequence layers (CRNN / CTPN ports of Caffe, e.g.
senlinuc/caffe_ocr): the fork ``Lstm`` (Junhyuk Oh's layer), ``Reverse``, ``Transpose``,
``CTCGreedyDecoder`` and ``WarpCTCLoss``, under the fork's field names and defaults."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Check, Message, field
from .shared import FillerParameter


@dataclass
class LstmParameter(Message):
    """The fork Lstm's lstm_param."""

    num_output: int = field(0, "hidden units H", min=1)
    clipping_threshold: float = field(0.0, "clip each gate's pre-activation gradient to "
                                           "[-threshold, threshold] (0: no clipping)", min=0)
    weight_filler: FillerParameter | None = field(None, "both weight matrices' init")
    bias_filler: FillerParameter | None = field(None, "the bias's init")
    batch_size: int = field(1, "read but unused by the fork (the bottom's axis 1 is the batch)")


@dataclass
class ReverseParameter(Message):
    """Reverse's reverse_param."""

    axis: int = field(0, "the axis whose order is reversed (0: time)", min=0)


@dataclass
class TransposeParameter(Message):
    """Transpose's transpose_param: top axis i is bottom axis dim[i]."""

    dim: list[int] = field([], "one bottom axis per top axis, a permutation", min=0)

    def check(self, v: Check) -> None:
        if sorted(self.dim) != list(range(len(self.dim))):
            v.fail("dim", f"dim {self.dim} is not a permutation of 0..{len(self.dim) - 1}",
                   "name every bottom axis once")


@dataclass
class CTCDecoderParameter(Message):
    """CTCGreedyDecoder's ctc_decoder_param."""

    blank_index: int = field(0, "the blank class (negative: the last class)")
    ctc_merge_repeated: bool = field(True, "merge repeated classes before removing blanks")


@dataclass
class CTCLossParameter(Message):
    """WarpCTCLoss's ctc_loss_param (the fork reads blank_index only)."""

    output_delay: int = field(0, "read but unused by the fork's warp-ctc loss")
    blank_index: int = field(0, "the blank class")
    preprocess_collapse_repeated: bool = field(False, "read but unused by the fork's warp-ctc "
                                                      "loss")
    ctc_merge_repeated: bool = field(True, "read but unused by the fork's warp-ctc loss")
    loss_calculation_t: int = field(0, "read but unused by the fork's warp-ctc loss")
