"""Imports every layer family so that each registers its types."""
from . import (  # noqa: F401
    activation,
    common,
    data,
    loss,
    normalization,
    recurrent,
    sources,
    vision,
)
