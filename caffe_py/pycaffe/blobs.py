"""The memory behind pycaffe's blobs: Caffe's ``data`` and ``diff`` as numpy views.

A Caffe blob is memory that layers read and write in place; pycaffe hands out numpy arrays
over it, so that ``net.blobs['data'].data[...] = x`` is what the next forward reads and
``net.params['conv1'][0].data`` is the weights themselves. Here each blob of a net has a
:class:`Memory` (two float32 tensors on the host, C-contiguous as Caffe's), a layer's output is
copied into it, and :class:`NetBlob` / :class:`ParamBlob` are pycaffe's ``Blob`` over a
memory or over a learnable parameter (whose ``diff`` lives in :func:`param_diff`).
"""
from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..layers import pycaffe as standin
from .errors import missing

if TYPE_CHECKING:
    from .wiring import Step

_DIFFS: dict[int, torch.Tensor] = {}
_MIRRORS: dict[int, tuple[weakref.ref, torch.Tensor]] = {}


def host_data(param: torch.Tensor) -> torch.Tensor:
    """The host memory of a learnable blob: the tensor itself on the CPU; for one on a GPU, a
    host copy that :func:`push_mirrors` writes back before layers run and
    :func:`pull_mirrors` refreshes after (Caffe's SyncedMemory, by hand)."""
    if param.device.type == "cpu":
        return param.detach()
    key = id(param)
    entry = _MIRRORS.get(key)
    if entry is None or entry[0]() is not param:
        entry = (weakref.ref(param), param.detach().to("cpu", torch.float32))
        weakref.finalize(param, _MIRRORS.pop, key, None)
        _MIRRORS[key] = entry
    return entry[1]


def push_mirrors() -> None:
    """Host copies of GPU parameters (written by a script) to the parameters."""
    with torch.no_grad():
        for ref, mirror in list(_MIRRORS.values()):
            param = ref()
            if param is not None:
                param.copy_(mirror.to(param.device))


def pull_mirrors() -> None:
    """GPU parameters (changed by a pass or an update) to their host copies."""
    for ref, mirror in list(_MIRRORS.values()):
        param = ref()
        if param is not None:
            mirror.copy_(param.detach().to("cpu", torch.float32))


def param_diff(param: torch.Tensor) -> torch.Tensor:
    """The ``diff`` of a learnable blob (host float32, its shape), one per parameter object
    (so a TRAIN net and the TEST nets that share its weights share the diffs too)."""
    key = id(param)
    diff = _DIFFS.get(key)
    if diff is None or tuple(diff.shape) != tuple(param.shape):
        diff = torch.zeros(tuple(param.shape), dtype=torch.float32)
        if key not in _DIFFS:
            weakref.finalize(param, _DIFFS.pop, key, None)
        _DIFFS[key] = diff
    return diff


