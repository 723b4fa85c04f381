"""One schema for every spec: typed, defaulted, documented dataclasses, parsed with line marks.

A *message* is a dataclass whose fields mirror a caffe.proto message, derived from
:class:`Message`. Declare each field with :func:`field`, which records its documentation, its
allowed values (Caffe's enums), whether it is a path (resolved against the YAML file's
directory), and numeric bounds::

    @dataclass
    class PoolingParameter(Message):
        pool: str = field("MAX", "pooling method", choices=("MAX", "AVE", "STOCHASTIC"))
        kernel_size: list[int] = field([], "window size; one value, or one per spatial axis")

:func:`parse_message` turns a loaded YAML mapping into an instance. It rejects unknown keys
(naming the nearest valid one), checks every type, accepts a single value where a list is
declared (as prototxt does for repeated fields), and then calls the message's optional
``check(self, v: Check)`` hook for rules that span fields. Every failure is a
:class:`~caffe_py.errors.SpecError` naming the file, line and key path. A parsed message
remembers which fields the spec wrote and where (:func:`is_set`, :func:`location`), so that
later errors about it (:func:`message_at`) point into the file too.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import types
import typing
from collections.abc import Iterable
from dataclasses import MISSING
from pathlib import Path
from typing import Any

from ..errors import SpecError, one_line
from .yamlio import MarkedDict, MarkedList


def field(default: Any = MISSING, doc: str = "", *,
          choices: Iterable[str] | typing.Mapping[str, int | None] | None = None,
          path: bool = False, min: float | None = None, max: float | None = None) -> Any:
    """A message field. Mutable defaults (lists) are copied per instance.

    ``choices`` as a mapping is a Caffe enum: each name with its number in caffe.proto (None
    for a name caffe-py adds), so that a spec may write the number, as protobuf's text format
    allows (``operation: 1`` is SUM); as a plain list of names, only the names are accepted.
    """
    numbers = None
    if isinstance(choices, typing.Mapping):
        numbers = {number: name for name, number in choices.items() if number is not None}
    meta = {"doc": doc, "choices": tuple(choices) if choices else None, "path": path,
            "min": min, "max": max, "numbers": numbers}
    if isinstance(default, list):
        return dataclasses.field(default_factory=functools.partial(list, default), metadata=meta)
    if dataclasses.is_dataclass(default) and not isinstance(default, type):
        return dataclasses.field(default_factory=functools.partial(dataclasses.replace, default),
                                 metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclasses.dataclass(frozen=True)
class Source:
    """Where a spec was read from: a file (for messages) and its directory (for paths)."""

    file: str = "<string>"
    base_dir: Path = Path(".")

    @classmethod
    def of(cls, path: str | Path) -> Source:
        path = Path(path)
        return cls(file=str(path), base_dir=path.resolve().parent)


@dataclasses.dataclass(frozen=True)
class Location:
    """A message's (or one key's) place in its file, kept so that later errors (net build,
    solver) can point at it."""

    file: str
    line: int
    path: str


@dataclasses.dataclass(frozen=True)
class Origin:
    """What the spec wrote for one message and where: the record :func:`parse_message` keeps."""

    location: Location
    key_lines: typing.Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Each written key's line."""
    written: frozenset[str] = frozenset()
    """The fields the spec wrote (Caffe's has_<field>())."""
    read: typing.Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Every field's value as read, to tell which fields code has set since."""


@dataclasses.dataclass
class Message:
    """Base of the spec's messages. A parsed message keeps its :class:`Origin` in ``_origin``,
    a keyword-only field, so ``dataclasses.replace`` carries the record over to the copy."""

    _origin: Origin | None = dataclasses.field(default=None, kw_only=True, repr=False,
                                               compare=False)


