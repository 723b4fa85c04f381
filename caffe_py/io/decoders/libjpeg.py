"""JPEG files decoded on the CPU by torchvision's libjpeg-turbo binding, for the decode workers.

PIL decodes a JPEG with the same library but holds the GIL around it for about a fifth of a
256 x 256 image's decode (opening the file, the array interface), so its threads peak at 4-8;
``torchvision.io.decode_jpeg`` is one operator call that releases the GIL for the whole decode,
so threads can use the cores. Its pixels are PIL's (the same library; 4,096 of 4,096 benchmark
images identical, and tests/io/decoders/test_libjpeg.py compares them where torchvision is
installed). torchvision is optional: without it the workers use PIL.

Only the common case takes this path: a colour JPEG that libjpeg decodes to three channels
(YCbCr or RGB), wanted as three channels. Everything else (gray, CMYK, a file libjpeg refuses)
returns None and PIL decides, with its own conversions and its own error naming the record.
"""
from __future__ import annotations

import importlib.util
import logging
import threading
import warnings

import numpy as np
import torch

log = logging.getLogger(__name__)

_lock = threading.Lock()
_state: dict[str, object] = {}


def _decoder():
    """torchvision's ``decode_jpeg`` and its UNCHANGED mode, or None without torchvision."""
    if "decode" in _state:
        return _state["decode"]
    with _lock:
        if "decode" not in _state:
            try:
                from torchvision.io import ImageReadMode, decode_jpeg
                _state["decode"] = (decode_jpeg, ImageReadMode.UNCHANGED)
                with warnings.catch_warnings():  # torch says once that a read-only buffer
                    warnings.simplefilter("ignore", UserWarning)  # is shared, never written:
                    torch.frombuffer(b"\0", dtype=torch.uint8)  # say it here, to no one
            except Exception as exc:  # noqa: BLE001 (any import failure: PIL decodes)
                log.info("JPEG records are decoded by PIL (torchvision: %s)", exc)
                _state["decode"] = None
                _state["why"] = ("torchvision is not installed"
                                 if isinstance(exc, ModuleNotFoundError)
                                 else f"torchvision does not import ({' '.join(str(exc).split())})")
        return _state["decode"]


def installed() -> bool:
    """Whether torchvision is installed (found, not imported: the import takes a second)."""
    return importlib.util.find_spec("torchvision") is not None


def unavailable() -> str | None:
    """Why torchvision cannot decode JPEGs on the CPU here (None: it can)."""
    if _decoder() is None:
        return str(_state["why"])
    return None


def decode_rgb(file: bytes | memoryview) -> np.ndarray | None:
    """A colour JPEG as (3, H, W) uint8 RGB, or None where PIL should decide (no torchvision,
    not three channels, a file libjpeg refuses)."""
    decoder = _decoder()
    if decoder is None:
        return None
    decode_jpeg, unchanged = decoder
    try:
        image = decode_jpeg(torch.frombuffer(file, dtype=torch.uint8), mode=unchanged)
    except RuntimeError:
        return None
    if image.dim() != 3 or image.shape[0] != 3:
        return None
    return image.numpy()
