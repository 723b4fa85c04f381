"""The blocks of the activation layers: ReLU, PReLU, ELU, Sigmoid, TanH, Power, Exp, Log,
Threshold, Clip, Swish."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Check, Message, field
from .shared import ENGINE_NUMBERS, FillerParameter

ENGINES = {**ENGINE_NUMBERS, "CUDA": None, "TORCH": None}  # caffe.proto's, then caffe-py's
_ENGINE_DOC = ("implementation: DEFAULT/CAFFE/CUDNN pick the faster of the CUDA kernels and "
               "PyTorch's op on a GPU net (measured per layer kind), CUDA requires the kernels, "
               "TORCH uses PyTorch's ops")


@dataclass
class ReLUParameter(Message):
    """ReLU: y = max(x, 0) + negative_slope * min(x, 0)."""

    negative_slope: float = field(0.0, "slope for x <= 0 (0: plain ReLU, > 0: leaky ReLU)")
    engine: str = field("DEFAULT", _ENGINE_DOC, choices=ENGINES)


@dataclass
class PReLUParameter(Message):
    """PReLU: ReLU with a learned slope per channel (axis 1), or one shared slope."""

    filler: FillerParameter | None = field(None, "initial slopes (none: constant 0.25, as Caffe)")
    channel_shared: bool = field(False, "one slope for every channel instead of one each")


@dataclass
class ELUParameter(Message):
    """ELU: y = x for x > 0, alpha * (exp(x) - 1) otherwise."""

    alpha: float = field(1.0, "the value y approaches as x goes to minus infinity, negated")
    engine: str = field("DEFAULT", _ENGINE_DOC, choices=ENGINES)


@dataclass
class SigmoidParameter(Message):
    """Sigmoid: y = 1 / (1 + exp(-x))."""

    engine: str = field("DEFAULT", _ENGINE_DOC, choices=ENGINES)


@dataclass
class TanHParameter(Message):
    """TanH: y = tanh(x)."""

    engine: str = field("DEFAULT", _ENGINE_DOC, choices=ENGINES)


@dataclass
class PowerParameter(Message):
    """Power: y = (shift + scale * x) ^ power."""

    power: float = field(1.0, "the exponent")
    scale: float = field(1.0, "multiplies x first")
    shift: float = field(0.0, "added after scaling")


@dataclass
class ExpParameter(Message):
    """Exp: y = base ^ (shift + scale * x); base -1 means e."""

    base: float = field(-1.0, "the base, > 0 (-1: e)")
    scale: float = field(1.0, "multiplies x first")
    shift: float = field(0.0, "added after scaling")

    def check(self, v: Check) -> None:
        check_base(self.base, v)


@dataclass
class LogParameter(Message):
    """Log: y = log_base(shift + scale * x); base -1 means e."""

    base: float = field(-1.0, "the base, > 0 and not 1 (-1: e)")
    scale: float = field(1.0, "multiplies x first")
    shift: float = field(0.0, "added after scaling")

    def check(self, v: Check) -> None:
        check_base(self.base, v)
        if self.base == 1.0:
            v.fail("base", "base 1 has log(base) = 0, so log_1 is undefined",
                   "use a base > 0 other than 1, or -1 for e")


def check_base(base: float, v: Check) -> None:
    """Caffe's CHECK_GT(base, 0) unless base is -1 (e)."""
    if base != -1.0 and base <= 0.0:
        v.fail("base", f"base {base:g} is not positive", "use a base > 0, or -1 for e")


@dataclass
class ThresholdParameter(Message):
    """Threshold: y = 1 where x > threshold, else 0."""

    threshold: float = field(0.0, "values strictly above it give 1")


@dataclass
class ClipParameter(Message):
    """Clip: y = min(max(x, min), max). Both bounds are required (as in caffe.proto)."""

    min: float | None = field(None, "the lower bound (required)")
    max: float | None = field(None, "the upper bound (required)")

    def check(self, v: Check) -> None:
        for bound in ("min", "max"):
            if getattr(self, bound) is None:
                v.fail(None, f"clip_param.{bound} is required", f"set clip_param.{bound}")


@dataclass
class SwishParameter(Message):
    """Swish: y = x * sigmoid(beta * x)."""

    beta: float = field(1.0, "scales x inside the sigmoid")
