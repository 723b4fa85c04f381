"""The layer registry: Caffe type string -> layer class.

``@register("ReLU")`` on a :class:`~caffe_py.layers.base.Layer` subclass adds it and hands it
the parameter blocks the spec's table declares for the type (``Layer.params``, from
:mod:`caffe_py.spec.layer_params`). Registering a type twice is an error naming the first
registration, and so is registering a type the table lacks; looking up an unknown type lists
the known ones and the nearest match.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..spec import layer_params
from ..spec.schema import Source

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
        if type_name not in layer_params.LAYER_PARAMS:
            raise RuntimeError(f"layer type '{type_name}' has no entry in the spec's table of "
                               f"parameter blocks: add \"{type_name}\": {{...}} ({{}} for none) "
                               "to LAYER_PARAMS in caffe_py/spec/layer_params/__init__.py")
        cls.type_name = type_name
        cls.params = layer_params.blocks(type_name)
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
    layer_params.blocks(type_name, src=src, line=line, path=path)  # unknown: a SpecError
    raise RuntimeError(f"layer type '{type_name}' is in the spec's table of parameter blocks "
                       "but no layer class is registered for it")


def _load_library() -> None:
    from . import library  # noqa: F401  (importing registers every layer family)
