"""The blocks of the face-recognition forks' layers: SphereFace's MarginInnerProduct, AM-Softmax's
LabelSpecificAdd and caffe-face's CenterLoss, under each fork's field names and defaults."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Message, field
from .shared import FillerParameter


@dataclass
class MarginInnerProductParameter(Message):
    """SphereFace's (wy1iu/sphereface) A-Softmax inner product: unit-norm weights, the label's
    output |x| psi(theta) with margin m, blended with the plain one by lambda."""

    num_output: int = field(0, "the number of classes", min=1)
    type: str = field("SINGLE", "the margin m: SINGLE 1, DOUBLE 2, TRIPLE 3, QUADRUPLE 4",
                      choices={"SINGLE": 0, "DOUBLE": 1, "TRIPLE": 2, "QUADRUPLE": 3})
    weight_filler: FillerParameter | None = field(None, "weight init (none: zeros)")
    axis: int = field(1, "the first axis flattened into each inner product")
    base: float = field(1.0, "lambda = max(base * (1 + gamma * iteration)^-power, lambda_min)")
    gamma: float = field(0.0, "lambda's decay rate")
    power: float = field(1.0, "lambda's decay exponent")
    iteration: int = field(0, "the iteration the count starts from (each forward adds 1)")
    lambda_min: float = field(0.0, "lambda's floor")


@dataclass
class LabelSpecificAddParameter(Message):
    """AM-Softmax's (happynear/caffe-windows) margin: add ``bias`` to each item's label score
    where that score is above -bias (TRAIN only)."""

    bias: float = field(0.0, "added to the label's score (AM-Softmax: -m, e.g. -0.35)")
    transform_test: bool = field(False, "read but without effect in the fork (its TEST "
                                        "phase never adds)")
    bias_base: float = field(0.0, "when written, the bias anneals: bias_base + (1 + bias_gamma "
                                  "* iteration)^bias_power - 1, clipped to [bias_min, "
                                  "bias_max]")
    bias_gamma: float = field(0.0, "the annealing rate")
    bias_power: float = field(1.0, "the annealing exponent")
    bias_min: float = field(0.0, "the annealed bias's floor")
    bias_max: float = field(0.0, "the annealed bias's ceiling")
    iteration: int = field(0, "the iteration the annealing starts from", min=0)


@dataclass
class CenterLossParameter(Message):
    """caffe-face's (ydwen/caffe-face) center loss: one learned center per class."""

    num_output: int = field(0, "the number of classes (centers)", min=1)
    center_filler: FillerParameter | None = field(None, "the centers' init (none: zeros)")
    axis: int = field(1, "the first axis flattened into each feature")
