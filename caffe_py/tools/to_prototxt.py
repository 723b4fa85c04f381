"""A net's YAML data (caffe-py's spec, or an imported prototxt) written back as Caffe's text
format, as protobuf's TextFormat prints a NetParameter: ``name: "value"`` for strings, bare
words for enums (a field whose ``choices`` are Caffe's upper-case enum names, e.g. LMDB,
MAX, TRAIN) and booleans, one ``name { ... }`` block per
message and one line per repeated value, two spaces a level. Caffe's
``upgrade_net_proto_text`` writes such a file; ``cpy upgrade_net_proto_text`` does too.

Fields keep the order of the data (the prototxt's own, after the upgrade), where protobuf
prints them in caffe.proto's field order: the two read as the same NetParameter.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..errors import SpecError
from ..fileio import atomic_write_bytes
from ..spec.layer_params import LAYER_PARAMS
from ..spec.net_spec import LayerParameter, NetParameter
from .prototxt import parse_file
from .upgrade_v0 import is_v0

log = logging.getLogger(__name__)

_ENUM_WORD = re.compile(r"^[A-Z][A-Z0-9_]*$")
_BLOCKS: dict[str, type] = {key: cls for blocks in LAYER_PARAMS.values()
                            for key, cls in blocks.items()}
"""Every ``<x>_param`` block key -> its message class (a block written on a layer of another
type keeps its kind)."""


def net_prototxt(data: Mapping[str, Any]) -> str:
    """The text of NetParameter ``data`` (YAML data: mappings, lists, scalars)."""
    lines: list[str] = []
    _message(data, NetParameter, 0, lines)
    return "\n".join(lines) + "\n"


def _message(node: Mapping[str, Any], cls: type | None, depth: int, lines: list[str]) -> None:
    for key, value in node.items():
        kind, enum = _field(cls, key, node)
        for item in value if isinstance(value, list) else [value]:
            _value(str(key), item, kind, enum, depth, lines)


def _value(key: str, value: Any, kind: type | None, enum: bool | None, depth: int,
           lines: list[str]) -> None:
    """One field's line(s); ``enum`` None: a field the schema does not know (a word in
    capitals is then taken for an enum)."""
    pad = "  " * depth
    if isinstance(value, Mapping):
        lines.append(f"{pad}{key} {{")
        _message(value, kind, depth + 1, lines)
        lines.append(f"{pad}}}")
    elif isinstance(value, bool):
        lines.append(f"{pad}{key}: {'true' if value else 'false'}")
    elif isinstance(value, (int, float)):
        lines.append(f"{pad}{key}: {value!r}")
    elif value is None:
        return
    else:
        text = str(value)
        bare = enum if enum is not None else _ENUM_WORD.match(text) is not None
        lines.append(f"{pad}{key}: {text if bare else _quoted(text)}")


def _quoted(text: str) -> str:
    """A protobuf text string: double quotes, C escapes (JSON's are a subset it reads)."""
    return json.dumps(text, ensure_ascii=False)


def _field(cls: type | None, key: str,
           node: Mapping[str, Any]) -> tuple[type | None, bool | None]:
    """(the message class of field ``key`` of ``cls``, or None; whether it is an enum, None
    when the schema does not know the field)."""
    if cls is LayerParameter and key not in _layer_fields():
        blocks = LAYER_PARAMS.get(str(node.get("type")), {})
        block = blocks.get(key) or _BLOCKS.get(key)
        return block, False if block is not None else None
    if cls is None or not dataclasses.is_dataclass(cls):
        return None, None
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if key not in fields:
        return None, None
    tp = typing.get_type_hints(cls)[key]
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    while typing.get_origin(tp) in (list, typing.Union) or (args and len(args) == 1
                                                           and tp not in args):
        tp = args[0]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
    is_message = dataclasses.is_dataclass(tp)
    choices = fields[key].metadata.get("choices") or ()
    enum = bool(choices) and all(_ENUM_WORD.match(str(c)) for c in choices)
    return (tp if is_message else None), enum


def _layer_fields() -> set[str]:
    return {f.name for f in dataclasses.fields(LayerParameter)} - {"params"}


def upgrade_net_file(source: str | Path, out: str | Path) -> None:
    """Caffe's ``upgrade_net_proto_text SOURCE OUT``: the net prototxt SOURCE (V0, V1 or
    current) upgraded as Caffe's UpgradeNetAsNeeded does, written to OUT: Caffe's text format,
    or caffe-py's YAML spec when OUT ends in .yaml/.yml (then checked by loading it, as
    ``cpy import-prototxt`` does). Relative paths are kept as written (both read from the
    directory Caffe runs in). Logs Caffe's lines."""
    from .to_yaml import convert, import_file

    source, out = Path(source), Path(out)
    msg = parse_file(source)
    if not msg.all("layer") and not msg.all("layers") and not msg.all("input"):
        raise SpecError("not a net prototxt (no layer, layers or input)", file=str(source),
                        fix="give a NetParameter prototxt (solvers: cpy import-prototxt)")
    stages = (["V0LayerParameter"] if is_v0(msg) else []) + \
        (["V1LayerParameter"] if msg.all("layers") else [])
    for stage in stages:
        log.info(f"Attempting to upgrade input file specified using deprecated {stage}: "
                 f"{source}")
        log.info(f"Successfully upgraded file specified using deprecated {stage}")
    if not stages:
        log.warning(f"File already in latest proto format: {source}")
    if out.suffix.lower() in (".yaml", ".yml"):
        import_file(source, out, kind="net")
        log.info(f"Wrote upgraded NetParameter as caffe-py's YAML spec to {out}")
        return
    here = Path.cwd().resolve()
    conv = convert(msg, "net", source=str(source), root=here, out=here / "upgraded.yaml")
    atomic_write_bytes(out, net_prototxt(yaml.safe_load(conv.text) or {}).encode("utf-8"))
    log.info(f"Wrote upgraded NetParameter text proto to {out}")
