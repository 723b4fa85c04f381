"""The Layer base class: Caffe's Layer::SetUp/Reshape/Forward as an ``nn.Module``.

A layer is built once per net with the shapes of its bottoms. ``setup`` checks them, creates
the learnable blobs and returns the top shapes (shape inference happens at build time, so a
bad net fails before any data flows). ``forward`` takes bottom tensors and returns the tops;
it must work from the tensors it gets (the batch size may differ from the build shapes).

Blobs are kept in Caffe's order (``blob_names``), so weights copy by (layer name, index) to
and from .caffemodel-style snapshots. Learnable blobs are ``nn.Parameter``; state blobs that
Caffe stores but never trains (BatchNorm's statistics) are buffers.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from ..errors import NetError
from ..limits import Limit, memory_limit
from ..spec.layer_params.shared import FillerParameter
from ..spec.net_spec import LayerParameter
from ..spec.schema import message_at
from . import fillers

Shape = tuple[int, ...]
RECORD_FILLERS = "record_fillers"
"""A net option: a list that every :meth:`Layer.add_blob` appends (layer, blob name, filler,
the blob made) to, in build order (caffe_py.pycaffe refills the blobs from Caffe's own random
stream)."""


@dataclass
class BuildContext:
    """What a layer may know while it is built."""

    phase: str = "TRAIN"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    generator: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(0))
    """CPU generator for fillers: a net's initial weights depend only on the seed."""
    options: dict[str, Any] = field(default_factory=dict)
    """Net-wide switches (e.g. 'fuse_bias_activation': False); unknown keys are ignored."""


@dataclass
class DeviceCheck:
    """A condition a layer records on its device without a host sync (e.g. the range of the
    labels it has seen). The layer updates ``state`` (a small device tensor) in place; the
    solver copies it to the host every few iterations without stalling the device, and
    ``problem(host_copy)`` turns the copy into a one-line problem, or None when all is well."""

    state: torch.Tensor
    problem: Callable[[torch.Tensor], str | None]