class Memory:
    """One blob's memory: ``data`` and ``diff`` (host float32 tensors). A Split's top shares
    its ``data`` with the Split's bottom (``source``), as Caffe's SplitLayer shares it."""

    __slots__ = ("_data", "diff", "source", "loss_weight", "__weakref__")

    def __init__(self, shape: Sequence[int] = (), loss_weight: float = 0.0,
                 source: Memory | None = None):
        self.source = source
        self._data = torch.zeros(tuple(shape)) if source is None else None
        self.loss_weight = loss_weight
        self.diff = self._new_diff(tuple(shape))

    def _new_diff(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Caffe's Layer::SetLossWeights: a loss top's diff holds its loss weight."""
        return torch.full(shape, float(self.loss_weight)) if self.loss_weight else \
            torch.zeros(shape)

    @property
    def data(self) -> torch.Tensor:
        if self.source is not None:
            return self.source.data
        assert self._data is not None
        return self._data

    def put(self, value: torch.Tensor) -> None:
        """A layer wrote ``value`` into this blob (copied; the memory is reallocated when the
        shape changes, as Caffe's Reshape does when a blob grows)."""
        if self.source is not None:
            self.source.put(value)
            return
        value = value.detach()
        if value.device.type != "cpu" or value.dtype != torch.float32:
            value = value.to("cpu", torch.float32)
        data = self.data
        if tuple(value.shape) == tuple(data.shape):
            data.copy_(value)
        else:
            self._data = value.clone(memory_format=torch.contiguous_format)
        if tuple(self.diff.shape) != tuple(value.shape):
            self.diff = self._new_diff(tuple(value.shape))

    def put_diff(self, value: torch.Tensor) -> None:
        """A backward wrote ``value`` into this blob's diff."""
        value = value.detach().to("cpu", torch.float32)
        if tuple(value.shape) == tuple(self.diff.shape):
            self.diff.copy_(value)
        else:
            self.diff = value.reshape(tuple(self.diff.shape)).clone() \
                if value.numel() == self.diff.numel() else value.clone()

    def reshape(self, shape: Sequence[int]) -> None:
        """Blob::Reshape: the same memory when the count is kept, else zeroed memory."""
        shape = tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"Blob.reshape: negative dimension in {list(shape)}")
        if self.source is not None:
            self.source.reshape(shape)
        elif shape != tuple(self.data.shape):
            same = math.prod(shape) == self.data.numel()
            self._data = self.data.reshape(shape) if same else torch.zeros(shape)
        if shape != tuple(self.diff.shape):
            self.diff = self.diff.reshape(shape) if math.prod(shape) == self.diff.numel() \
                else self._new_diff(shape)


class NetBlob(standin.Blob):
    """pycaffe's ``caffe.Blob`` of a net: ``data`` / ``diff`` are writable numpy views."""

    def __init__(self, memory: Memory):  # the stand-in's own arrays are not used
        self._memory = memory

    @property
    def data(self) -> np.ndarray:
        return self._memory.data.numpy()

    @property
    def diff(self) -> np.ndarray:
        return self._memory.diff.numpy()

    def _legacy(self, index: int) -> int:
        return _legacy(tuple(self._memory.data.shape), index)

    @property
    def shape(self) -> tuple[int, ...]:  # pycaffe gives Caffe's vector<int>: a sequence
        return tuple(self._memory.data.shape)

    @property
    def count(self) -> int:
        return int(self._memory.data.numel())

    def reshape(self, *shape: int) -> None:
        self._memory.reshape(shape)

    def __getattr__(self, name: str) -> Any:
        raise missing("caffe.Blob", name, _BLOB_NAMES)

    def __repr__(self) -> str:
        return f"Blob(shape={self.shape})"


class ParamBlob(standin.Blob):
    """pycaffe's ``caffe.Blob`` of a layer's parameter: ``data`` is the weights themselves
    (a numpy view; writes are net surgery), ``diff`` their gradient memory. The tensor is
    looked up through its layer at each use (``blobs()`` of what ``layer()`` returns), so
    that sharing set up later (a TEST net's first test) shows."""

    def __init__(self, layer: Callable[[], Any], index: int, owner: str):
        self._layer = layer
        self._index = index
        self._owner = owner

    @property
    def _param(self) -> torch.Tensor:
        return self._layer().blobs()[self._index]

    @property
    def data(self) -> np.ndarray:
        return host_data(self._param).numpy()

    @property
    def diff(self) -> np.ndarray:
        return param_diff(self._param).numpy()

    def _legacy(self, index: int) -> int:
        return _legacy(tuple(self._param.shape), index)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._param.shape)

    @property
    def count(self) -> int:
        return int(self._param.numel())

    def reshape(self, *shape: int) -> None:
        raise missing(f"caffe.Blob (a parameter of layer '{self._owner}')", "reshape",
                      ["data", "diff", "shape", "count"])

    def __getattr__(self, name: str) -> Any:
        raise missing("caffe.Blob", name, _BLOB_NAMES)

    def __repr__(self) -> str:
        return f"Blob(shape={self.shape})"


class LayerView:
    """pycaffe's ``net.layers[i]``: its ``type`` and its ``blobs``."""

    def __init__(self, step: Step):
        self._step = step

    @property
    def type(self) -> str:
        return self._step.type

    @property
    def blobs(self) -> list[ParamBlob]:
        return param_blobs(self._step)

    def __getattr__(self, name: str) -> Any:
        raise missing("caffe.Layer", name, ["type", "blobs"])

    def __repr__(self) -> str:
        return f"<Layer {self._step.name} ({self._step.type})>"


class Capture:
    """A forward hook copying a layer's outputs into its tops' memory (and, when they carry a
    gradient, the gradient into their diffs)."""

    def __init__(self, tops: list[Memory]):
        self.tops = tops

    def __call__(self, module: Any, args: Any, output: Any) -> None:
        outs = () if output is None else (output,) if isinstance(output, torch.Tensor) \
            else tuple(output)
        for memory, value in zip(self.tops, outs, strict=False):
            memory.put(value)
            if value.requires_grad:
                value.register_hook(memory.put_diff)


def param_blobs(step: Step) -> list[ParamBlob]:
    """The blobs of a layer as pycaffe's Blobs (none for a Split)."""
    if step.layer is None:
        return []
    return [ParamBlob(lambda: step.layer, i, step.name)
            for i in range(len(step.layer.blob_names))]


def python_object(step: Step) -> Any:
    """The user's object behind a Caffe-form Python layer (pycaffe's ``net.layers[i]``)."""
    impl = getattr(step.layer, "impl", None)
    return getattr(impl, "obj", None) if step.type == "Python" else None


_BLOB_NAMES = ["data", "diff", "shape", "count", "reshape", "num", "channels", "height",
               "width"]


def _legacy(shape: tuple[int, ...], index: int) -> int:
    """Caffe's LegacyShape: at most 4 axes; an axis the blob lacks counts as 1."""
    if len(shape) > 4:
        raise ValueError(f"num/channels/height/width need a blob of at most 4 axes, this one "
                         f"has shape {list(shape)}")
    return shape[index] if index < len(shape) else 1
