"""Imports every layer family so that each registers its types."""
from . import activation, common, data, loss, normalization, recurrent, vision  # noqa: F401
