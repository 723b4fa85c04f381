"""Messages that many blocks (and NetParameter) share: BlobShape and FillerParameter."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Check, Message, field

# caffe.proto's numbering of the enums several messages share (a spec may write the number)
ENGINE_NUMBERS = {"DEFAULT": 0, "CAFFE": 1, "CUDNN": 2}
POOL_METHODS = {"MAX": 0, "AVE": 1, "STOCHASTIC": 2}


@dataclass
class BlobShape(Message):
    """A blob's shape (Caffe's BlobShape)."""

    dim: list[int] = field([], "the size of each axis, outermost first")

    def check(self, v: Check) -> None:
        if any(d < 0 for d in self.dim):
            v.fail("dim", f"negative size in {self.dim}", "sizes are >= 0")


@dataclass
class FillerParameter(Message):
    """How a learnable blob is initialised (Caffe's FillerParameter)."""

    type: str = field("constant", "filler kind",
                      choices=("constant", "uniform", "gaussian", "xavier", "msra",
                               "positive_unitball", "bilinear"))
    value: float = field(0.0, "constant: the value")
    min: float = field(0.0, "uniform: lower bound")
    max: float = field(1.0, "uniform: upper bound")
    mean: float = field(0.0, "gaussian: mean")
    std: float = field(1.0, "gaussian: standard deviation", min=0)
    sparse: int = field(-1, "gaussian: expected non-zeros per output (-1: dense)")
    variance_norm: str = field("FAN_IN", "xavier/msra: the n in the variance",
                               choices={"FAN_IN": 0, "FAN_OUT": 1, "AVERAGE": 2})

    def check(self, v: Check) -> None:
        if self.type == "uniform" and self.min > self.max:
            v.fail("max", f"uniform filler with min {self.min:g} > max {self.max:g}",
                   "give min <= max")
