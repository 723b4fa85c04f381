"""The layer registry: Caffe type string -> layer class.

``@register("ReLU")`` on a :class:`~caffe_py.layers.base.Layer` subclass adds it. Registering
a type twice is an error naming the first registration; looking up an unknown type lists the
known ones and the nearest match.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import SpecError
from ..spec.schema import Source, suggest

if TYPE_CHECKING:
    from .base import Layer

_LAYERS: dict[str, type[Layer]] = {}


def register(type_name: str):
    """Class decorator: make ``type_name`` build this layer class."""
    def add(cls: type[Layer]) -> type[Layer]:
        first = _LAYERS.get(type_name)
        if first is not None:
            raise RuntimeError(f"layer type '{type_name}' is already registered by "
                               f"{first.__module__}.{first.__qualname__}")
        cls.type_name = type_name
        _LAYERS[type_name] = cls
        return cls
    return add


def known_types() -> list[str]:
    _load_library()
    return sorted(_LAYERS)


def lookup(type_name: str, *, src: Source | None = None, line: int | None = None,
           path: str = "") -> type[Layer]:
    """The class for ``type_name``; an unknown type is a SpecError listing the known ones."""
    _load_library()
    cls = _LAYERS.get(type_name)
    if cls is not None:
        return cls
    near = suggest(type_name, _LAYERS)
    fix = f"did you mean '{near}'? " if near else ""
    raise SpecError(f"unknown layer type '{type_name}'", file=src.file if src else None,
                    line=line, path=path, fix=f"{fix}known types: {', '.join(sorted(_LAYERS))}")


def declares_param(key: str) -> bool:
    """Whether any registered layer type takes a ``key`` block (e.g. 'pooling_param')."""
    _load_library()
    return any(key in cls.params for cls in _LAYERS.values())


def _load_library() -> None:
    from . import library  # noqa: F401  (importing registers every layer family)
