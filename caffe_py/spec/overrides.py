"""``--set KEY=VALUE`` overrides and the resolved solver and net a run writes beside its
snapshots.

A solver field is set by name (``--set base_lr=0.05``, ``--set net=other.yaml``); a net field
by layer name under ``net.`` (``--set net.conv1.convolution_param.num_output=32``). A number
in the key indexes a list (``--set net.conv1.param.0.lr_mult=0``, ``--set stepvalue.1=2000``);
a list of messages grows to the index when shorter (the new entries are defaults). Where two
layers share a name (Caffe's nets name their TRAIN and TEST data layers alike) the key picks
one, ``net.mnist@TEST.data_param.source`` (or by position among them, ``net.mnist@1``);
setting both silently is refused. A value is read as YAML (``0.05``, ``[1, 2]``,
``{type: xavier}``); a value of a path field, given on the command line, is relative to the
current directory (a file's paths are relative to the file). Overrides are applied to the
files' own YAML and the result goes through the same schema as a file, so a bad value gets the
same one-line error, named ``--set KEY``. :func:`resolved_specs` gives the solver and net as
the run uses them (every override applied, paths made absolute) as plain YAML data: ``cpy train
--solver <prefix>_solver.yaml`` repeats the run.
"""
from __future__ import annotations

import copy
import dataclasses
import os
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..errors import SpecError
from . import yamlio
from .layer_params import LAYER_PARAMS
from .net_spec import LayerParameter, NetParameter, parse_net
from .schema import Source, to_data
from .solver_spec import SolverParameter, parse_solver

NET_PREFIX = "net."
PHASES = ("TRAIN", "TEST")
Key = str | int
"""One step of an override's key path: a field name, or an index into a list."""


@dataclasses.dataclass
class Override:
    """One ``--set``: its text, the key path (list indices as ints) and the value read as
    YAML."""

    text: str
    keys: list[Key]
    value: Any

    @property
    def name(self) -> str:
        return f"--set {'.'.join(str(k) for k in self.keys)}"

    @property
    def on_net(self) -> bool:
        """Sets a field of the net (``net.LAYER...``), not the solver's (``net=`` included)."""
        return self.keys[0] == "net" and len(self.keys) > 1


