"""Net-level pass: fold Caffe's BatchNorm + Scale pair into one batch_norm call.

Caffe's BatchNorm has no affine part, so every Caffe ResNet writes
``BatchNorm -> Scale (bias_term) -> ReLU``, all in place on one blob. Run as written that is
two full passes over the activation forward (normalise, then scale and shift) and two more
backward (the Scale's backward reduces x * dy for its scale and dy for its bias, then the
BatchNorm's backward reduces again). PyTorch's batch_norm takes a per-channel weight and bias
and does it all in its own kernels, as torchvision's ResNet does.

The pass changes no parameter and no blob: the Scale keeps its scale and bias blobs (same
Parameter objects, same Caffe order, so snapshots, weight sharing, ``lr_mult`` and the solver
see no change) but passes its bottom through, and the BatchNorm reads those Parameters at
every forward (so a TEST net sharing the TRAIN net's weights follows them) and gives them to
batch_norm as weight and bias. TRAIN still normalises with the batch statistics and updates
Caffe's [mean_sum, var_sum, count] blobs exactly as before; TEST / use_global_stats still uses
mean_sum / count and var_sum / count. Only rounding differs: y = x_hat * scale + bias is one
expression inside the kernel instead of two tensors.

A pair is fused only when all of these hold:
- a BatchNorm with one bottom of at least 2 axes and one top;
- the first later layer that touches that top (reads it or writes it) is a Scale with one
  bottom, in place on it (bottom == top == the BatchNorm's top), with ``bias_term``, the
  learned operand along axis 1 with one axis (a (C,) blob), no ``propagate_down: false``;
- the BatchNorm's top has no loss weight (it would see the scaled values).

Turn it off with the net option ``fuse_batchnorm_scale: False``.
"""
from __future__ import annotations

from typing import Any

from torch import nn

OPTION = "fuse_batchnorm_scale"


def fuse_batchnorm_scale(net: Any) -> list[tuple[str, str]]:
    """Fold every eligible (BatchNorm, Scale) pair of ``net``; returns their names."""
    if not net.ctx.options.get(OPTION, True):
        return []
    layers: list[nn.Module] = list(net.layers)
    fused = []
    for i, bn in enumerate(layers):
        j = _fusable_scale(layers, i)
        if j is None:
            continue
        scale = layers[j]
        bn.attach_affine(scale)
        scale.folded_into = bn.name
        fused.append((bn.name, scale.name))
    return fused


def _fusable_scale(layers: list[nn.Module], i: int) -> int | None:
    """The index of the Scale whose blobs layer i (a BatchNorm) can apply, or None."""
    bn = layers[i]
    spec = bn.spec
    if spec.type != "BatchNorm" or len(spec.bottom) != 1 or len(spec.top) != 1:
        return None
    if len(bn.bottom_shapes[0]) < 2 or any(w != 0 for w in spec.loss_weight):
        return None
    top = spec.top[0]
    j = first_user(layers, i, top)
    return j if j is not None and _is_plain_affine(layers[j], top, bn.channels) else None


def first_user(layers: list[nn.Module], i: int, blob: str) -> int | None:
    """The index of the first layer after layer i that reads or writes ``blob``, or None.

    A fusion pass may only fold layer i's work into that layer: anything between them would
    see the blob without it.
    """
    for j in range(i + 1, len(layers)):
        spec = layers[j].spec
        if blob in spec.bottom or blob in spec.top:
            return j
    return None


def _is_plain_affine(layer: nn.Module, top: str, channels: int) -> bool:
    """A Scale in place on ``top`` with a learned (C,) scale and bias along axis 1."""
    spec = layer.spec
    return (spec.type == "Scale" and spec.bottom == [top] and spec.top == [top]
            and all(spec.propagate_down) and layer.bias_term and layer.axis == 1
            and tuple(layer.scale.shape) == (channels,)
            and tuple(layer.bias.shape) == (channels,)
            and getattr(layer, "folded_into", None) is None)
