"""The build-time passes over a built Net: four fusions, each off with a net option.

Each folds one layer's work into another that touches the same blob, and none changes a
parameter object or the blob order: snapshots, weight sharing, ``lr_mult`` and the solver see
the same net. ``Net.__init__`` runs them in this order, after every layer is built.

**BatchNorm + Scale** (``fuse_batchnorm_scale``). Caffe's BatchNorm has no affine part, so
every Caffe ResNet writes ``BatchNorm -> Scale (bias_term) -> ReLU``, all in place on one
blob. Run as written that is two full passes over the activation forward (normalise, then
scale and shift) and two more backward. PyTorch's batch_norm takes a per-channel weight and
bias and does it all in its own kernels, as torchvision's ResNet does. The Scale keeps its
blobs but passes its bottom through; the BatchNorm reads those Parameters at every forward (so
a TEST net sharing the TRAIN net's weights follows them) and gives them to batch_norm as
weight and bias. TRAIN still normalises with the batch statistics and updates Caffe's
[mean_sum, var_sum, count] blobs exactly as before; only rounding differs. A pair is fused
only when all of these hold:

- a BatchNorm with one bottom of at least 2 axes and one top, with no loss weight on it (it
  would see the scaled values);
- the first later layer that touches that top (reads it or writes it) is a Scale with one
  bottom, in place on it, with ``bias_term``, a learned (C,) operand along axis 1 and no
  ``propagate_down: false``.

**bias + activation** (``fuse_bias_activation``). Caffe writes ``conv -> ReLU`` with the ReLU
in place. Adding the bias and then applying the ReLU reads and writes the tensor twice; the
fused CUDA kernel does both in one pass, and its backward gives the input gradient and the
bias gradient in one pass too. The producer keeps its bias blob but stops adding it
(``has_bias = False``), and the activation reads that Parameter at every forward and adds it
inside the fused kernel. A pair is fused only when all of these hold:

- the net is built on a CUDA device and the activation's engine allows the kernels
  (``can_fuse``: engine CUDA, or DEFAULT/CAFFE/CUDNN with a top of at least
  ``FUSE_MIN_ELEMENTS`` elements, below which PyTorch's two ops were faster); the activation
  then runs on the kernels;
- the producer is a Convolution, Deconvolution or InnerProduct with bias_term and one top;
- the activation (ReLU with negative_slope >= 0, ELU with alpha >= 0, Sigmoid, TanH) is in
  place on that top, and no layer between the two reads the top (it would miss the bias).

**BatchNorm + ReLU** (``fuse_batchnorm_relu``, after the BatchNorm + Scale fusion). The ReLU
of ``BatchNorm -> Scale -> ReLU`` reads and writes the normalised tensor once more forward,
and its backward reads the gradient and the output and writes a new gradient before
BatchNorm's backward reads both again. The fused CUDA kernels (csrc/batchnorm.cu) apply the
ReLU in the pass that writes the output, and recompute its mask from the input in the
backward's two passes, which read the input and the gradient as BatchNorm's alone does. The
ReLU passes its bottom through; the BatchNorm applies it: in its kernels where they take the
input (caffe_py/layers/normalization.py); elsewhere (a CPU, NCHW, float64, torch.compile) by
calling the ReLU's own activation on its output, the operations the unfused net runs. A pair
is fused only when all of these hold:

- a BatchNorm with one bottom and one top, batch statistics (not ``use_global_stats``: a TEST
  net keeps its layers) and no loss weight;
- the first later layer that touches that top, after the Scale folded into the BatchNorm if
  there is one, is a ReLU in place on it with no ``propagate_down: false``, whose engine is
  not TORCH and which has no bias folded in.

**BatchNorm + Eltwise + ReLU** (``fuse_batchnorm_eltwise``, last). The end of a Caffe ResNet
block is ``BatchNorm -> Scale`` on the last branch, an Eltwise SUM of it and the shortcut,
and a ReLU in place on the sum: three more passes over the block's largest tensor forward.
The Eltwise applies the BatchNorm (with its folded Scale) to that bottom, adds the other and
applies the ReLU, in one call of the BatchNorm kernels where they take it (the residual read
in the pass that writes the output; backward, the residual's gradient written in the pass
that writes the input's); elsewhere it calls the BatchNorm's normalisation, its own sum and
the ReLU's activation, the operations the unfused net runs. The BatchNorm (and its Scale)
then pass their bottom through: the blob between them and the Eltwise holds the
un-normalised values, which is why no other layer may read it. A triple is fused when:

- the Eltwise is a SUM of two distinct bottoms with coefficients 1 and one top;
- one bottom is the top of a BatchNorm with batch statistics, one bottom and one top, no
  loss weight and no ReLU folded in, whose first later user (after the Scale folded into it)
  is the Eltwise and which no layer after the Eltwise touches; when both bottoms are, the
  later BatchNorm;
- the ReLU, if the first later user of the Eltwise's top is one in place on it (no
  ``propagate_down: false``, engine not TORCH, no bias folded in), is applied too; else the
  sum is the output.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any  # a pass's layers are duck-typed by their spec's type

if TYPE_CHECKING:
    from .net import Net

BATCHNORM_SCALE = "fuse_batchnorm_scale"
BIAS_ACTIVATION = "fuse_bias_activation"
BATCHNORM_RELU = "fuse_batchnorm_relu"
BATCHNORM_ELTWISE = "fuse_batchnorm_eltwise"
PRODUCERS = ("Convolution", "Deconvolution", "InnerProduct")
ACTIVATIONS = ("ReLU", "ELU", "Sigmoid", "TanH")


def fuse_batchnorm_scale(net: Net) -> list[tuple[str, str]]:
    """Fold every eligible (BatchNorm, Scale) pair of ``net``; returns their names."""
    if not net.ctx.options.get(BATCHNORM_SCALE, True):
        return []
    layers: list[Any] = list(net.layers)
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


def fuse_bias_activation(net: Net) -> list[tuple[str, str]]:
    """Fuse every eligible (producer, activation) pair of ``net``; returns their names."""
    if not net.ctx.options.get(BIAS_ACTIVATION, True):
        return []
    layers: list[Any] = list(net.layers)
    fused = []
    for i, producer in enumerate(layers):
        j = _fusable_activation(layers, i)
        if j is None:
            continue
        act = layers[j]
        act.attach_bias(producer, producer.axis)
        producer.has_bias = False
        fused.append((producer.name, act.name))
    return fused


def fuse_batchnorm_relu(net: Net) -> list[tuple[str, str]]:
    """Fold every eligible ReLU into the BatchNorm before it; returns their names."""
    if not net.ctx.options.get(BATCHNORM_RELU, True):
        return []
    layers: list[Any] = list(net.layers)
    fused = []
    for i, bn in enumerate(layers):
        j = _fusable_relu(layers, i)
        if j is None:
            continue
        relu = layers[j]
        bn.attach_relu(relu)
        relu.folded_into = bn.name
        fused.append((bn.name, relu.name))
    return fused


def fuse_batchnorm_eltwise(net: Net) -> list[tuple[str, str, str | None]]:
    """Let every eligible Eltwise SUM apply the BatchNorm on one bottom and the ReLU on its
    top; returns the (BatchNorm, Eltwise, ReLU or None) names."""
    if not net.ctx.options.get(BATCHNORM_ELTWISE, True):
        return []
    layers: list[Any] = list(net.layers)
    fused = []
    for i, eltwise in enumerate(layers):
        found = _fusable_sum(layers, i)
        if found is None:
            continue
        k, b = found
        bn = layers[b]
        eltwise.attach_batchnorm(bn, k)
        bn.defer_to(eltwise.name)
        j = _fusable_relu_after(layers, i, eltwise.spec.top[0])
        if j is not None:
            eltwise.attach_relu(layers[j])
            layers[j].folded_into = eltwise.name
        fused.append((bn.name, eltwise.name, None if j is None else layers[j].name))
    return fused


def first_user(layers: Sequence[Any], i: int, blob: str) -> int | None:
    """The index of the first layer after layer i that reads or writes ``blob``, or None.

    A pass may only fold layer i's work into that layer: anything between them would see the
    blob without it.
    """
    for j in range(i + 1, len(layers)):
        spec = layers[j].spec
        if blob in spec.bottom or blob in spec.top:
            return j
    return None


def _fusable_scale(layers: Sequence[Any], i: int) -> int | None:
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


def _is_plain_affine(layer: Any, top: str, channels: int) -> bool:
    """A Scale in place on ``top`` with a learned (C,) scale and bias along axis 1."""
    spec = layer.spec
    return (spec.type == "Scale" and spec.bottom == [top] and spec.top == [top]
            and all(spec.propagate_down) and layer.bias_term and layer.axis == 1
            and tuple(layer.scale.shape) == (channels,)
            and tuple(layer.bias.shape) == (channels,)
            and getattr(layer, "folded_into", None) is None)


def _batch_statistics(layer: Any) -> bool:
    """A BatchNorm with batch statistics, one bottom, one top and no loss weight: one whose
    output another layer may produce (a TEST net's global statistics keep their layers)."""
    spec = layer.spec
    return (spec.type == "BatchNorm" and len(spec.bottom) == 1 and len(spec.top) == 1
            and not layer.use_global_stats and not any(w != 0 for w in spec.loss_weight))


def _after_scale(layers: Sequence[Any], b: int) -> int | None:
    """The last layer of BatchNorm b's own work: the Scale folded into it (its top's first
    user), else b itself."""
    bn = layers[b]
    return b if bn.fused_scale is None else first_user(layers, b, bn.spec.top[0])


def _fusable_relu(layers: Sequence[Any], i: int) -> int | None:
    """The index of the ReLU that layer i (a BatchNorm) can apply after itself, or None."""
    if not _batch_statistics(layers[i]):
        return None
    after = _after_scale(layers, i)
    top = layers[i].spec.top[0]
    return None if after is None else _fusable_relu_after(layers, after, top)


def _fusable_relu_after(layers: Sequence[Any], i: int, top: str) -> int | None:
    """The index of the in-place ReLU on ``top`` that is its first user after layer i, if it
    can be folded into another layer, or None."""
    j = first_user(layers, i, top)
    if j is None:
        return None
    relu, later = layers[j], layers[j].spec
    ok = (later.type == "ReLU" and later.bottom == [top] and later.top == [top]
          and all(later.propagate_down) and not relu.torch_forced and not relu.fused_bias
          and relu.folded_into is None)
    return j if ok else None


def _fusable_sum(layers: Sequence[Any], i: int) -> tuple[int, int] | None:
    """(bottom k, index of its BatchNorm) for layer i, an Eltwise SUM that can apply that
    BatchNorm, or None."""
    eltwise = layers[i]
    spec = eltwise.spec
    if spec.type != "Eltwise" or eltwise.operation != "SUM" or len(spec.bottom) != 2:
        return None
    if len(spec.top) != 1 or spec.bottom[0] == spec.bottom[1] or any(
            c != 1.0 for c in eltwise.coeff) or not all(spec.propagate_down):
        return None
    best: tuple[int, int] | None = None
    for k, blob in enumerate(spec.bottom):
        b = _deferrable_batchnorm(layers, i, blob)
        if b is not None and (best is None or b > best[1]):
            best = (k, b)
    return best


def _deferrable_batchnorm(layers: Sequence[Any], i: int, blob: str) -> int | None:
    """The index of the BatchNorm whose top ``blob`` layer i (an Eltwise) reads, if layer i
    can apply it: batch statistics, no ReLU folded in, the Eltwise its first later user and
    no layer after the Eltwise touching the blob."""
    for b in range(i - 1, -1, -1):
        spec = layers[b].spec
        if blob not in spec.top:
            continue
        bn = layers[b]
        if getattr(bn, "folded_into", None) is not None and spec.type == "Scale":
            continue  # the Scale folded into the BatchNorm before it passes the blob through
        if not _batch_statistics(bn) or bn.fused_relu is not None or bn.deferred_to is not None:
            return None
        after = _after_scale(layers, b)
        if after is None or first_user(layers, after, blob) != i:
            return None
        return b if first_user(layers, i, blob) is None else None
    return None


def _fusable_activation(layers: Sequence[Any], i: int) -> int | None:
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