def parse_override(text: str) -> Override:
    key, eq, raw = text.partition("=")
    key = key.strip()
    if not eq or not key or any(not part for part in key.split(".")):
        raise SpecError(f"--set {text}: expected KEY=VALUE (e.g. --set base_lr=0.05 or --set "
                        "net.conv1.convolution_param.num_output=32)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        raise SpecError(f"--set {key}: the value '{raw}' is not YAML; quote it") from None
    parts = key.split(".")
    keys: list[Key] = [int(k) if k.isdigit() and i > 0 and not (parts[0] == "net" and i == 1)
                       else k for i, k in enumerate(parts)]
    return Override(text, keys, value)


@dataclasses.dataclass
class Resolved:
    """The solver as the run uses it, and the YAML data of it and of its net."""

    param: SolverParameter
    solver: dict
    net: dict | None


def load_with_overrides(path: str | Path, sets: Sequence[str]) -> Resolved:
    """Load the solver file with every ``--set`` applied (validated as the file is)."""
    overrides = [parse_override(s) for s in sets]
    src = Source.of(path)
    raw = yamlio.load(path)
    if not isinstance(raw, dict):
        return Resolved(parse_solver(raw, src), {}, None)
    solver_sets = [o for o in overrides if not o.on_net]
    net_sets = [o for o in overrides if o.on_net]
    for o in solver_sets:
        _check_indices(SolverParameter, o.keys, 0, o)
        _assign(raw, o.keys, _from_here(o, _field_at(SolverParameter, o.keys)), o)
    param = _parsed(lambda: parse_solver(raw, src), solver_sets)
    net_raw = None
    if param.net and not param.net_param:
        net_raw, net_param = _net_with(param.net, net_sets)
        param = dataclasses.replace(param, net="", net_param=net_param)
    elif net_sets:
        raise SpecError(f"{net_sets[0].name}: the solver has no net file to set it in (it "
                        "uses inline nets or train_net/test_net); edit the spec")
    return Resolved(param, _plain(raw), net_raw)


def _net_with(net_path: str, sets: Sequence[Override]) -> tuple[dict, NetParameter]:
    """The net file with the ``net.LAYER.KEY...`` overrides, parsed; and its YAML data."""
    raw = yamlio.load(net_path)
    src = Source.of(net_path)
    layers = raw.get("layer", []) if isinstance(raw, dict) else []
    for o in sets:
        if len(o.keys) < 3:
            raise SpecError(f"{o.name}: name a layer and a field, e.g. --set "
                            "net.conv1.convolution_param.num_output=32")
        layer = _layer_named(layers, str(o.keys[1]), o, net_path)
        cls = LAYER_PARAMS.get(str(layer.get("type")), {}).get(str(o.keys[2]))
        if cls is not None:
            _check_indices(cls, o.keys[3:], 3, o)
            target = _field_at(cls, o.keys[3:])
        else:
            _check_indices(LayerParameter, o.keys[2:], 2, o)
            target = _field_at(LayerParameter, o.keys[2:])
        _assign(layer, o.keys[2:], _from_here(o, target), o)
    net = _parsed(lambda: parse_net(raw, src), sets, net=True)
    return _plain(raw), net


def _layer_named(layers: list, key: str, o: Override, net_path: str) -> dict:
    """The one layer ``key`` names: ``NAME``, ``NAME@TRAIN``/``NAME@TEST`` (the one kept in
    that phase) or ``NAME@K`` (the K-th of that name, from 0); two layers of one name without
    a pick are refused, saying how to pick."""
    name, at, pick = key.rpartition("@")
    if not at or not (pick in PHASES or pick.isdigit()):
        name, pick = key, ""
    named = [layer for layer in layers if isinstance(layer, dict) and layer.get("name") == name]
    if not named:
        names = ", ".join(str(layer.get("name")) for layer in layers if isinstance(layer, dict))
        raise SpecError(f"{o.name}: {net_path} has no layer '{name}' (its layers: {names})")
    rest = ".".join(str(k) for k in o.keys[2:])
    if pick.isdigit():
        if int(pick) >= len(named):
            raise SpecError(f"{o.name}: {net_path} has {len(named)} layer(s) named '{name}'; "
                            f"pick one of net.{name}@0 .. net.{name}@{len(named) - 1}")
        return named[int(pick)]
    if pick:
        named = [layer for layer in named if _kept_for(layer, pick)]
        if not named:
            raise SpecError(f"{o.name}: {net_path} has no layer '{name}' in phase {pick}")
        if len(named) == 1:
            return named[0]
    if len(named) == 1:
        return named[0]
    phases = [_phase_of(layer) for layer in named]
    lines = " and ".join(str(getattr(layer, "line", "?")) for layer in named)
    if not pick and len(set(phases)) == len(phases) and None not in phases:
        picks = " or ".join(f"net.{name}@{phase}.{rest}" for phase in phases)
        what = ", ".join(str(phase) for phase in phases)
    else:
        picks = " or ".join(f"net.{name}@{i}.{rest}" for i in range(len(named)))
        what = "in the same phase" if pick else "; ".join(str(p or "both phases")
                                                            for p in phases)
    raise SpecError(f"{o.name}: {len(named)} layers of {net_path} are named '{name}' (lines "
                    f"{lines}: {what}); pick one: {picks}")


def _kept_for(layer: dict, phase: str) -> bool:
    """Whether a layer's YAML include/exclude rules keep it in ``phase`` (its level and stage
    rules aside)."""
    def rules(key: str) -> list:
        value = layer.get(key) or []
        return [r for r in (value if isinstance(value, list) else [value]) if isinstance(r, dict)]

    if layer.get("include"):
        return any(r.get("phase") in (None, phase) for r in rules("include"))
    return not any(r.get("phase") == phase for r in rules("exclude"))


def _phase_of(layer: dict) -> str | None:
    """TRAIN or TEST for a layer kept in only that phase; None when kept in both or neither."""
    kept = [phase for phase in PHASES if _kept_for(layer, phase)]
    return kept[0] if len(kept) == 1 else None


def _field_at(cls: type | None, keys: Sequence[Key]) -> tuple[Any, bool]:
    """(the type declared at ``keys`` under message ``cls``, whether it is a path field);
    (None, False) where the schema does not say (a misspelt key: the parse will)."""
    tp: Any = cls
    is_path = False
    for key in keys:
        tp = _optional_arg(tp)
        if isinstance(key, int):
            if typing.get_origin(tp) is not list:
                return None, False
            tp = typing.get_args(tp)[0]
            continue
        if not dataclasses.is_dataclass(tp):
            return None, False
        fields = {f.name: f for f in dataclasses.fields(tp)}
        if key not in fields:
            return None, False
        is_path = bool(fields[key].metadata.get("path"))
        tp = typing.get_type_hints(tp)[key]
    return _optional_arg(tp), is_path


def _check_indices(cls: type, keys: Sequence[Key], skipped: int, o: Override) -> None:
    """Every index in ``keys`` follows a list field (as far as the schema says)."""
    for depth, key in enumerate(keys):
        if not isinstance(key, int):
            continue
        tp, _ = _field_at(cls, keys[:depth])
        if tp is None or typing.get_origin(tp) is list:
            continue
        what = "a block of fields" if dataclasses.is_dataclass(tp) else "one value"
        raise SpecError(f"{o.name}: '{o.keys[skipped + depth - 1]}' holds {what}, not a "
                        f"list; drop the index {key}")


def _optional_arg(tp: Any) -> Any:
    """``X`` for ``X | None``."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if args and typing.get_origin(tp) is not list and len(args) == 1 else tp


def _from_here(o: Override, target: tuple[Any, bool]) -> Any:
    """The override's value, a path made absolute against the current directory (where the
    command line was typed), as a file's paths are against the file's directory."""
    _, is_path = target
    value = o.value
    if not is_path:
        return value
    if isinstance(value, str) and value:
        return os.path.abspath(value)
    if isinstance(value, list):
        return [os.path.abspath(v) if isinstance(v, str) and v else v for v in value]
    return value


def _assign(node: dict, keys: Sequence[Key], value: Any, o: Override) -> None:
    """``node[keys[0]][keys[1]]... = value``: blocks made where missing, a number indexing a
    list (one value written for a list is a list of one; a list of blocks grows to the
    index)."""
    here: Any = node
    for depth, key in enumerate(keys):
        last = depth == len(keys) - 1
        if isinstance(key, int):
            if isinstance(here, dict):
                raise SpecError(f"{o.name}: '{keys[depth - 1]}' holds a block of fields, not a "
                                f"list; drop the index {key}")
            if key >= len(here):
                blocks = not here or all(isinstance(item, dict) for item in here)
                if key > len(here) and not (blocks and not last):
                    raise SpecError(f"{o.name}: '{keys[depth - 1]}' has {len(here)} entries; "
                                    f"use an index up to {len(here)} (one past the end adds "
                                    "an entry)")
                _grow(here, key + 1)
        elif not isinstance(here, dict):
            raise SpecError(f"{o.name}: '{keys[depth - 1]}' holds {type(here).__name__}, not "
                            "a block of fields")
        if last:
            here[key] = value
            return
        child = here[key] if isinstance(key, int) else here.get(key)
        if child is None:
            child = _list() if isinstance(keys[depth + 1], int) else _block()
            here[key] = child
        elif isinstance(keys[depth + 1], int) and not isinstance(child, list):
            child = here[key] = _list([child])  # one value written for a list: a list of it
        if not isinstance(child, (dict, list)):
            raise SpecError(f"{o.name}: '{key}' holds {type(child).__name__}, not a block of "
                            "fields")
        here = child


def _block() -> yamlio.MarkedDict:
    """An empty block, marked as the loader marks them (no lines: it comes from a --set)."""
    block = yamlio.MarkedDict()
    block.line, block.key_lines = 0, {}
    return block


def _list(items: Sequence[Any] = ()) -> yamlio.MarkedList:
    marked = yamlio.MarkedList(items)
    marked.line, marked.item_lines = 0, [getattr(item, "line", 0) for item in items]
    return marked


def _grow(items: list, length: int) -> None:
    """Default blocks appended up to ``length`` entries (their lines kept in step)."""
    lines = getattr(items, "item_lines", None)
    while len(items) < length:
        items.append(_block())
        if lines is not None:
            lines.append(getattr(items, "line", 0))


def _parsed(parse: Any, sets: Sequence[Override], net: bool = False) -> Any:
    """``parse()``; an error about an overridden key is named after its --set."""
    try:
        return parse()
    except SpecError as exc:
        for o in sets:
            key = _schema_path(o.keys[2:] if net else o.keys)
            if exc.path == key or exc.path.endswith(f"].{key}") or exc.path.startswith(key):
                fix = f"; {exc.fix}" if exc.fix else ""
                raise SpecError(f"{o.name}: {exc.problem}{fix}") from None
        raise


def _schema_path(keys: Sequence[Key]) -> str:
    """``['param', 0, 'lr_mult']`` as the schema writes it: ``param[0].lr_mult``."""
    text = ""
    for key in keys:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else key)
    return text


def _plain(node: Any) -> Any:
    """YAML data without the loader's marks."""
    if isinstance(node, dict):
        return {str(k): _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def resolved_of(param: SolverParameter) -> Resolved:
    """A solver parsed elsewhere (or built in code) with the YAML data it stands for: the
    fields written or changed, its inline net apart, as if read from a solver and a net file."""
    solver = to_data(param)
    net = None
    if param.net_param is not None:
        solver.pop("net_param", None)
        net = to_data(param.net_param)
    return Resolved(param, solver, net)


def resolved_specs(resolved: Resolved, param: SolverParameter,
                   stem: str | None = None) -> tuple[str, str | None]:
    """The YAML text of the solver as the run uses it (``param``: the seed drawn and the
    precision chosen filled in; its net the resolved net file ``<stem>_net.yaml``, the stem by
    default the snapshot prefix) and of the net, with relative paths made absolute."""
    prefix = stem or param.snapshot_prefix
    solver = copy.deepcopy(resolved.solver)
    solver["random_seed"] = param.random_seed
    if param.precision != resolved.param.precision:
        solver["precision"] = param.precision
    net_text = None
    if resolved.net is not None:
        solver["net"] = f"{Path(prefix).name}_net.yaml"
        solver.pop("net_param", None)
        net = _absolute(copy.deepcopy(resolved.net), resolved.param.net_param)
        net_text = yaml.safe_dump(net, sort_keys=False, allow_unicode=True, default_flow_style=None)
    _absolute_solver(solver, resolved.param)
    return (yaml.safe_dump(solver, sort_keys=False, allow_unicode=True, default_flow_style=False),
            net_text)


def _absolute(raw: dict, net: NetParameter | None) -> dict:
    """The net's path fields (data sources, mean files...) as the parsed net resolved them."""
    if net is None:
        return raw
    layers = [layer for layer in raw.get("layer", []) if isinstance(layer, dict)]
    for node, layer in zip(layers, net.layer, strict=False):
        for key, block in layer.params.items():
            if isinstance(node.get(key), dict):
                _paths_from(node[key], block)
    return raw


def _paths_from(node: dict, msg: Any) -> None:
    for f in dataclasses.fields(msg):
        if f.name not in node:
            continue
        value = getattr(msg, f.name)
        if f.metadata.get("path") and value:
            node[f.name] = value
        elif dataclasses.is_dataclass(value) and isinstance(node[f.name], dict):
            _paths_from(node[f.name], value)


def _absolute_solver(solver: dict, param: SolverParameter) -> None:
    for f in dataclasses.fields(param):
        if f.metadata.get("path") and f.name in solver and f.name != "net":
            solver[f.name] = getattr(param, f.name)


def load_net_with_overrides(path: str | Path, sets: Sequence[str]) -> NetParameter:
    """A net file (``cpy test --model``, ``cpy time``) with its ``net.LAYER.KEY`` overrides."""
    overrides = [parse_override(s) for s in sets]
    wrong = [o for o in overrides if not o.on_net]
    if wrong:
        raise SpecError(f"{wrong[0].name}: this command takes a net, so only net fields: "
                        f"--set net.LAYER.FIELD=VALUE")
    return _net_with(str(path), overrides)[1]
