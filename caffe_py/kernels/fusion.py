"""Net-level pass: fold a Convolution/InnerProduct bias into the in-place activation after it.

Caffe writes ``conv -> ReLU`` with the ReLU in place (top == bottom). Adding the bias and then
applying the ReLU reads and writes the tensor twice; the fused kernel does both in one pass,
and its backward gives the input gradient and the bias gradient in one pass too.

The pass changes no module and no parameter: the producer keeps its bias blob (same Parameter
object, same Caffe blob order, so snapshots, weight sharing and the solver see no change) but
stops adding it (``has_bias = False`` in its forward), and the activation layer reads that
Parameter at every forward and adds it inside the fused kernel.

A pair is fused only when all of these hold:
- the net is built on a CUDA device and the activation's engine allows the kernels
  (``can_fuse``: engine CUDA, or DEFAULT/CAFFE/CUDNN with a top of at least
  ``FUSE_MIN_ELEMENTS`` elements, below which PyTorch's two ops were faster); the activation
  then runs on the kernels;
- the producer is a Convolution, Deconvolution or InnerProduct with bias_term and one top;
- the activation (ReLU with negative_slope >= 0, ELU with alpha >= 0, Sigmoid, TanH) is in
  place on that top, and no layer between the two reads the top (it would miss the bias).

Turn it off with the net option ``fuse_bias_activation: False``.
"""
from __future__ import annotations

from typing import Any

from torch import nn

from ..layers.fusion import first_user

PRODUCERS = ("Convolution", "Deconvolution", "InnerProduct")
ACTIVATIONS = ("ReLU", "ELU", "Sigmoid", "TanH")
OPTION = "fuse_bias_activation"


def fuse_bias_activation(net: Any) -> list[tuple[str, str]]:
    """Fuse every eligible (producer, activation) pair of ``net``; returns their names."""
    if not net.ctx.options.get(OPTION, True):
        return []
    layers: list[nn.Module] = list(net.layers)
    fused = []
    for i, producer in enumerate(layers):
        j = _fusable_consumer(layers, i)
        if j is None:
            continue
        act = layers[j]
        act.attach_bias(producer, producer.axis)
        producer.has_bias = False
        fused.append((producer.name, act.name))
    return fused


def _fusable_consumer(layers: list[nn.Module], i: int) -> int | None:
    """The index of the activation that can take layer i's bias, or None."""
    producer = layers[i]
    spec = producer.spec
    if spec.type not in PRODUCERS or len(spec.top) != 1:
        return None
    if not getattr(producer, "has_bias", False) or not hasattr(producer, "axis"):
        return None
    top = spec.top[0]
    j = first_user(layers, i, top)
    if j is None:
        return None
    act, later = layers[j], layers[j].spec
    ok = (later.type in ACTIVATIONS and later.bottom == [top] and later.top == [top]
          and act.can_fuse())
    return j if ok else None
