"""Caffe's layer list and blob list for a caffe-py net: Net::Init as pycaffe sees it.

Caffe's InsertSplits gives a blob that several layers read a Split layer
(``<blob>_<layer>_<k>_split``) whose tops (``..._split_<n>``) share its data, one per reader;
a loss weight written on a top that is also read counts as a reader. The blobs are numbered in
the order layers first write them (in-place tops reuse their bottom's), the net's outputs are
the blobs no layer reads, sorted by name, and each layer's backward flags follow Net::Init
(needs backward when a bottom needs it or a parameter learns, and only when it contributes to
a loss, unless force_backward).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..layers.base import Layer
from ..net import AUTOMATIC
from ..net import Net as CaffePyNet
from .blobs import Memory

NO_FORCED_BACKWARD = {
    "SoftmaxWithLoss": (1,), "SigmoidCrossEntropyLoss": (1,), "HingeLoss": (1,),
    "InfogainLoss": (1,), "MultinomialLogisticLoss": (1,), "ContrastiveLoss": (2,),
    "RNN": (1,), "LSTM": (1,), "LSTMUnit": (2,)}
"""Bottoms that force_backward does not reach (Caffe's AllowForceBackward): labels and
sequence flags."""


@dataclass
class Step:
    """One layer of Caffe's layer list (a caffe-py layer, or a Split Caffe inserts)."""

    name: str
    type: str
    layer: Layer | None
    bottoms: list[int]
    tops: list[int]
    loss: list[float]
    need_backward: bool = False
    bottom_need: list[bool] = field(default_factory=list)



@dataclass
class Wiring:
    """A net as Caffe lays it out: its layer list and its blobs (id -> name, memory)."""

    steps: list[Step] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    memory: list[Memory] = field(default_factory=list)
    input_ids: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    loss_weights: list[float] = field(default_factory=list)


def wire(net: CaffePyNet) -> Wiring:
    """Caffe's InsertSplits and Net::Init over a caffe-py net's layers: the layer list, the
    blobs in Caffe's order (with their memory, shaped as built), loss weights, inputs,
    outputs and the backward flags."""
    layers = list(net.layers)
    splits = _splits(layers)
    w = Wiring()
    by_name: dict[str, int] = {}
    available: dict[str, None] = {}

    def new_blob(name: str, source: Memory | None = None) -> int:
        w.names.append(name)
        w.memory.append(Memory((), source=source))
        return len(w.names) - 1

    for i, layer in enumerate(layers):
        bottoms = [by_name[b] for b in splits.bottoms[i]]
        for b in splits.bottoms[i]:
            available.pop(b, None)
        tops: list[int] = []
        for j, top_name in enumerate(layer.spec.top):
            if j < len(layer.spec.bottom) and splits.bottoms[i][j] == top_name:
                tops.append(by_name[top_name])         # in place
                continue
            if _automatic(top_name):  # a loss layer's anonymous top: no layer reads it
                tops.append(new_blob(AUTOMATIC))
                continue
            by_name[top_name] = new_blob(top_name)
            tops.append(by_name[top_name])
            available[top_name] = None
        loss = [_layer_loss(layer, j, splits.cleared[i]) for j in range(len(tops))]
        w.steps.append(Step(layer.name, layer.spec.type, layer, bottoms, tops, loss))
        if layer.spec.type == "Input":
            w.input_ids += tops
        for top_index, count, weight in splits.after[i]:
            source_name = layer.spec.top[top_index]
            source = by_name[source_name]
            available.pop(source_name, None)
            split_tops = []
            for k in range(count):
                name = _split_blob(layer.name, source_name, top_index, k)
                by_name[name] = new_blob(name, source=w.memory[source])
                split_tops.append(by_name[name])
                available[name] = None
            losses = [weight if k == 0 else 0.0 for k in range(count)]
            w.steps.append(Step(_split_layer(layer.name, source_name, top_index),
                                "Split", None, [source], split_tops, losses))
    w.output_ids = [by_name[name] for name in sorted(available)]
    w.loss_weights = [0.0] * len(w.names)
    for step in w.steps:
        for top, weight in zip(step.tops, step.loss, strict=True):
            w.loss_weights[top] = weight
    for blob, weight in enumerate(w.loss_weights):
        if weight:
            memory = w.memory[blob]
            memory.loss_weight = weight
            memory.diff = torch.full(tuple(memory.diff.shape), float(weight))
    for name, shape in net.blobs.items():  # build shapes, until the first forward
        if name in by_name and not _automatic(name):
            w.memory[by_name[name]].reshape(shape)
    for step in w.steps:
        if step.layer is None:  # a Split's tops: the shape of its bottom
            shape = tuple(w.memory[step.bottoms[0]].data.shape)
            for top in step.tops:
                w.memory[top].reshape(shape)
        for top, shape in zip(step.tops, top_shapes(step), strict=False):
            if w.names[top] == AUTOMATIC:
                w.memory[top].reshape(shape)
    _need_backward(w, net.spec.force_backward)
    return w


def _need_backward(w: Wiring, force: bool) -> None:
    """Net::Init's flags: a layer needs backward when a bottom needs it or a parameter
    learns (lr_mult != 0), and only when it contributes to a loss (unless
    force_backward)."""
    blob_need = [False] * len(w.names)
    for step in w.steps:
        need = False
        step.bottom_need = []
        down = step.layer.spec.propagate_down if step.layer is not None else []
        for j, blob in enumerate(step.bottoms):
            step.bottom_need.append(bool(down[j]) if down else blob_need[blob])
            need |= blob_need[blob]
        if step.layer is not None:
            specs = step.layer.spec.param
            for k in range(len(step.layer.blob_names)):
                if (specs[k].lr_mult if k < len(specs) else 1.0) != 0:
                    need = True
        step.need_backward = need
        if need:
            for top in step.tops:
                blob_need[top] = True
    under_loss: set[str] = set()
    skip: set[str] = set()
    for step in reversed(w.steps):
        contributes, skips = False, True
        for top, weight in zip(step.tops, step.loss, strict=True):
            name = w.names[top]
            contributes |= bool(weight) or name in under_loss
            skips &= name in skip
        if step.need_backward and skips:
            step.need_backward = False
            step.bottom_need = [False] * len(step.bottoms)
        if not contributes:
            step.need_backward = False
        for j, blob in enumerate(step.bottoms):
            if contributes:
                under_loss.add(w.names[blob])
            else:
                step.bottom_need[j] = False
            if not step.bottom_need[j]:
                skip.add(w.names[blob])
    if force:
        for step in w.steps:
            step.need_backward = True
            blocked = NO_FORCED_BACKWARD.get(step.type, ())
            step.bottom_need = [need or j not in blocked
                                for j, need in enumerate(step.bottom_need)]


@dataclass
class _Splits:
    """Caffe's InsertSplits over a layer list: each layer's bottoms renamed to split tops,
    the splits after each layer (top index, count, loss weight) and the layers whose
    explicit loss_weight a split took."""

    bottoms: list[list[str]]
    after: list[list[tuple[int, int, float]]]
    cleared: list[bool]


def _splits(layers: Sequence[Layer]) -> _Splits:
    last_top: dict[str, tuple[int, int]] = {}
    source_of: dict[tuple[int, int], tuple[int, int]] = {}
    consumers: Counter[tuple[int, int]] = Counter()
    loss_of: dict[tuple[int, int], float] = {}
    for i, layer in enumerate(layers):
        for j, name in enumerate(layer.spec.bottom):
            source_of[(i, j)] = last_top[name]
            consumers[last_top[name]] += 1
        for j, name in enumerate(layer.spec.top):
            last_top[name] = (i, j)
        weights = layer.spec.loss_weight
        for j in range(min(len(weights), len(layer.spec.top))):
            top = last_top[layer.spec.top[j]]
            loss_of[top] = float(weights[j])
            if loss_of[top]:
                consumers[top] += 1
    taken: Counter[tuple[int, int]] = Counter()
    out = _Splits([], [], [])
    for i, layer in enumerate(layers):
        bottoms = list(layer.spec.bottom)
        for j, name in enumerate(layer.spec.bottom):
            source = source_of[(i, j)]
            if consumers[source] > 1:
                bottoms[j] = _split_blob(layers[source[0]].name, name, source[1], taken[source])
                taken[source] += 1
        after, cleared = [], False
        for j in range(len(layer.spec.top)):
            count = consumers[(i, j)]
            if count > 1:
                weight = loss_of.get((i, j), 0.0)
                after.append((j, count, weight))
                if weight:
                    cleared = True
                    taken[(i, j)] += 1
        out.bottoms.append(bottoms)
        out.after.append(after)
        out.cleared.append(cleared)
    return out


def _automatic(name: str) -> bool:
    """Whether caffe-py named this top for a loss layer written without one."""
    return name == AUTOMATIC or name.startswith(AUTOMATIC + "#")


def _split_blob(layer: str, blob: str, index: int, k: int) -> str:
    return f"{blob}_{layer}_{index}_split_{k}"


def _split_layer(layer: str, blob: str, index: int) -> str:
    return f"{blob}_{layer}_{index}_split"


def _layer_loss(layer: Layer, top: int, cleared: bool) -> float:
    """Caffe's layer->loss(top): the explicit loss_weight (unless a Split took it), else 1
    for a loss layer's first top."""
    weights = [] if cleared else layer.spec.loss_weight
    if weights:
        return float(weights[top]) if top < len(weights) else 0.0
    return 1.0 if layer.is_loss and top == 0 else 0.0


def top_shapes(step: Step) -> list[tuple[int, ...]]:
    """The shapes the caffe-py layer was built to give its tops (none for a Split)."""
    if step.layer is None:
        return []
    return [tuple(s) for s in step.layer.top_shapes]
