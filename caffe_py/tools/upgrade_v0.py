"""Caffe's V0 -> V1 net upgrade (upgrade_proto.cpp's UpgradeV0Net) on a parsed prototxt.

A V0 net (Caffe before 2014) wraps every layer twice, ``layers { layer { name type ... }
bottom top }``, names its type in lower case (``type: "conv"``) and keeps every setting flat
in the inner block (``num_output``, ``kernelsize``, ``meanfile``...). As Caffe does, padding
layers are first folded into the convolution or pooling layer that reads them; then each
layer becomes a V1 ``layers`` block (type enum, bottom/top, ``blobs_lr``/``weight_decay``
and the per-type ``*_param`` blocks), which :mod:`caffe_py.tools.to_yaml` upgrades on to
the current ``layer`` form like any V1 file. Only the net's name, inputs and force_backward
survive, as in Caffe; settings that do not apply to a layer's type are dropped with a note
(Caffe logs "Unknown parameter ... for layer type ..." and goes on).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from .prototxt import Field, Ident, Message, PrototxtError

# UpgradeV0LayerType: V0 type string -> V1 enum name.
V0_LAYER_TYPES = {
    "accuracy": "ACCURACY", "bnll": "BNLL", "concat": "CONCAT", "conv": "CONVOLUTION",
    "data": "DATA", "dropout": "DROPOUT", "euclidean_loss": "EUCLIDEAN_LOSS",
    "flatten": "FLATTEN", "hdf5_data": "HDF5_DATA", "hdf5_output": "HDF5_OUTPUT",
    "im2col": "IM2COL", "images": "IMAGE_DATA", "infogain_loss": "INFOGAIN_LOSS",
    "innerproduct": "INNER_PRODUCT", "lrn": "LRN",
    "multinomial_logistic_loss": "MULTINOMIAL_LOGISTIC_LOSS", "pool": "POOLING",
    "relu": "RELU", "sigmoid": "SIGMOID", "softmax": "SOFTMAX", "softmax_loss": "SOFTMAX_LOSS",
    "split": "SPLIT", "tanh": "TANH", "window_data": "WINDOW_DATA",
}
_DATA_TYPES = {"data": "data_param", "hdf5_data": "hdf5_data_param",
               "images": "image_data_param", "window_data": "window_data_param"}
_WEIGHTED = {"conv": "convolution_param", "innerproduct": "inner_product_param"}
_WINDOWED = {"conv": "convolution_param", "pool": "pooling_param"}
_WINDOW = {"window_data": "window_data_param"}

# V0 field -> {V0 type (None: any) -> (V1 block, or None for the layer itself; field)}.
_MOVES: dict[str, dict[str | None, tuple[str | None, str]]] = {
    "num_output": {t: (b, "num_output") for t, b in _WEIGHTED.items()},
    "biasterm": {t: (b, "bias_term") for t, b in _WEIGHTED.items()},
    "weight_filler": {t: (b, "weight_filler") for t, b in _WEIGHTED.items()},
    "bias_filler": {t: (b, "bias_filler") for t, b in _WEIGHTED.items()},
    "pad": {t: (b, "pad") for t, b in _WINDOWED.items()},
    "kernelsize": {t: (b, "kernel_size") for t, b in _WINDOWED.items()},
    "group": {"conv": ("convolution_param", "group")},
    "stride": {t: (b, "stride") for t, b in _WINDOWED.items()},
    "pool": {"pool": ("pooling_param", "pool")},
    "dropout_ratio": {"dropout": ("dropout_param", "dropout_ratio")},
    "local_size": {"lrn": ("lrn_param", "local_size")},
    "alpha": {"lrn": ("lrn_param", "alpha")},
    "beta": {"lrn": ("lrn_param", "beta")},
    "k": {"lrn": ("lrn_param", "k")},
    "source": {**{t: (b, "source") for t, b in _DATA_TYPES.items()},
               "infogain_loss": ("infogain_loss_param", "source")},
    "scale": {None: ("transform_param", "scale")},
    "meanfile": {None: ("transform_param", "mean_file")},
    "batchsize": {t: (b, "batch_size") for t, b in _DATA_TYPES.items()},
    "cropsize": {None: ("transform_param", "crop_size")},
    "mirror": {None: ("transform_param", "mirror")},
    "rand_skip": {"data": ("data_param", "rand_skip"),
                  "images": ("image_data_param", "rand_skip")},
    "shuffle_images": {"images": ("image_data_param", "shuffle")},
    "new_height": {"images": ("image_data_param", "new_height")},
    "new_width": {"images": ("image_data_param", "new_width")},
    "concat_dim": {"concat": ("concat_param", "concat_dim")},
    "det_fg_threshold": {t: (b, "fg_threshold") for t, b in _WINDOW.items()},
    "det_bg_threshold": {t: (b, "bg_threshold") for t, b in _WINDOW.items()},
    "det_fg_fraction": {t: (b, "fg_fraction") for t, b in _WINDOW.items()},
    "det_context_pad": {t: (b, "context_pad") for t, b in _WINDOW.items()},
    "det_crop_mode": {t: (b, "crop_mode") for t, b in _WINDOW.items()},
    "hdf5_output_param": {"hdf5_output": (None, "hdf5_output_param")},
    "blobs_lr": {None: (None, "blobs_lr")},
    "weight_decay": {None: (None, "weight_decay")},
    "blobs": {None: (None, "blobs")},
}
# Fields of V0LayerParameter that UpgradeV0LayerParameter never reads (dropped silently there).
_UNREAD = ("new_num", "new_channels")
_NET_KEPT = ("name", "input", "input_dim", "force_backward")

Fail = Callable[[Field | Message, str, str | None], PrototxtError]


def _block(f: Field | None) -> Message:
    """A field's ``{ ... }`` block; a scalar (or no field) where a block belongs reads as an
    empty block, so that the checks that follow name what is missing."""
    if f is not None and isinstance(f.value, Message):
        return f.value
    return Message(line=f.line if f else 1, column=f.column if f else 1)


def is_v0(msg: Message) -> bool:
    """Caffe's NetNeedsV0ToV1Upgrade: some ``layers`` block holds a ``layer`` block."""
    return any(f.name == "layers" and isinstance(f.value, Message)
               and _block(f).first("layer") is not None for f in msg.fields)


