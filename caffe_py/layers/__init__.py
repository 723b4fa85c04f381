"""The layer library: every Caffe layer type, registered by its type string."""
from .base import BuildContext, Layer, Shape
from .registry import known_types, lookup, register

__all__ = ["BuildContext", "Layer", "Shape", "known_types", "lookup", "register"]
