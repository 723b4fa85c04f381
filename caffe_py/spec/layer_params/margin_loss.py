"""The blocks of the margin losses: ContrastiveLoss, HingeLoss."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Message, field


@dataclass
class ContrastiveLossParameter(Message):
    """Caffe's ContrastiveLossParameter."""

    margin: float = field(1.0, "dissimilar pairs add loss while closer than this")
    legacy_version: bool = field(False, "use max(margin - d^2, 0) (the first form) instead of "
                                        "max(margin - d, 0)^2 (Hadsell et al.)")


@dataclass
class HingeLossParameter(Message):
    """Caffe's HingeLossParameter."""

    norm: str = field("L1", "L1: sum of the hinges; L2: sum of their squares",
                      choices={"L1": 1, "L2": 2})
