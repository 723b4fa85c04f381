"""``--set KEY=VALUE`` overrides and the resolved solver and net a run writes beside its
snapshots.

A solver field is set by name (``--set base_lr=0.05``); a net field by layer name under
``net.`` (``--set net.conv1.convolution_param.num_output=32``). A value is read as YAML
(``0.05``, ``[1, 2]``, ``{type: xavier}``). Overrides are applied to the files' own YAML and the
result goes through the same schema as a file, so a bad value gets the same one-line error,
named ``--set KEY``. :func:`resolved_specs` gives the solver and net as the run uses them (every
override applied, paths made absolute) as plain YAML data: ``cpy train --solver
<prefix>_solver.yaml`` repeats the run.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..errors import SpecError
from . import yamlio
from .net_spec import NetParameter, parse_net
from .schema import Source, to_data
from .solver_spec import SolverParameter, parse_solver

NET_PREFIX = "net."


@dataclasses.dataclass
class Override:
    """One ``--set``: its text, the key path and the value read as YAML."""

    text: str
    keys: list[str]
    value: Any

    @property
    def name(self) -> str:
        return f"--set {'.'.join(self.keys)}"


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
    return Override(text, key.split("."), value)


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
    solver_sets = [o for o in overrides if o.keys[0] != "net"]
    net_sets = [o for o in overrides if o.keys[0] == "net"]
    for o in solver_sets:
        _assign(raw, o.keys, o.value, o)
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
        named = [layer for layer in layers if isinstance(layer, dict)
                 and layer.get("name") == o.keys[1]]
        if not named:
            names = ", ".join(str(layer.get("name")) for layer in layers
                              if isinstance(layer, dict))
            raise SpecError(f"{o.name}: {net_path} has no layer '{o.keys[1]}' (its layers: "
                            f"{names})")
        for layer in named:  # a name shared by a TRAIN and a TEST layer: both
            _assign(layer, o.keys[2:], o.value, o)
    net = _parsed(lambda: parse_net(raw, src), sets, net=True)
    return _plain(raw), net


def _assign(node: dict, keys: Sequence[str], value: Any, o: Override) -> None:
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = yamlio.MarkedDict()
        if not isinstance(child, dict):
            raise SpecError(f"{o.name}: '{key}' holds {type(child).__name__}, not a block of "
                            "fields")
        node = child
    node[keys[-1]] = value


def _parsed(parse: Any, sets: Sequence[Override], net: bool = False) -> Any:
    """``parse()``; an error about an overridden key is named after its --set."""
    try:
        return parse()
    except SpecError as exc:
        for o in sets:
            key = ".".join(o.keys[2:] if net else o.keys)
            if exc.path == key or exc.path.endswith(f"].{key}") or exc.path.startswith(key):
                fix = f"; {exc.fix}" if exc.fix else ""
                raise SpecError(f"{o.name}: {exc.problem}{fix}") from None
        raise


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
    wrong = [o for o in overrides if o.keys[0] != "net"]
    if wrong:
        raise SpecError(f"{wrong[0].name}: this command takes a net, so only net fields: "
                        f"--set net.LAYER.FIELD=VALUE")
    return _net_with(str(path), overrides)[1]
