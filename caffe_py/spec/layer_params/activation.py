"""The blocks of the activation layers: ReLU, PReLU, ELU, Sigmoid, TanH, Power."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Message, field
from .shared import FillerParameter

ENGINES = ("DEFAULT", "CAFFE", "CUDNN", "CUDA", "TORCH")
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
