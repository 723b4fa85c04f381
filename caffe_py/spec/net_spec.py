"""The net spec: NetParameter and LayerParameter (caffe.proto), parsed and validated.

A layer's own blocks (``convolution_param``, ``pooling_param``, ...) are messages of
:mod:`caffe_py.spec.layer_params`, whose table says which blocks each layer ``type`` takes, so
validating a net needs neither the layer library nor torch.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpecError, one_line
from . import layer_params, yamlio
from .layer_params.common import SoftmaxParameter
from .layer_params.data import DataParameter, TransformationParameter
from .layer_params.loss import LossParameter
from .layer_params.shared import BlobShape, FillerParameter
from .schema import (
    Check,
    Message,
    Source,
    convert,
    field,
    field_names,
    is_set,
    location,
    parse_message,
    unknown_key_error,
)

PHASES = {"TRAIN": 0, "TEST": 1}  # caffe.proto's Phase
log = logging.getLogger(__name__)


@dataclass
class ParamSpec(Message):
    """Per learnable blob: its learning-rate and decay multipliers, and a name to share it."""

    name: str = field("", "share this blob with every other blob of the same name")
    share_mode: str = field("STRICT", "STRICT: shapes must match; PERMISSIVE: counts must",
                            choices={"STRICT": 0, "PERMISSIVE": 1})
    lr_mult: float = field(1.0, "multiplier on the solver's learning rate (0 freezes the blob)")
    decay_mult: float = field(1.0, "multiplier on the solver's weight_decay")


@dataclass
class NetStateRule(Message):
    """An include/exclude rule: matches when every condition given holds."""

    phase: str | None = field(None, "TRAIN or TEST", choices=PHASES)
    min_level: int | None = field(None, "the net's level must be >= this")
    max_level: int | None = field(None, "the net's level must be <= this")
    stage: list[str] = field([], "every one of these stages must be set")
    not_stage: list[str] = field([], "none of these stages may be set")

    def matches(self, phase: str, level: int, stages: AbstractSet[str]) -> bool:
        if self.phase is not None and self.phase != phase:
            return False
        if self.min_level is not None and level < self.min_level:
            return False
        if self.max_level is not None and level > self.max_level:
            return False
        return all(s in stages for s in self.stage) and not any(s in stages for s in self.not_stage)


@dataclass
class NetState(Message):
    """The state a net is built in: phase, level and stages (include/exclude rules test it)."""

    phase: str = field("TEST", "TRAIN or TEST", choices=PHASES)
    level: int = field(0, "compared with a rule's min_level / max_level")
    stage: list[str] = field([], "stages set for this net")


def merge_states(phase: str, *states: NetState | None) -> NetState:
    """Caffe's chain of ``NetState::MergeFrom``: start from ``phase``, level 0, no stage; each
    later state's phase and level win where it gives them, and its stages add to the list.

    The solver builds its nets from ``merge_states("TRAIN", net.state, train_state)`` and
    ``merge_states("TEST", net.state, test_state[i])``, as Solver::InitTrainNet/InitTestNets.
    """
    out = NetState(phase=phase)
    for state in states:
        if state is None:
            continue
        for name in ("phase", "level"):
            if _given(state, name):
                setattr(out, name, getattr(state, name))
        out.stage = out.stage + [s for s in state.stage if s not in out.stage]
    return out


def _given(msg: Message, name: str) -> bool:
    """has_<name>(): written in the spec, or (a message built in code) not the default."""
    if location(msg) is not None:
        return is_set(msg, name)
    default = next(f for f in dataclasses.fields(msg) if f.name == name)
    return getattr(msg, name) != default.default


@dataclass
class LayerParameter(Message):
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

    def check(self, v: Check) -> None:
        if self.include and self.exclude:
            v.fail("exclude", "a layer takes include rules or exclude rules, not both (as in "
                   "Caffe)", "keep one of them")

    def kept_for(self, phase: str, level: int = 0,
                 stages: AbstractSet[str] | None = None) -> bool:
        """Caffe's StateMeetsRule: include rules if given, else no exclude rule matching."""
        stages = stages or set()
        if self.phase is not None and self.phase != phase and not self.include:
            return False
        if self.include:
            return any(r.matches(phase, level, stages) for r in self.include)
        return not any(r.matches(phase, level, stages) for r in self.exclude)

    def where(self) -> str:
        """How another layer's error refers to this one: its line, or (built in code) its name."""
        loc = location(self)
        return f"line {loc.line}" if loc is not None else f"layer '{self.name}'"


@dataclass
class NetParameter(Message):
    """A whole net: a name and a list of layers (plus Caffe's legacy net inputs)."""

    name: str = field("", "the net's name")
    layer: list[LayerParameter] = field([], "the layers, in order")
    input: list[str] = field([], "legacy net inputs (prefer an Input layer)")
    input_shape: list[BlobShape] = field([], "legacy: one shape per input")
    input_dim: list[int] = field([], "older legacy: 4 sizes (N, C, H, W) per input")
    force_backward: bool = field(
        False, "accepted for Caffe compatibility; autograd already back-propagates wherever a "
               "gradient is needed, so it changes nothing")
    state: NetState | None = field(
        None, "the phase, level and stages the net is built in unless the caller (a solver's "
              "train_state/test_state, `cpy net --phase`) says otherwise")


