"""The blocks of the common layers: InnerProduct, Flatten, Reshape, Concat, Slice, Eltwise,
Softmax, Dropout."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Check, Message, field, is_set
from .shared import ENGINE_NUMBERS, FillerParameter


@dataclass
class InnerProductParameter(Message):
    """A fully connected layer (Caffe's InnerProductParameter)."""

    num_output: int = field(0, "the number of outputs N", min=0)
    bias_term: bool = field(True, "add a learnable bias of shape (N,)")
    weight_filler: FillerParameter | None = field(None, "weight init (none: zeros, as Caffe)")
    bias_filler: FillerParameter | None = field(None, "bias init (none: zeros, as Caffe)")
    axis: int = field(1, "the first axis flattened into the K inputs (negative from the end)")
    transpose: bool = field(False, "store the weight as (K, N) instead of (N, K)")


@dataclass
class FlattenParameter(Message):
    """Which axes a Flatten layer merges (Caffe's FlattenParameter)."""

    axis: int = field(1, "the first axis merged (negative from the end)")
    end_axis: int = field(-1, "the last axis merged, inclusive (negative from the end)")


@dataclass
class ReshapeShape(Message):
    """Reshape's BlobShape, whose dims may also be 0 (copy) or -1 (infer)."""

    dim: list[int] = field([], "the new dims: a size, 0 (copy the bottom's) or -1 (infer)")


@dataclass
class ReshapeParameter(Message):
    """The new shape of a Reshape layer (Caffe's ReshapeParameter)."""

    shape: ReshapeShape = field(ReshapeShape(), "new dims: 0 copies the bottom's dim, -1 is "
                                                "inferred")
    axis: int = field(0, "the first bottom axis replaced (negative: -1 is after the last axis)")
    num_axes: int = field(-1, "how many bottom axes are replaced (-1: all from axis on)",
                          min=-1)

    def check(self, v: Check) -> None:
        if any(d < -1 for d in self.shape.dim):
            v.fail("shape", f"shape {self.shape.dim} has a dim below -1",
                   "dims are sizes, 0 (copy) or -1 (infer)")
        if self.shape.dim.count(-1) > 1:
            v.fail("shape", f"shape {self.shape.dim} has more than one -1",
                   "at most one dim may be inferred")


@dataclass
class ConcatParameter(Message):
    """The axis a Concat layer joins along (Caffe's ConcatParameter)."""

    axis: int = field(1, "the axis joined along (negative from the end)")
    concat_dim: int = field(1, "legacy name for a non-negative axis", min=0)

    def check(self, v: Check) -> None:
        if is_set(self, "axis") and is_set(self, "concat_dim"):
            v.fail("concat_dim", "axis and concat_dim are both set", "keep only axis")


@dataclass
class SliceParameter(Message):
    """Where a Slice layer cuts (Caffe's SliceParameter)."""

    axis: int = field(1, "the axis cut along (negative from the end)")
    slice_point: list[int] = field([], "cut positions, increasing (one fewer than the tops); "
                                       "none: equal parts", min=0)
    slice_dim: int = field(1, "legacy name for a non-negative axis", min=0)

    def check(self, v: Check) -> None:
        if is_set(self, "axis") and is_set(self, "slice_dim"):
            v.fail("slice_dim", "axis and slice_dim are both set", "keep only axis")


@dataclass
class EltwiseParameter(Message):
    """How an Eltwise layer combines its bottoms (Caffe's EltwiseParameter)."""

    operation: str = field("SUM", "element-wise PROD, SUM or MAX",
                           choices={"PROD": 0, "SUM": 1, "MAX": 2})
    coeff: list[float] = field([], "SUM only: one coefficient per bottom (none: all 1)")
    stable_prod_grad: bool = field(True, "PROD: Caffe's choice of gradient formula; autograd's "
                                         "product of the other bottoms is the stable one")

    def check(self, v: Check) -> None:
        if self.coeff and self.operation != "SUM":
            v.fail("coeff", f"coeff is given for operation {self.operation}",
                   "coefficients apply to SUM only; remove coeff")


@dataclass
class SoftmaxParameter(Message):
    """Softmax and SoftmaxWithLoss: the axis the probabilities sum to 1 over."""

    axis: int = field(1, "the class axis (negative counts from the end)")
    engine: str = field("DEFAULT", "implementation", choices={**ENGINE_NUMBERS, "TORCH": None})


@dataclass
class DropoutParameter(Message):
    """How much a Dropout layer drops (Caffe's DropoutParameter)."""

    dropout_ratio: float = field(0.5, "the probability that an element is zeroed in TRAIN",
                                 min=0.0)
    scale_train: bool = field(True, "scale kept elements by 1/(1-ratio) in TRAIN (false: "
                                    "scale by (1-ratio) in TEST instead)")
    sample_weights_test: bool = field(False, "SegNet's fork (Bayesian SegNet): drop at "
                                             "random in TEST too (Monte Carlo dropout)")

    def check(self, v: Check) -> None:
        if self.dropout_ratio >= 1.0:
            v.fail("dropout_ratio", f"dropout_ratio {self.dropout_ratio} drops everything",
                   "use a value in [0, 1)")