def upgrade_v0_net(msg: Message, fail: Fail, notes: list[str]) -> Message:
    """The V1 net of a V0 net (padding folded, every layer upgraded); notes say what
    changed or was dropped."""
    layers = [f for f in msg.fields if f.name == "layers"]
    folded = _fold_padding(msg, layers, fail)  # id(original) -> the layer, padding folded
    upgraded = {key: dataclasses.replace(f, value=_upgrade_layer(f, fail, notes))
                for key, f in folded.items()}
    fields = []
    for f in msg.fields:
        if f.name == "layers":
            if id(f) in upgraded:
                fields.append(upgraded[id(f)])
        elif f.name in _NET_KEPT:
            fields.append(f)
        else:
            notes.append(f"line {f.line}: '{f.name}' is not part of a V0 net; dropped, as "
                         "Caffe's UpgradeV0Net drops it")
    padding = len(layers) - len(folded)
    notes.append(f"upgraded a V0 net of {len(folded)} layers (the 2014 'layers {{ layer "
                 "{ ... } }' form) to V1 as Caffe's UpgradeV0Net"
                 + (f", folding {padding} padding layer(s) into the layers they feed"
                    if padding else ""))
    return dataclasses.replace(msg, fields=fields)


def _v0_type(layer: Field, fail: Fail) -> str:
    inner = _block(layer).first("layer")
    if inner is None or not isinstance(inner.value, Message):
        raise fail(layer, "a 'layers' block without a 'layer' block in a V0 net",
                   "write every layer of a V0 net as 'layers { layer { ... } bottom top }'")
    kind = _block(inner).first("type")
    if kind is None:
        return ""
    if kind.value == "padding":
        return "padding"
    if kind.value not in V0_LAYER_TYPES:
        raise fail(kind, f"unknown V0 layer type '{kind.value}'",
                   f"V0 types: {', '.join(sorted(V0_LAYER_TYPES))}, padding")
    return str(kind.value)