class Check:
    """Handed to a message's ``check`` hook: raise errors at a key's line."""

    def __init__(self, node: MarkedDict, src: Source, path: str):
        self.node, self.src, self.path = node, src, path

    def fail(self, key: str | None, problem: str, fix: str | None = None) -> typing.NoReturn:
        line = self.node.line_of(key) if key and isinstance(self.node, MarkedDict) else \
            getattr(self.node, "line", None)
        raise SpecError(problem, file=self.src.file, line=line, path=_join(self.path, key),
                        fix=fix)


def location(msg: Any, key: str | None = None) -> Location | None:
    """Where a parsed message (or its ``key``: that key's line, else the message's) was read
    from; None for messages built in code."""
    origin: Origin | None = getattr(msg, "_origin", None)
    if origin is None:
        return None
    if key is None:
        return origin.location
    loc = origin.location
    return Location(loc.file, origin.key_lines.get(key, loc.line), _join(loc.path, key))


def place(msg: Any, loc: Location | None) -> Any:
    """Give a message built in code the place in a file it stands for (e.g. the Input layer
    made of a net's legacy ``input`` fields), so that errors about it point there; returns it."""
    if loc is not None:
        object.__setattr__(msg, "_origin", Origin(loc))
    return msg


def message_at(msg: Any, problem: str, fix: str | None = None, *, key: str | None = None,
               named: bool = False) -> str:
    """The one-line message of an error about ``msg`` (or its ``key``), at the place it was
    read from; ``named`` starts it with "layer 'name' (Type): " (``msg`` is a layer's)."""
    loc = location(msg, key)
    layer = (msg.name, msg.type) if named else None
    if loc is None:
        return one_line(problem, fix, layer=layer)
    return one_line(problem, fix, file=loc.file, line=loc.line, path=loc.path, layer=layer)


def is_set(msg: Any, name: str) -> bool:
    """Caffe's ``has_<field>()``: the spec wrote the field, or code gave it another value since
    (``dataclasses.replace`` included). Always False for a message built in code."""
    origin: Origin | None = getattr(msg, "_origin", None)
    if origin is None:
        return False
    return name in origin.written or (name in origin.read
                                      and getattr(msg, name) != origin.read[name])


def field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]


def suggest(word: str, options: Iterable[str]) -> str | None:
    """The nearest of ``options`` to ``word``, or None when nothing is close."""
    options = list(options)
    lowered = {o.lower(): o for o in options}
    if word.lower() in lowered:
        return lowered[word.lower()]
    match = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return match[0] if match else None


def unknown_key_error(key: str, known: Iterable[str], what: str, node: MarkedDict, src: Source,
                      path: str) -> SpecError:
    near = suggest(key, known)
    fix = f"did you mean '{near}'?" if near else f"valid keys: {', '.join(sorted(known))}"
    return SpecError(f"unknown key '{key}' in {what}", file=src.file, line=node.line_of(key),
                     path=_join(path, key), fix=fix)


def parse_message(cls: type, node: Any, src: Source, path: str = "",
                  skip: Iterable[str] = (), line: int | None = None) -> Any:
    """Build message ``cls`` from a loaded mapping; ``skip`` names keys the caller handles.

    ``line`` is where the value sits when ``node`` is a scalar (which carries no line).
    """
    if node is None:
        node = _marked({})
        node.line = line or 0
    if not isinstance(node, dict):
        raise SpecError(f"expected a mapping for {cls.__name__}, got {_kind(node)}",
                        file=src.file, line=getattr(node, "line", None) or line, path=path)
    if not isinstance(node, MarkedDict):
        node = _marked(node)
    hints, fields = _schema_of(cls)
    skip = set(skip)
    values = {}
    for key, raw in node.items():
        if key in skip:
            continue
        if key not in fields:
            raise unknown_key_error(key, fields, cls.__name__, node, src, path)
        f = fields[key]
        values[key] = convert(raw, hints[key], f.metadata, src, _join(path, key),
                              node.line_of(key))
    _require_unset_minimums(fields, values, src, node, path, cls.__name__)
    obj = cls(**values)
    read = {name: _copied(getattr(obj, name)) for name in fields}
    object.__setattr__(obj, "_origin", Origin(Location(src.file, node.line, path),
                                              dict(getattr(node, "key_lines", {})),
                                              frozenset(k for k in node if k in fields), read))
    hook = getattr(obj, "check", None)
    if hook is not None:
        hook(Check(node, src, path))
    return obj


