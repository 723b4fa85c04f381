"""The net spec: NetParameter, LayerParameter and the messages layers share (caffe.proto).

A layer's own block (``convolution_param``, ``pooling_param``, ...) is declared by its layer
class (``Layer.params``) next to the layer, and found through the registry by the layer's
``type``, so this file never needs to know the layer library.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpecError
from . import yamlio
from .schema import (
    Check,
    Location,
    Source,
    convert,
    field,
    field_names,
    parse_message,
    unknown_key_error,
)

PHASES = ("TRAIN", "TEST")


@dataclass
class BlobShape:
    """A blob's shape (Caffe's BlobShape)."""

    dim: list[int] = field([], "the size of each axis, outermost first")

    def check(self, v: Check) -> None:
        if any(d < 0 for d in self.dim):
            v.fail("dim", f"negative size in {self.dim}", "sizes are >= 0")


@dataclass
class FillerParameter:
    """How a learnable blob is initialised (Caffe's FillerParameter)."""

    type: str = field("constant", "filler kind",
                      choices=("constant", "uniform", "gaussian", "xavier", "msra",
                               "positive_unitball", "bilinear"))
    value: float = field(0.0, "constant: the value")
    min: float = field(0.0, "uniform: lower bound")
    max: float = field(1.0, "uniform: upper bound")
    mean: float = field(0.0, "gaussian: mean")
    std: float = field(1.0, "gaussian: standard deviation", min=0)
    sparse: int = field(-1, "gaussian: expected non-zeros per output (-1: dense)")
    variance_norm: str = field("FAN_IN", "xavier/msra: the n in the variance",
                               choices=("FAN_IN", "FAN_OUT", "AVERAGE"))


@dataclass
class ParamSpec:
    """Per learnable blob: its learning-rate and decay multipliers, and a name to share it."""

    name: str = field("", "share this blob with every other blob of the same name")
    share_mode: str = field("STRICT", "STRICT: shapes must match; PERMISSIVE: counts must",
                            choices=("STRICT", "PERMISSIVE"))
    lr_mult: float = field(1.0, "multiplier on the solver's learning rate (0 freezes the blob)")
    decay_mult: float = field(1.0, "multiplier on the solver's weight_decay")


@dataclass
class NetStateRule:
    """An include/exclude rule: matches when every condition given holds."""

    phase: str | None = field(None, "TRAIN or TEST", choices=PHASES)
    min_level: int | None = field(None, "the net's level must be >= this")
    max_level: int | None = field(None, "the net's level must be <= this")
    stage: list[str] = field([], "every one of these stages must be set")
    not_stage: list[str] = field([], "none of these stages may be set")

    def matches(self, phase: str, level: int, stages: set[str]) -> bool:
        if self.phase is not None and self.phase != phase:
            return False
        if self.min_level is not None and level < self.min_level:
            return False
        if self.max_level is not None and level > self.max_level:
            return False
        return all(s in stages for s in self.stage) and not any(s in stages for s in self.not_stage)


@dataclass
class TransformationParameter:
    """Data-layer preprocessing, in Caffe's order: crop -> mirror -> (x - mean) * scale."""

    scale: float = field(1.0, "multiply after the mean is subtracted")
    mirror: bool = field(False, "flip horizontally at random (TRAIN and TEST, as Caffe does)")
    crop_size: int = field(0, "square crop: random in TRAIN, centre in TEST (0: none)", min=0)
    mean_file: str = field("", "a BlobProto mean image (cpy compute-mean)", path=True)
    mean_value: list[float] = field([], "one mean, or one per channel")
    force_color: bool = field(False, "decode encoded images as 3 channels")
    force_gray: bool = field(False, "decode encoded images as 1 channel")

    def check(self, v: Check) -> None:
        if self.mean_file and self.mean_value:
            v.fail("mean_value", "mean_file and mean_value are both set", "keep one of them")
        if self.force_color and self.force_gray:
            v.fail("force_gray", "force_color and force_gray are both set", "keep one of them")


@dataclass
class DataParameter:
    """Where a Data layer reads from."""

    source: str = field("", "the database directory", path=True)
    batch_size: int = field(0, "records per batch (per replica)", min=1)
    backend: str = field("LMDB", "database kind", choices=("LMDB",))
    prefetch: int = field(4, "batches buffered ahead per replica", min=1)
    rand_skip: int = field(0, "skip up to this many records at the start (random)", min=0)
    mean_file: str = field("", "deprecated; use transform_param.mean_file", path=True)
    scale: float = field(1.0, "deprecated; use transform_param.scale")
    crop_size: int = field(0, "deprecated; use transform_param.crop_size", min=0)
    mirror: bool = field(False, "deprecated; use transform_param.mirror")
    force_encoded_color: bool = field(False, "decode encoded images as colour")

    def check(self, v: Check) -> None:
        if not self.source:
            v.fail(None, "data_param.source is not set", "name the LMDB directory to read")


@dataclass
class LossParameter:
    """Shared by loss layers: which label to ignore and how to normalise."""

    ignore_label: int | None = field(None, "positions with this label add no loss or gradient")
    normalization: str = field("VALID", "what the summed loss is divided by",
                               choices=("FULL", "VALID", "BATCH_SIZE", "NONE"))
    normalize: bool | None = field(None, "legacy: true means VALID, false BATCH_SIZE")


@dataclass
class SoftmaxParameter:
    """Softmax and SoftmaxWithLoss: the axis the probabilities sum to 1 over."""

    axis: int = field(1, "the class axis (negative counts from the end)")
    engine: str = field("DEFAULT", "implementation", choices=("DEFAULT", "CAFFE", "CUDNN", "TORCH"))


@dataclass
class LayerParameter:
    """One layer: its wiring, multipliers, phase rules and its type's own parameter blocks.

    ``params`` holds one message per ``<type>_param`` block the layer type declares, parsed or
    defaulted, e.g. ``params["convolution_param"]``.
    """

    name: str = field("", "the layer's name (unique in the net)")
    type: str = field("", "the Caffe layer type, e.g. Convolution")
    bottom: list[str] = field([], "input blob names")
    top: list[str] = field([], "output blob names; a top equal to a bottom is in place")
    phase: str | None = field(None, "legacy: the phase this layer belongs to", choices=PHASES)
    loss_weight: list[float] = field([], "one weight per top; loss layers default to 1")
    param: list[ParamSpec] = field([], "one ParamSpec per learnable blob, in order")
    include: list[NetStateRule] = field([], "keep the layer when any rule matches")
    exclude: list[NetStateRule] = field([], "drop the layer when any rule matches")
    propagate_down: list[bool] = field([], "per bottom: whether to back-propagate into it")
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    _location: Location | None = dataclasses.field(default=None, repr=False, compare=False)

    def check(self, v: Check) -> None:
        if self.include and self.exclude:
            v.fail("exclude", "a layer takes include rules or exclude rules, not both (as in "
                   "Caffe)", "keep one of them")

    def kept_for(self, phase: str, level: int = 0, stages: set[str] | None = None) -> bool:
        """Caffe's StateMeetsRule: include rules if given, else no exclude rule matching."""
        stages = stages or set()
        if self.phase is not None and self.phase != phase and not self.include:
            return False
        if self.include:
            return any(r.matches(phase, level, stages) for r in self.include)
        return not any(r.matches(phase, level, stages) for r in self.exclude)

    def error(self, problem: str, fix: str | None = None) -> SpecError:
        """An error about this layer, pointing at its line in the spec when known."""
        loc = self._location
        what = f"layer '{self.name}' ({self.type}): {problem}"
        if loc is None:
            return SpecError(what, fix=fix)
        return SpecError(what, file=loc.file, line=loc.line, path=loc.path, fix=fix)


@dataclass
class NetParameter:
    """A whole net: a name and a list of layers (plus Caffe's legacy net inputs)."""

    name: str = field("", "the net's name")
    layer: list[LayerParameter] = field([], "the layers, in order")
    input: list[str] = field([], "legacy net inputs (prefer an Input layer)")
    input_shape: list[BlobShape] = field([], "legacy: one shape per input")
    input_dim: list[int] = field([], "older legacy: 4 sizes (N, C, H, W) per input")
    force_backward: bool = field(
        False, "accepted for Caffe compatibility; autograd already back-propagates wherever a "
               "gradient is needed, so it changes nothing")
    _location: Location | None = dataclasses.field(default=None, repr=False, compare=False)


_LAYER_KEYS = [n for n in field_names(LayerParameter) if n != "params"]


def parse_layer(node: Any, src: Source, path: str, line: int | None = None) -> LayerParameter:
    """Parse one layer: common keys first, then the blocks its type declares."""
    from ..layers import registry  # the layer library registers itself on import

    if not isinstance(node, dict):
        raise SpecError(f"expected a mapping (a layer), got {node!r}", file=src.file,
                        line=getattr(node, "line", None) or line, path=path,
                        fix="write the layer's fields under it, e.g. '- name: conv1'")
    node = node if isinstance(node, yamlio.MarkedDict) else _mark(node)
    layer_type = node.get("type")
    if layer_type is None:
        raise SpecError("the layer has no 'type'", file=src.file, line=node.line, path=path,
                        fix="add e.g. 'type: Convolution'")
    if not isinstance(layer_type, str):
        raise SpecError(f"type must be a string, got {layer_type!r}", file=src.file,
                        line=node.line_of("type"), path=f"{path}.type")
    cls = registry.lookup(layer_type, src=src, line=node.line_of("type"), path=f"{path}.type")
    declared = dict(cls.params)
    block_keys = [k for k in node if k in declared]
    for key in node:
        if key in _LAYER_KEYS or key in declared:
            continue
        if key.endswith("_param") and registry.declares_param(key):
            raise SpecError(f"'{key}' does not apply to {_a(layer_type)} layer",
                            file=src.file, line=node.line_of(key), path=f"{path}.{key}",
                            fix=_allowed_blocks(layer_type, declared))
        raise unknown_key_error(key, _LAYER_KEYS + list(declared), f"{_a(layer_type)} layer",
                                node, src, path)
    spec = parse_message(LayerParameter, node, src, path, skip=block_keys)
    spec.params = {key: (parse_message(declared[key], node[key], src, f"{path}.{key}")
                         if key in node else declared[key]())
                   for key in declared}
    spec._location = Location(src.file, node.line, path)
    if not spec.name:
        raise SpecError(f"the {layer_type} layer has no name", file=src.file, line=node.line,
                        path=path, fix="add 'name: <unique name>'")
    return spec


def parse_net(node: Any, src: Source, path: str = "") -> NetParameter:
    """Parse a NetParameter mapping (a file's root, or a solver's inline ``net_param``)."""
    if not isinstance(node, dict):
        raise SpecError("a net spec is a mapping with 'name' and 'layer'", file=src.file,
                        line=getattr(node, "line", None), path=path)
    node = node if isinstance(node, yamlio.MarkedDict) else _mark(node)
    layers = node.get("layer") or []  # 'layer:' with nothing under it is no layers
    net = parse_message(NetParameter, node, src, path, skip=("layer",))
    if not isinstance(layers, list):
        layers = [layers]
    lines = layers.item_lines if isinstance(layers, yamlio.MarkedList) else []
    net.layer = []
    for i, layer_node in enumerate(layers):
        lpath = f"{path}.layer[{i}]" if path else f"layer[{i}]"
        if isinstance(layer_node, yamlio.MarkedDict) and not layer_node.line and lines:
            layer_node.line = lines[i]
        net.layer.append(parse_layer(layer_node, src, lpath,
                                     line=lines[i] if i < len(lines) else None))
    net._location = Location(src.file, getattr(node, "line", 1), path)
    if len(net.input_shape) not in (0, len(net.input)):
        raise SpecError(f"{len(net.input)} inputs but {len(net.input_shape)} input_shape entries",
                        file=src.file, line=node.line_of("input_shape"),
                        path=_p(path, "input_shape"),
                        fix="give one input_shape per input")
    return net


def load_net(path: str | Path) -> NetParameter:
    """Load and validate a net spec file."""
    return parse_net(yamlio.load(path), Source.of(path))


def _allowed_blocks(layer_type: str, declared: dict) -> str:
    if not declared:
        return f"{_a(layer_type)} layer takes no parameter block"
    return f"{_a(layer_type)} layer takes {', '.join(sorted(declared))}"


def _a(word: str) -> str:
    """'a ReLU', 'an InnerProduct'."""
    return f"an {word}" if word[:1].lower() in "aeiou" else f"a {word}"


def _mark(node: dict) -> yamlio.MarkedDict:
    out = yamlio.MarkedDict(node)
    out.key_lines = {}
    return out


def _p(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


__all__ = ["BlobShape", "FillerParameter", "ParamSpec", "NetStateRule", "TransformationParameter",
           "DataParameter", "LossParameter", "SoftmaxParameter", "LayerParameter", "NetParameter",
           "parse_layer", "parse_net", "load_net", "convert", "PHASES"]
