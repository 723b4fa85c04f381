"""caffe-py's stand-in for pycaffe's ``caffe`` module, as a Caffe Python layer sees it.

A Caffe Python layer is written against pycaffe::

    import caffe
    class EuclideanLossLayer(caffe.Layer):
        def setup(self, bottom, top): ...
        def reshape(self, bottom, top): top[0].reshape(1)
        def forward(self, bottom, top): top[0].data[...] = ...
        def backward(self, top, propagate_down, bottom): bottom[0].diff[...] = ...

When caffe-py builds a Python layer and no ``caffe`` module is imported yet, this module is
registered as ``caffe`` (sys.modules), so such a file runs unchanged: it provides ``Layer``
(with ``blobs``, ``param_str``, ``phase``), ``TRAIN`` and ``TEST`` (0 and 1, as caffe_pb2), and
blobs whose ``data`` / ``diff`` are numpy arrays with ``reshape``, ``shape``, ``count`` and the
legacy ``num`` / ``channels`` / ``height`` / ``width``. Other pycaffe names (``caffe.Net``,
``caffe.io``) are pycaffe's whole interface, :mod:`caffe_py.pycaffe` (which takes ``Layer``,
``Blob``, ``TRAIN`` and ``TEST`` from here): an AttributeError says how to get it. Under
``python -m caffe_py.pycaffe``, ``import caffe`` is that whole interface.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


class Phase(int):
    """A phase: the int caffe_pb2 gives it (TRAIN 0, TEST 1) that prints as its name, as the
    enum Faster R-CNN's pycaffe exposes does (its layers look up ``cfg[str(self.phase)]``)."""

    name: str

    def __new__(cls, value: int, name: str) -> Phase:
        obj = super().__new__(cls, value)
        obj.name = name
        return obj

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__


TRAIN = Phase(0, "TRAIN")
TEST = Phase(1, "TEST")


class Blob:
    """A blob with numpy ``data`` and ``diff`` of one shape (pycaffe's ``caffe.Blob``)."""

    def __init__(self, shape: Sequence[int] = (), dtype: Any = np.float32):
        self._dtype = np.dtype(dtype)
        self._data = np.zeros(tuple(shape), self._dtype)
        self._diff = np.zeros(tuple(shape), self._dtype)

    @property
    def data(self) -> np.ndarray:
        return self._data

    @property
    def diff(self) -> np.ndarray:
        return self._diff

    def reshape(self, *shape: int) -> None:
        """Give the blob a new shape (new zero arrays when it changes), as Blob.reshape."""
        shape = tuple(int(d) for d in shape)
        if shape != self._data.shape:
            self._data = np.zeros(shape, self._dtype)
            self._diff = np.zeros(shape, self._dtype)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.shape

    @property
    def count(self) -> int:
        return int(self._data.size)

    def _legacy(self, index: int) -> int:
        # Caffe's LegacyShape: at most 4 axes; an axis the blob lacks counts as 1
        if self._data.ndim > 4:
            raise ValueError(f"num/channels/height/width need a blob of at most 4 axes, this "
                             f"one has shape {list(self._data.shape)}")
        return self._data.shape[index] if index < self._data.ndim else 1

    num = property(lambda self: self._legacy(0))
    channels = property(lambda self: self._legacy(1))
    height = property(lambda self: self._legacy(2))
    width = property(lambda self: self._legacy(3))

    def _bind(self, data: np.ndarray, diff: np.ndarray | None = None) -> None:
        """Point the blob at ``data`` (and ``diff``; zeros when None), whose dtype later
        reshapes keep: caffe-py's side only."""
        self._data = data
        self._diff = np.zeros_like(data) if diff is None else diff
        self._dtype = data.dtype

    def __repr__(self) -> str:
        return f"Blob(shape={list(self._data.shape)})"


class BlobVec(list):
    """A layer's learnable blobs (pycaffe's ``BlobVec``): a list with ``add_blob(*shape)``."""

    def add_blob(self, *shape: int) -> None:
        self.append(Blob(shape))


class Layer:
    """Base of a Caffe Python layer (pycaffe's ``caffe.Layer``). caffe-py sets ``param_str``
    and ``phase`` before ``setup``, calls ``setup`` then ``reshape`` when the net is built, and
    ``reshape`` then ``forward`` at each forward, as Caffe's Layer::SetUp and Layer::Forward."""

    def __init__(self, param: Any = None):
        self.blobs = BlobVec()
        self.param_str = ""
        self.phase = TRAIN

    def setup(self, bottom: list[Blob], top: list[Blob]) -> None:
        """Check the bottoms and create ``self.blobs`` (Caffe's LayerSetUp; default: nothing)."""

    def reshape(self, bottom: list[Blob], top: list[Blob]) -> None:
        """Shape the tops (Caffe's Reshape; default: nothing)."""

    @property
    def type(self) -> str:
        return "Python"


def __getattr__(name: str) -> Any:
    raise AttributeError(f"caffe.{name}: this 'caffe' is caffe-py's stand-in for pycaffe, "
                         "which gives Python layers Layer, TRAIN and TEST only; "
                         f"'{name}' belongs to pycaffe's whole interface: run the script with "
                         "python -m caffe_py.pycaffe (or cpy pycaffe), or use "
                         "caffe_py.pycaffe")
