"""Caffe's own random stream in a pycaffe process, and what draws from it.

Caffe keeps one mt19937 per thread (``Caffe::rng_stream``); ``caffe.set_random_seed(s)`` and a
solver's ``random_seed`` seed the main thread's, which is otherwise seeded from the clock. In
BVLC's examples every random number that matters comes from it: the weight fillers (drawn in
layer order as each net is set up, a TRAIN net before its solver's TEST nets), the draws each
data layer's setup takes, and Dropout's masks at every TRAIN forward. caffe-py's nets draw
from torch's generators instead; a net made through :mod:`caffe_py.pycaffe` redraws its
fillers from this stream and takes its Dropout masks from it, so that a seeded pycaffe script
gets the same weights and the same dropped units as under BVLC's pycaffe
(:mod:`caffe_py.io.db.caffe_rng` reproduces boost's distributions).
"""
from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..io.db.caffe_rng import GlobalDraws, Mt19937, bernoullis, normals, uniform_reals
from ..spec.layer_params.shared import FillerParameter


class CaffeStream:
    """The main thread's ``Caffe::rng_stream()``: seeded by :meth:`seed`, else by the clock."""

    def __init__(self) -> None:
        self._rng: Mt19937 | None = None

    def seed(self, seed: int) -> None:
        """``Caffe::set_random_seed(seed)``."""
        self._rng = Mt19937(int(seed) & 0xFFFFFFFF)

    @property
    def rng(self) -> Mt19937:
        if self._rng is None:  # Caffe: cluster_seedgen(), from the clock and the pid
            self._rng = Mt19937((time.time_ns() ^ (os.getpid() << 16)) & 0xFFFFFFFF)
        return self._rng


STREAM = CaffeStream()


def drawn_filler(spec: FillerParameter | None, shape: Sequence[int]) -> np.ndarray | None:
    """The values Caffe's filler ``spec`` draws for a blob of ``shape`` (filler.hpp), from
    :data:`STREAM`; None for fillers that draw nothing (constant, bilinear, no filler)."""
    if spec is None or spec.type in ("constant", "bilinear"):
        return None
    rng = STREAM.rng
    count = math.prod(shape)
    if spec.type == "uniform":
        return uniform_reals(rng, count, spec.min, spec.max)
    if spec.type == "gaussian":
        values = normals(rng, count, spec.mean, spec.std)
        if spec.sparse >= 0:  # each value kept with probability sparse / num_outputs
            keep = np.float32(spec.sparse) / np.float32(shape[0])
            values = values * bernoullis(rng, count, float(keep)).astype(np.float32)
        return values
    if spec.type == "positive_unitball":
        values = uniform_reals(rng, count, 0.0, 1.0).reshape(shape[0], -1)
        sums = np.zeros(shape[0], np.float32)
        for j in range(values.shape[1]):  # Caffe's running float sum, in order
            sums += values[:, j]
        return (values / sums[:, None]).reshape(-1)
    n = _fan(spec, shape)
    if spec.type == "xavier":
        scale = np.sqrt(np.float32(3) / n)
        return uniform_reals(rng, count, -scale, scale)
    if spec.type == "msra":
        return normals(rng, count, 0.0, float(np.sqrt(np.float32(2) / n)))
    return None


def _fan(spec: FillerParameter, shape: Sequence[int]) -> np.float32:
    """Caffe's ``n`` for xavier and msra, as a float (fan_in unless variance_norm says)."""
    count = math.prod(shape)
    fan_in = count // shape[0]
    fan_out = count // shape[1] if len(shape) > 1 else count
    if spec.variance_norm == "AVERAGE":
        return np.float32(fan_in + fan_out) / np.float32(2)
    return np.float32(fan_out if spec.variance_norm == "FAN_OUT" else fan_in)


def refill(net: Any, fills: Sequence[tuple[Any, str, FillerParameter | None, Any]]) -> None:
    """Redraw the blobs of a caffe-py ``net`` just built as Caffe's setup draws them: layer by
    layer, a data layer's setup draws (its ``feed_spec`` takes them) and each blob's filler in
    creation order (``fills``: what the build recorded, this net's entries). A blob that shares
    the memory of one drawn before (weight sharing by ``param.name``) is drawn but not
    written, as Caffe draws a sharer's values and then shares."""
    rng = STREAM.rng
    by_layer: dict[int, list[tuple[str, FillerParameter | None]]] = {}
    for layer, name, spec, _made in fills:
        by_layer.setdefault(id(layer), []).append((name, spec))
    written: set[int] = set()
    for layer in net.layers:
        if getattr(layer, "fed", False):
            layer.feed_spec(0, GlobalDraws.on(rng))
        for name, spec in by_layer.get(id(layer), []):
            tensor = getattr(layer, name)
            values = drawn_filler(spec, tuple(tensor.shape))
            memory = tensor.untyped_storage().data_ptr()
            if values is None or memory in written:
                written.add(memory)
                continue
            written.add(memory)
            with torch.no_grad():
                tensor.copy_(torch.from_numpy(values.reshape(tuple(tensor.shape))))


def dropout_mask(ratio: float, shape: tuple[int, ...]) -> torch.Tensor:
    """Caffe's Dropout mask: ``caffe_rng_bernoulli(count, 1. - threshold_)`` in double."""
    keep = 1.0 - float(np.float32(ratio))
    mask = bernoullis(STREAM.rng, math.prod(shape), keep, double=True)
    return torch.from_numpy(mask.astype(np.float32).reshape(shape))


def use_caffe_dropout(net: Any) -> None:
    """Give the TRAIN Dropout layers of ``net`` Caffe's masks (drawn from :data:`STREAM`)."""
    for layer in net.layers:
        if layer.spec.type == "Dropout" and layer.phase == "TRAIN":
            layer.mask_source = functools.partial(dropout_mask, layer.ratio)