@functools.cache
def _schema_of(cls: type) -> tuple[dict[str, Any], dict[str, dataclasses.Field]]:
    """A message class's field types and public fields, worked out once per class
    (``get_type_hints`` evaluates every annotation's string: most of a large spec's time)."""
    return (typing.get_type_hints(cls),
            {f.name: f for f in dataclasses.fields(cls) if not f.name.startswith("_")})


def _require_unset_minimums(fields: typing.Mapping[str, dataclasses.Field], given: typing.Mapping,
                            src: Source, node: MarkedDict, path: str, what: str) -> None:
    """A field whose default lies below its own minimum (a batch_size) must be given."""
    for name, f in fields.items():
        lo, default = f.metadata.get("min"), f.default
        if name in given or lo is None or isinstance(default, bool) or \
                not isinstance(default, (int, float)) or default >= lo:
            continue
        raise SpecError(f"'{name}' is missing from {what} ({f.metadata.get('doc') or name})",
                        file=src.file, line=node.line or None, path=_join(path, name),
                        fix=f"give {name}: a value >= {lo}")


INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def convert(raw: Any, tp: Any, meta: typing.Mapping, src: Source, path: str, line: int) -> Any:
    """Convert one YAML value to the declared type ``tp``."""
    def fail(problem: str, fix: str | None = None) -> typing.NoReturn:
        raise SpecError(problem, file=src.file, line=line, path=path, fix=fix)

    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if raw is None:
            return None
        return convert(raw, args[0], meta, src, path, line)
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        items = raw if isinstance(raw, list) else [raw]
        lines = raw.item_lines if isinstance(raw, MarkedList) else [line] * len(items)
        return [convert(item, item_tp, meta, src, f"{path}[{i}]", lines[i])
                for i, item in enumerate(items)]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return parse_message(tp, raw, src, path, line=line)
    if tp is bool:
        if not isinstance(raw, bool):
            fail(f"expected true or false, got {_show(raw)}")
        return raw
    if tp is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            if isinstance(raw, float) and raw.is_integer():
                raw = int(raw)
            else:
                fail(f"expected an integer, got {_show(raw)}")
        if not INT64_MIN <= raw <= INT64_MAX:  # Caffe's widest integer fields are 64-bit
            fail(f"{raw} does not fit in 64 bits", "use a value between -2^63 and 2^63 - 1")
        _bounds(raw, meta, fail)
        return raw
    if tp is float:
        value = _to_float(raw)
        if value is None:
            fail(f"expected a number, got {_show(raw)}")
        if math.isfinite(value) and abs(value) > FLOAT32_MAX:
            fail(f"{value:g} does not fit in a 32-bit float, as Caffe's float fields are "
                 "(at most 3.4e+38)", "use a smaller value")
        _bounds(value, meta, fail)
        return value
    if tp is str:
        if isinstance(raw, bool) or raw is None or isinstance(raw, (dict, list)):
            fail(f"expected a string, got {_show(raw)}")
        numbers = meta.get("numbers")
        if numbers and isinstance(raw, int):  # an enum written as its number
            if raw not in numbers:
                fail(f"{raw} is not a value of this enum",
                     "use one of " + ", ".join(f"{name} ({number})"
                                               for number, name in sorted(numbers.items())))
            raw = numbers[raw]
        text = str(raw)
        choices = meta.get("choices")
        if choices and text not in choices:
            near = suggest(text, choices)
            fix = f"did you mean '{near}'?" if near else f"use one of {', '.join(choices)}"
            fail(f"'{text}' is not one of {', '.join(choices)}", fix)
        if meta.get("path") and text:
            text = str(resolve_path(text, src))
        return text
    raise TypeError(f"unsupported field type {tp!r} at {path}")  # a schema bug, not user input



FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32: a finite value past it (1e300 as a weight_decay, a ReLU slope or
a filler's value) would become inf in the net's float32 tensors, or fail converting to them."""

def resolve_path(value: str, src: Source) -> Path:
    """A path written in a spec, resolved against that spec's directory."""
    p = Path(value).expanduser()
    # normpath folds 'configs/../data' for readable messages; symlinks are left alone
    return p if p.is_absolute() else Path(os.path.normpath(src.base_dir / p))


def _bounds(value: float, meta: typing.Mapping, fail) -> None:
    lo, hi = meta.get("min"), meta.get("max")
    limits = [f"{op} {bound}" for op, bound in ((">=", lo), ("<=", hi)) if bound is not None]
    if value != value and limits:   # NaN: no comparison with a bound fails
        fail("nan is not a number", f"use a number {' and '.join(limits)}")
    if lo is not None and value < lo:
        fail(f"{value} is below the minimum {lo}", f"use a value >= {lo}")
    if hi is not None and value > hi:
        fail(f"{value} is above the maximum {hi}", f"use a value <= {hi}")


def _to_float(raw: Any) -> float | None:
    if isinstance(raw, bool):
        return None
    if isinstance(raw, (int, float)):
        return float(raw)
    if isinstance(raw, str):  # YAML 1.1 reads '1e-4' (no dot) as a string
        try:
            value = float(raw)
        except ValueError:
            return None
        return value if not math.isnan(value) else None
    return None


def _copied(value: Any) -> Any:
    """A list as read is kept as a copy: appending to the message's list later is a change."""
    return list(value) if isinstance(value, list) else value


def _join(path: str, key: str | None) -> str:
    if not key:
        return path
    return f"{path}.{key}" if path else key


def _kind(value: Any) -> str:
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {_show(value)}"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _marked(node: dict) -> MarkedDict:
    out = MarkedDict(node)
    out.key_lines = {}
    return out


def to_dict(msg: Any) -> dict:
    """A message as plain data (for printing and for saving next to snapshots)."""
    out = {}
    for f in dataclasses.fields(msg):
        if f.name.startswith("_"):
            continue
        value = getattr(msg, f.name)
        if dataclasses.is_dataclass(value):
            value = to_dict(value)
        elif isinstance(value, list):
            value = [to_dict(v) if dataclasses.is_dataclass(v) else v for v in value]
        out[f.name] = value
    return out


def to_data(msg: Any) -> dict[str, Any]:
    """A message as the YAML data that parses back to an equal message: every field the spec
    wrote or code changed since (:func:`is_set`), and, for a message built in code, every field
    that differs from its default; nested messages likewise (a layer's ``params`` blocks
    under their own keys)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(msg):
        if f.name.startswith("_"):
            continue
        value = getattr(msg, f.name)
        if isinstance(value, dict) and f.name == "params":  # LayerParameter's type blocks
            out.update({key: data for key, block in value.items() if (data := to_data(block))})
            continue
        if not _written(msg, f, value):
            continue
        if dataclasses.is_dataclass(value):
            out[f.name] = to_data(value)
        elif isinstance(value, list):
            out[f.name] = [to_data(v) if dataclasses.is_dataclass(v) else v for v in value]
        else:
            out[f.name] = value
    return out


def _written(msg: Any, f: dataclasses.Field, value: Any) -> bool:
    if getattr(msg, "_origin", None) is not None:
        return is_set(msg, f.name)
    if f.default is not dataclasses.MISSING:
        return bool(value != f.default)
    if f.default_factory is not dataclasses.MISSING:
        return bool(value != f.default_factory())
    return True

