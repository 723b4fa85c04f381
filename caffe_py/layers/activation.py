"""Layer family: activation (ReLU, PReLU, ELU, Sigmoid, TanH, AbsVal, Power, BNLL, Exp, Log,
Threshold, Clip, Swish).

Every layer keeps its bottom's shape. The backend is chosen once, when the layer is built,
from the ``engine`` field (Caffe's DEFAULT | CAFFE | CUDNN, plus CUDA and TORCH):

- TORCH: PyTorch's ops (caffe_py/kernels/reference.py).
- CUDA: the custom CUDA kernels (caffe_py/kernels/functions.py); an error on a CPU net.
- DEFAULT, CAFFE, CUDNN: on a CUDA net, whichever the benchmark measured faster for the layer
  kind (DEFAULT_BACKEND: PyTorch's op for ReLU/ELU/Sigmoid/TanH, the kernels for PReLU and for
  a bias + activation the fusion pass folds together); PyTorch's ops on a CPU net or when the
  extension does not build (a failed build warns once per process and falls back).

The net option ``activation_engine`` (CUDA or TORCH) replaces DEFAULT in every layer that
leaves ``engine`` at DEFAULT; PReLU, which has no engine field in Caffe, follows it too.

In place: when a layer's top names its bottom (Caffe's in-place form) and the net option
``inplace_activations`` is true, ReLU (negative_slope >= 0), ELU (alpha >= 0), Sigmoid and
TanH overwrite their input and keep only the output for the backward, which saves one tensor
per layer. It is opt-in because only the net knows whether an earlier layer's backward needs
that input: autograd's version counters raise at backward time if one does (for example a
Dropout working in place on a ReLU's output), so a wrong choice fails loudly, never silently.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels import build, functions, reference
from ..spec.layer_params.activation import ELUParameter, ReLUParameter
from ..spec.layer_params.shared import FillerParameter
from .base import Layer, Shape
from .registry import register

_NET_ENGINES = ("DEFAULT", "CUDA", "TORCH")


# The backend DEFAULT (and CAFFE, CUDNN) picks on a CUDA net: the faster one per layer kind in
# the run docs/kernels.md records; change a row only on benchmarks/activations.py's DEFAULT check.
DEFAULT_BACKEND = {"ReLU": "torch", "ELU": "torch", "Sigmoid": "torch", "TanH": "torch",
                   "PReLU": "cuda", "bias + activation": "cuda"}
# Below this many elements a fused bias + activation stays unfused under DEFAULT: the autograd
# Function's host time outweighs the bandwidth saved (docs/kernels.md, "Small tensors").
FUSE_MIN_ELEMENTS = 1 << 20


def resolved_engine(layer: Layer, engine: str) -> str:
    """The layer's engine with DEFAULT replaced by the net option activation_engine."""
    if engine == "DEFAULT":
        engine = layer.ctx.options.get("activation_engine", "DEFAULT")
        if engine not in _NET_ENGINES:
            raise layer.fail(f"the net option activation_engine is '{engine}'",
                             f"use one of {', '.join(_NET_ENGINES)}")
    return engine


def choose_backend(layer: Layer, engine: str) -> str:
    """'cuda' when ``engine`` lets the layer use the kernels on its device and they build."""
    engine = resolved_engine(layer, engine)
    if engine == "TORCH":
        return "torch"
    device = torch.device(layer.ctx.device)
    if device.type != "cuda":
        if engine == "CUDA":
            raise layer.fail(f"engine CUDA needs a CUDA device but the net is built on "
                             f"{device}", "build the net on a GPU, or use engine DEFAULT or "
                             "TORCH")
        return "torch"
    return "cuda" if build.available() else "torch"


def pick_backend(layer: Layer, engine: str, kind: str) -> tuple[str, bool]:
    """(backend, kernels allowed): CUDA forces the kernels, DEFAULT/CAFFE/CUDNN follow
    DEFAULT_BACKEND[kind]; 'kernels allowed' lets the fusion pass move the layer onto them."""
    allowed = choose_backend(layer, engine) == "cuda"
    forced = resolved_engine(layer, engine) == "CUDA"
    return ("cuda" if allowed and (forced or DEFAULT_BACKEND[kind] == "cuda") else "torch",
            allowed)


