"""The blocks of the loss layers and Accuracy (the margin losses' are in margin_loss.py)."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Message, field


@dataclass
class LossParameter(Message):
    """Shared by loss layers: which label to ignore and how to normalise."""

    ignore_label: int | None = field(None, "positions with this label add no loss or gradient")
    normalization: str = field("VALID", "what the summed loss is divided by (PRE_FIXED: "
                                        "pre_fixed_normalizer, R-FCN's fork, which numbers it "
                                        "3 where Caffe numbers NONE: write it by name)",
                               choices={"FULL": 0, "VALID": 1, "BATCH_SIZE": 2, "NONE": 3,
                                        "PRE_FIXED": None})
    normalize: bool | None = field(None, "legacy: true means VALID, false BATCH_SIZE")
    pre_fixed_normalizer: float = field(1.0, "R-FCN's fork: the divisor of normalization "
                                             "PRE_FIXED")
    weight_by_label_freqs: bool = field(False, "SegNet's fork: weight each position's loss "
                                               "and gradient by its label's class_weighting")
    class_weighting: list[float] = field([], "SegNet's fork: one weight per class")


@dataclass
class AccuracyParameter(Message):
    """Caffe's AccuracyParameter."""

    top_k: int = field(1, "a prediction is right when the label is among the k best classes",
                       min=1)
    axis: int = field(1, "the class axis (negative counts from the end)")
    ignore_label: int | None = field(None, "positions with this label are not counted")


@dataclass
class InfogainLossParameter(Message):
    """Caffe's InfogainLossParameter."""

    source: str = field("", "a .binaryproto holding the C x C infogain matrix H (not needed "
                            "when H is the third bottom)", path=True)
    axis: int = field(1, "the class axis of the scores (negative counts from the end)")
