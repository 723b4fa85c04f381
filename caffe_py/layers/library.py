"""Imports every layer family so that each registers its types."""
from . import (  # noqa: F401  (importing registers every layer family)
    activation,
    annotated_data,
    common,
    data,
    detection,
    loss,
    margin_loss,
    multibox,
    normalization,
    python,
    rcnn,
    recurrent,
    sources,
    spatial,
    utility,
    vision,
)