class _Elementwise(Layer):
    """One bottom, one top of the same shape."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        self.configure(bottom_shapes[0])
        return [bottom_shapes[0]]

    def configure(self, shape: Shape) -> None:
        """Read the parameters and choose the backend."""

    def in_place_requested(self) -> bool:
        """The spec names its top as its bottom and the net allows in-place activations."""
        return (self.spec.top[0] == self.spec.bottom[0]
                and bool(self.ctx.options.get("inplace_activations", False)))


class _Activation(_Elementwise):
    """ReLU, ELU, Sigmoid and TanH: one kind of the shared kernels, with parameter ``p``."""

    kind: int = reference.RELU

    def configure(self, shape: Shape) -> None:
        param = self.param()
        self.p = self.activation_parameter(param)
        self.backend, self.kernels_allowed = pick_backend(self, param.engine, self.spec.type)
        engine = resolved_engine(self, param.engine)
        self.fuse_forced = engine == "CUDA"
        self.top_elements = math.prod(shape)
        self._impl: Callable[..., torch.Tensor] = (
            functions.activation if self.backend == "cuda" else reference.activation)
        self.inplace = (self.in_place_requested()
                        and functions.output_derivable(self.kind, self.p))
        self.torch_forced = engine == "TORCH"
        self._bias_from: tuple[Layer, int] | None = None
        self.folded_into: str | None = None
        """The BatchNorm that applies this activation after its own (fuse_batchnorm_relu);
        this layer then passes its bottom through."""

    def activation_parameter(self, param) -> float:
        return 0.0

    def can_fuse(self) -> bool:
        """Whether the fusion pass may fold a bias in: the kernels are allowed, the
        activation is output-derivable, and (under DEFAULT) the tensor is large enough for
        the fused kernel to win (DEFAULT_BACKEND, FUSE_MIN_ELEMENTS)."""
        if not self.kernels_allowed or self._bias_from is not None:
            return False
        if not functions.output_derivable(self.kind, self.p):
            return False
        return self.fuse_forced or (DEFAULT_BACKEND["bias + activation"] == "cuda"
                                    and self.top_elements >= FUSE_MIN_ELEMENTS)

    def attach_bias(self, producer: Layer, axis: int) -> None:
        """Add ``producer``'s bias here, in the fused kernel (the fusion pass calls this).

        The layer moves onto the kernels. The bias stays the producer's parameter (same
        object, same blob order); it is read at each forward, so weight sharing that
        re-points it is followed.
        """
        if not self.kernels_allowed or not functions.output_derivable(self.kind, self.p):
            raise self.fail("cannot fuse a bias into this layer",
                            "fusion needs the CUDA backend and an output-derivable activation")
        self.backend = "cuda"
        self._impl = functions.activation
        self._bias_from = (producer, axis)

    @property
    def fused_bias(self) -> bool:
        return self._bias_from is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.folded_into is not None else self.activate(x)

    def activate(self, x: torch.Tensor) -> torch.Tensor:
        """This layer's activation of x (a BatchNorm that folded it in calls this on the
        inputs its fused kernel does not take)."""
        if self._bias_from is not None:
            producer, axis = self._bias_from
            # The producer (Convolution/InnerProduct) never needs its output for its backward.
            return functions.bias_activation(x, producer.bias, self.kind, self.p, axis,
                                             inplace=True)
        inplace = self.inplace and not (x.is_leaf and x.requires_grad)
        return self._impl(x, self.kind, self.p, inplace)

    def extra_repr(self) -> str:
        fused = ", fused bias" if self._bias_from is not None else ""
        if self.folded_into is not None:
            fused += f", folded into '{self.folded_into}'"
        return f"{super().extra_repr()}, backend={self.backend}, inplace={self.inplace}{fused}"


@register("ReLU")
class ReLU(_Activation):
    """Caffe's ReLU with negative_slope (leaky when it is not 0)."""

    kind = reference.RELU

    def activation_parameter(self, param: ReLUParameter) -> float:
        return param.negative_slope


@register("ELU")
class ELU(_Activation):
    kind = reference.ELU

    def activation_parameter(self, param: ELUParameter) -> float:
        return param.alpha


@register("Sigmoid")
class Sigmoid(_Activation):
    kind = reference.SIGMOID


@register("TanH")
class TanH(_Activation):
    kind = reference.TANH