_LAYER_KEYS = [n for n in field_names(LayerParameter) if n != "params"]


def parse_layer(node: Any, src: Source, path: str, line: int | None = None) -> LayerParameter:
    """Parse one layer: common keys first, then the blocks its type takes."""
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
    declared = layer_params.blocks(layer_type, src=src, line=node.line_of("type"),
                                   path=f"{path}.type")
    block_keys = [k for k in node if k in declared]
    ignored = []
    for key in node:
        if key in _LAYER_KEYS or key in declared:
            continue
        if layer_params.caffe_block(key):
            log.warning("Warning: " + one_line(
                f"'{key}' does not apply to {_a(layer_type)} layer, so it is ignored (as Caffe "
                "ignores it)", _allowed_blocks(layer_type, declared), file=src.file,
                line=node.line_of(key), path=f"{path}.{key}"))
            ignored.append(key)
            continue
        raise unknown_key_error(key, _LAYER_KEYS + list(declared), f"{_a(layer_type)} layer",
                                node, src, path)
    spec = parse_message(LayerParameter, node, src, path, skip=block_keys + ignored)
    spec.params = {key: (parse_message(cls, node[key], src, f"{path}.{key}")
                         if key in node else cls())
                   for key, cls in declared.items()}
    if not spec.name:
        raise SpecError(f"the {layer_type} layer has no name", file=src.file, line=node.line,
                        path=path, fix="add 'name: <unique name>'")
    return spec


def parse_net(node: Any, src: Source, path: str = "", *,
              skip_unknown: bool = False) -> NetParameter:
    """Parse a NetParameter mapping (a file's root, or a solver's inline ``net_param``).

    ``skip_unknown`` leaves out the layers whose type caffe-py lacks (see
    :func:`unknown_types`) instead of failing on them; the others keep their ``layer[i]``.
    """
    if not isinstance(node, dict):
        raise SpecError("a net spec is a mapping with 'name' and 'layer'", file=src.file,
                        line=getattr(node, "line", None), path=path)
    node = node if isinstance(node, yamlio.MarkedDict) else _mark(node)
    layers = node.get("layer") or []  # 'layer:' with nothing under it is no layers
    net = parse_message(NetParameter, node, src, path, skip=("layer",))
    if not isinstance(layers, list):
        layers = [layers]
    lines = layers.item_lines if isinstance(layers, yamlio.MarkedList) else []
    if not skip_unknown:
        _check_types(layers, src, path)
    net.layer = []
    for i, layer_node in enumerate(layers):
        if skip_unknown and _type_of(layer_node) not in (None, *layer_params.LAYER_PARAMS):
            continue
        lpath = f"{path}.layer[{i}]" if path else f"layer[{i}]"
        if isinstance(layer_node, yamlio.MarkedDict) and not layer_node.line and lines:
            layer_node.line = lines[i]
        net.layer.append(parse_layer(layer_node, src, lpath,
                                     line=lines[i] if i < len(lines) else None))
    if len(net.input_shape) not in (0, len(net.input)):
        raise SpecError(f"{len(net.input)} inputs but {len(net.input_shape)} input_shape entries",
                        file=src.file, line=node.line_of("input_shape"),
                        path=_p(path, "input_shape"),
                        fix="give one input_shape per input")
    return net


def _check_types(layers: list, src: Source, path: str) -> None:
    """Every layer type caffe-py lacks, named in one error (not one per run)."""
    found = []
    for i, node in enumerate(layers):
        layer_type = node.get("type") if isinstance(node, dict) else None
        if isinstance(layer_type, str) and layer_type not in layer_params.LAYER_PARAMS:
            line = node.line_of("type") if isinstance(node, yamlio.MarkedDict) else None
            found.append((layer_type, line, f"{_p(path, f'layer[{i}]')}.type"))
    if found:
        raise layer_params.unsupported_types(found, src)


def unknown_types(node: Any) -> list[tuple[str, str, int]]:
    """(type, layer name, line) of every layer of a loaded net mapping whose type caffe-py
    does not have, in order."""
    layers = node.get("layer") if isinstance(node, dict) else None
    if not isinstance(layers, list):
        return []
    lines = layers.item_lines if isinstance(layers, yamlio.MarkedList) else [0] * len(layers)
    return [(str(_type_of(item)), str(item.get("name", "")), getattr(item, "line", 0) or line)
            for item, line in zip(layers, lines, strict=True)
            if _type_of(item) not in (None, *layer_params.LAYER_PARAMS)]


def _type_of(node: Any) -> str | None:
    kind = node.get("type") if isinstance(node, dict) else None
    return kind if isinstance(kind, str) else None


def load_net(path: str | Path) -> NetParameter:
    """Load and validate a net spec file."""
    return parse_net(yamlio.load(path), Source.of(path))


def _allowed_blocks(layer_type: str, declared: Mapping[str, type]) -> str:
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


# BlobShape, FillerParameter and the data, loss and softmax blocks live in spec.layer_params;
# they stay importable from here, where they were first (io reads TransformationParameter so).
__all__ = ["BlobShape", "FillerParameter", "ParamSpec", "NetState", "NetStateRule",
           "merge_states", "TransformationParameter",
           "DataParameter", "LossParameter", "SoftmaxParameter", "LayerParameter", "NetParameter",
           "parse_layer", "parse_net", "load_net", "unknown_types", "convert", "PHASES"]