def _fold_padding(msg: Message, layers: list[Field], fail: Fail) -> dict[int, Field]:
    """UpgradeV0PaddingLayers: a conv/pool layer reading a padding layer's top reads the
    padding layer's bottom instead and takes its pad; padding layers go. Returns
    id(original layer) -> the layer (a padding layer has no entry)."""
    last_top: dict[str, Field | None] = {str(f.value): None for f in msg.all("input")}
    out: dict[int, Field] = {}
    for layer in layers:
        kind = _v0_type(layer, fail)
        bottoms = _block(layer).all("bottom")
        fields = list(_block(layer).fields)
        for j, bottom in enumerate(bottoms):
            if bottom.value not in last_top:
                raise fail(bottom, f"Unknown bottom blob '{bottom.value}' (bottom index {j}): "
                                   "no net input or earlier layer makes it",
                           "name a net input or a top of an earlier layer")
            source = last_top[bottom.value]
            if source is None or _v0_type(source, fail) != "padding":
                continue
            if kind not in ("conv", "pool") or len(bottoms) != 1:
                raise fail(bottom, f"a padding layer feeds a {kind or 'typeless'} layer with "
                                   f"{len(bottoms)} bottom(s); Caffe folds padding only into a "
                                   "conv or pool layer with one bottom", None)
            src_bottoms, pad = _block(source).all("bottom"), _block(source).first("layer")
            if len(src_bottoms) != 1 or len(_block(source).all("top")) != 1:
                raise fail(source, "a padding layer takes one bottom and makes one top", None)
            pad_field = _block(pad).first("pad")
            fields = [dataclasses.replace(f, value=src_bottoms[0].value) if f is bottom else f
                      for f in fields]
            fields = [_with_pad(f, pad_field) if f.name == "layer" else f for f in fields]
        for top in _block(layer).all("top"):
            last_top[str(top.value)] = layer
        if kind != "padding":
            out[id(layer)] = dataclasses.replace(layer, value=dataclasses.replace(_block(layer),
                                                                                  fields=fields))
    return out


def _with_pad(inner: Field, pad: Field | None) -> Field:
    """The inner V0 block with ``pad`` set to the padding layer's (0 when it has none)."""
    value = pad.value if pad is not None else 0
    kept = [f for f in _block(inner).fields if f.name != "pad"]
    line = pad.line if pad is not None else inner.line
    new = Field("pad", value, line, pad.column if pad is not None else inner.column)
    return dataclasses.replace(inner, value=dataclasses.replace(_block(inner),
                                                                fields=kept + [new]))


def _upgrade_layer(layer: Field, fail: Fail, notes: list[str]) -> Message:
    """UpgradeV0LayerParameter: one V0 connection -> a V1 ``layers`` block."""
    inner = _block(_block(layer).first("layer"))
    kind = _v0_type(layer, fail)
    head: list[Field] = []
    blocks: dict[str, list[Field]] = {}
    where: dict[str, Field] = {}
    for f in inner.fields:
        if f.name == "name":
            head.append(f)
        elif f.name == "type":
            head.append(dataclasses.replace(f, value=Ident(V0_LAYER_TYPES[kind])))
        elif f.name in _MOVES:
            move = _MOVES[f.name].get(kind) or _MOVES[f.name].get(None)
            if move is None:
                notes.append(f"line {f.line}: V0 field '{f.name}' does not apply to a "
                             f"'{kind}' layer; dropped, as Caffe's upgrade drops it")
                continue
            block, name = move
            if block is None:
                head.append(dataclasses.replace(f, name=name))
            else:
                blocks.setdefault(block, []).append(dataclasses.replace(f, name=name))
                where.setdefault(block, f)
        elif f.name in _UNREAD:
            notes.append(f"line {f.line}: V0 field '{f.name}' has no V1 equivalent; dropped, "
                         "as Caffe's upgrade drops it")
        else:
            raise fail(f, f"unknown V0 layer field '{f.name}'", None)
    wiring = [f for f in _block(layer).fields if f.name in ("bottom", "top")]
    out = [f for f in head if f.name in ("name", "type")] + wiring
    out += [f for f in head if f.name not in ("name", "type")]
    out += [Field(block, Message(fields, line=where[block].line, column=where[block].column),
                  where[block].line, where[block].column) for block, fields in blocks.items()]
    outer = _block(layer)
    return Message(out, line=outer.line, column=outer.column, tail=list(outer.tail))


__all__ = ["V0_LAYER_TYPES", "is_v0", "upgrade_v0_net"]
