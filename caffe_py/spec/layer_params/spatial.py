"""The block of the spatial layers built on the vision ones: SPP (Im2col takes
convolution_param)."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Message, field
from .shared import ENGINE_NUMBERS, POOL_METHODS


@dataclass
class SPPParameter(Message):
    """Spatial pyramid pooling (Caffe's SPPParameter)."""

    pyramid_height: int = field(0, "levels: level i pools a 2^i x 2^i grid (required, >= 1)",
                                min=0)
    pool: str = field("MAX", "pooling method", choices=POOL_METHODS)
    engine: str = field("DEFAULT", "implementation (all map to torch's pooling)",
                        choices=ENGINE_NUMBERS)
