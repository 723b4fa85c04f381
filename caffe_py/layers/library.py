"""Imports every layer family so that each registers its types."""
from . import (  # noqa: F401  (importing registers every layer family)
    activation,
    common,
    data,
    face,
    loss,
    margin_loss,
    mobile,
    normalization,
    python,
    recurrent,
    seg_sources,
    segmentation,
    sources,
    spatial,
    utility,
    vision,
)