@register("PReLU")
class PReLU(_Elementwise):
    """Learned slopes over axis 1: one per channel, or one shared (a 0-axis blob, as Caffe)."""


    def configure(self, shape: Shape) -> None:
        p = self.param()
        if len(shape) < 2:
            raise self.bottom_error(0, f"has shape {list(shape)}; PReLU needs at least 2 axes "
                                       "(N, C, ...)")
        filler = p.filler or FillerParameter(type="constant", value=0.25)
        count = 1 if p.channel_shared else shape[1]
        slope = self.add_blob("slope", (count,), filler)
        if p.channel_shared:  # Caffe's shared slope is a blob with no axes
            self.slope = nn.Parameter(slope.detach().reshape(()))
        self.backend, _ = pick_backend(self, "DEFAULT", "PReLU")
        self._impl: Callable[..., torch.Tensor] = (
            functions.prelu if self.backend == "cuda" else reference.prelu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._impl(x, self.slope)


@register("AbsVal")
class AbsVal(_Elementwise):
    """y = |x|; the gradient at 0 is 0, as Caffe's sign(0)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.abs(x)


@register("Power")
class Power(_Elementwise):
    """y = (shift + scale * x) ^ power, with Caffe's shortcuts for constant results."""


    def configure(self, shape: Shape) -> None:
        p = self.param()
        self.power, self.scale, self.shift = p.power, p.scale, p.shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale == 0.0 or self.power == 0.0:
            # Caffe: a constant (1 for power 0, else shift^power) whose gradient is 0; the
            # where() keeps x in the graph so that x still receives that zero gradient.
            value = 1.0 if self.power == 0.0 else self.shift ** self.power
            keep = torch.ones_like(x, dtype=torch.bool)
            return torch.where(keep, torch.full_like(x, value), x)
        base = x * self.scale + self.shift if (self.scale, self.shift) != (1.0, 0.0) else x
        if self.power == 1.0:
            return base if base is not x else x.clone()
        if self.power == 2.0:
            return base * base
        return torch.pow(base, self.power)


@register("BNLL")
class BNLL(_Elementwise):
    """y = log(1 + exp(x)), the binomial normal log likelihood; dy/dx = sigmoid(x).

    Caffe's gradient is e / (1 + e) with e = exp(min(x, 50)): PyTorch's softplus with
    threshold 50 computes the same (and returns x itself above 50, where they agree in float).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softplus(x, beta=1.0, threshold=50.0)


@register("Exp")
class Exp(_Elementwise):
    """y = base ^ (shift + scale * x) = outer * exp(inner * x), with Caffe's inner = scale *
    ln(base) and outer = base ^ shift (base -1 is e)."""

    def configure(self, shape: Shape) -> None:
        p = self.param()
        log_base = 1.0 if p.base == -1.0 else math.log(p.base)
        self.inner = log_base * p.scale
        self.outer = 1.0 if p.shift == 0.0 else (
            math.exp(p.shift) if p.base == -1.0 else p.base ** p.shift)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.exp(x if self.inner == 1.0 else x * self.inner)
        return y if self.outer == 1.0 else y * self.outer


@register("Log")
class Log(_Elementwise):
    """y = log_base(shift + scale * x) (base -1 is e)."""

    def configure(self, shape: Shape) -> None:
        p = self.param()
        self.scale, self.shift = p.scale, p.shift
        self.base_scale = 1.0 if p.base == -1.0 else 1.0 / math.log(p.base)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale != 1.0:
            x = x * self.scale
        if self.shift != 0.0:
            x = x + self.shift
        y = torch.log(x)
        return y if self.base_scale == 1.0 else y * self.base_scale


@register("Threshold")
class Threshold(_Elementwise):
    """y = 1 where x > threshold, else 0. A step has no useful gradient (Caffe's backward is
    not implemented): the top is a constant for autograd, so nothing flows back through it."""

    def configure(self, shape: Shape) -> None:
        self.threshold = self.param().threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.detach() > self.threshold).to(x.dtype)


@register("Clip")
class Clip(_Elementwise):
    """y = min(max(x, min), max); the gradient passes where min <= x <= max (both ends)."""

    def configure(self, shape: Shape) -> None:
        p = self.param()
        if p.min is None or p.max is None:
            raise self.fail("clip_param.min and clip_param.max are required",
                            "set both, e.g. clip_param: {min: 0, max: 6}")
        self.min, self.max = p.min, p.max

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, self.min, self.max)


@register("Swish")
class Swish(_Elementwise):
    """y = x * sigmoid(beta * x)."""

    def configure(self, shape: Shape) -> None:
        self.beta = self.param().beta

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(x if self.beta == 1.0 else x * self.beta)