class Layer(nn.Module):
    """Base of every layer type. Subclasses set the class attributes and define setup/forward."""

    type_name: ClassVar[str] = ""
    params: ClassVar[Mapping[str, type]] = {}
    """The ``<x>_param`` blocks this type takes, key -> message class: the type's entry in the
    spec's table (caffe_py.spec.layer_params), set by ``register``."""
    bottoms: ClassVar[tuple[int, int | None]] = (1, 1)
    """Allowed bottom count (min, max); max None means any number."""
    tops: ClassVar[tuple[int, int | None]] = (1, 1)
    """Allowed top count (min, max)."""
    capturable: ClassVar[bool] = True
    """Whether a CUDA graph can hold this layer's forward and backward (False for a layer that
    runs host code every forward, e.g. a Python layer)."""
    is_loss: ClassVar[bool] = False
    """Loss layers weight their first top by 1 unless loss_weight says otherwise."""

    if TYPE_CHECKING:
        # What add_blob sets by name is a blob (nn.Module's own hint says Tensor | Module).
        def __getattr__(self, name: str) -> torch.Tensor: ...

    def __init__(self, spec: LayerParameter, bottom_shapes: Sequence[Shape], ctx: BuildContext):
        super().__init__()
        self.spec = spec
        self.name = spec.name
        self.phase = ctx.phase
        self.ctx = ctx
        self.blob_names: list[str] = []
        self.device_checks: list[DeviceCheck] = []
        """Conditions this layer watches on the device (see :class:`DeviceCheck`)."""
        self.bottom_shapes = [tuple(s) for s in bottom_shapes]
        self._check_count("bottom", len(bottom_shapes), self.bottoms)
        self._check_count("top", len(spec.top), self.tops)
        self.top_shapes: list[Shape] = [tuple(int(d) for d in s)
                                        for s in self.setup(self.bottom_shapes)]
        if len(self.top_shapes) != len(spec.top):
            raise self.fail(f"produces {len(self.top_shapes)} tops but {len(spec.top)} are named")
        for top, shape in zip(spec.top, self.top_shapes, strict=True):
            self.check_fits(f"top '{top}'", shape)

    def check_fits(self, what: str, shape: Sequence[int], copies: int = 1) -> None:
        """Refuse, before anything is allocated, a blob or top whose float32 values (``copies``
        times) would not fit in the build device's memory."""
        size = math.prod(int(d) for d in shape) * 4 * copies
        limit = memory_of(self.ctx.device)
        if limit is not None and size > limit.bytes:
            kept = " (values, gradient and solver history)" if copies == 3 else ""
            raise self.fail(f"{what} of shape {list(shape)} needs {size / 2**30:,.1f} GiB{kept}, "
                            f"more than the {self.ctx.device.type} memory "
                            f"({limit.described()})", "make the layer or the batch smaller")

    # --- what subclasses define -------------------------------------------------------------
    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        """Check bottom shapes, create blobs, return top shapes."""
        raise NotImplementedError(f"{type(self).__name__}.setup")

    # --- data sources that keep their own read position (MemoryData, a dataset layer) --------
    def source_state(self) -> dict[str, Any] | None:
        """Where this layer reads next, as plain values, when it is a data source that keeps
        its own position (a solver state saves it, so that a resume reads on exactly); None
        for every other layer."""
        return None

    def load_source_state(self, state: Mapping[str, Any]) -> None:
        """Read on from where :meth:`source_state` was."""

    def bind_source(self, seed: int, replica: int = 0, replicas: int = 1) -> None:
        """The run's data seed (shuffled orders) and this replica's share of the records:
        records ``replica``, ``replica + replicas``, ... of the one order, as Caffe's
        DataReader hands them out. A no-op for layers that are not such sources."""

    # --- helpers for subclasses -------------------------------------------------------------
    def param(self, key: str | None = None) -> Any:
        """This layer's parameter block (the first declared one when ``key`` is None)."""
        return self.spec.params[key or next(iter(self.params))]

    def add_blob(self, name: str, shape: Sequence[int], filler: FillerParameter | None = None,
                 learnable: bool = True) -> torch.Tensor:
        """Create the next blob in Caffe order, initialised by ``filler`` (None: zeros)."""
        # training keeps a learnable blob three times: its values, gradient and solver history
        self.check_fits(f"blob '{name}'", shape, copies=3 if learnable else 1)
        try:
            value = fillers.fill(filler, tuple(shape), self.ctx.generator)
        except fillers.FillerError as exc:
            raise self.fail(f"blob '{name}': {exc.args[0]}", exc.args[1]) from None
        value = value.to(self.ctx.device)
        if learnable:
            setattr(self, name, nn.Parameter(value))
        else:
            self.register_buffer(name, value)
        self.blob_names.append(name)
        record = self.ctx.options.get(RECORD_FILLERS)
        if record is not None:  # who fills what, in build order (pycaffe redraws them)
            record.append((self, name, filler, getattr(self, name)))
        return getattr(self, name)

    def generators(self) -> dict[str, torch.Generator]:
        """The random generators this layer keeps for itself, by attribute name (a solver
        state saves them; a CUDA graph replays those on the device)."""
        return {name: v for name, v in vars(self).items() if isinstance(v, torch.Generator)}

    def blobs(self) -> list[torch.Tensor]:
        """All blobs in Caffe order (learnable and state)."""
        return [getattr(self, n) for n in self.blob_names]

    def fail(self, problem: str, fix: str | None = None) -> NetError:
        """An error about this layer, with its file:line when it came from a file."""
        return NetError(message_at(self.spec, problem, fix, named=True))

    def bottom_error(self, index: int, problem: str, fix: str | None = None) -> NetError:
        """An error about bottom ``index``, naming the blob."""
        blob = self.spec.bottom[index] if index < len(self.spec.bottom) else f"#{index}"
        return self.fail(f"bottom '{blob}' (index {index}) {problem}", fix)

    def require_axes(self, index: int, shape: Shape, n: int | Sequence[int]) -> None:
        """Fail unless bottom ``index`` has ``n`` axes (or one of several counts)."""
        allowed = (n,) if isinstance(n, int) else tuple(n)
        if len(shape) not in allowed:
            want = " or ".join(str(a) for a in allowed)
            raise self.bottom_error(index, f"has shape {list(shape)}; expected {want} axes")

    def _check_count(self, what: str, n: int, bounds: tuple[int, int | None]) -> None:
        lo, hi = bounds
        if n < lo or (hi is not None and n > hi):
            if hi == lo:
                want = f"exactly {lo}"
            elif hi is None:
                want = f"at least {lo}"
            else:
                want = f"{lo} to {hi}"
            raise self.fail(f"takes {want} {what}(s), got {n}")

    def extra_repr(self) -> str:
        return f"name={self.name!r}, tops={self.top_shapes}"


def canonical_axis(layer: Layer, axis: int, num_axes: int, what: str = "axis") -> int:
    """Caffe's CanonicalAxisIndex: negative axes count from the end; out of range fails."""
    if not -num_axes <= axis < num_axes:
        raise layer.fail(f"{what} {axis} is out of range for a blob with {num_axes} axes")
    return axis % num_axes


def count(shape: Sequence[int], start: int = 0, end: int | None = None) -> int:
    """The product of ``shape[start:end]`` (Caffe's Blob::count)."""
    return math.prod(shape[start:end])


def memory_of(device: torch.device) -> Limit | None:
    """The memory of ``device``: a GPU's, or for the CPU the smallest of the machine's, the
    address-space limit and the cgroup's (caffe_py.limits); None when unknown."""
    if device.type == "cuda":
        try:
            return Limit(int(torch.cuda.get_device_properties(device).total_memory), "")
        except (RuntimeError, AssertionError):  # no CUDA here: the copy to it will say so
            return None
    if device.type != "cpu":
        return None
    return memory_limit()
