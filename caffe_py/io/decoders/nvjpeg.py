"""JPEG records decoded on the GPU: nvJPEG through ``torchvision.io.decode_jpeg``, a batch per call.

torchvision is imported only here and only when a feed decodes on the GPU (it is optional:
without it JPEG records are decoded by the CPU workers). Its decoder uses the GPU's hardware
JPEG engines where there are some (A100, H100, H200) and the CUDA decoder elsewhere.

torchvision keeps one nvJPEG decoder per process, for one device, behind a lock; a call for
another device builds a new decoder (and the old one is never freed). So all the feeds of a
process decode on one device, the first one's (:func:`decode_device`): on one GPU that is the
feed's own; with several replicas the others copy their decoded batches over.

Tolerance: nvJPEG's inverse DCT and chroma upsampling are not libjpeg's, so its pixels differ
from PIL's by a level or two here and there (torchvision's own test of decode_jpeg on CUDA
against its CPU decoder allows a mean absolute difference below 2 per image); what happens
after the decode (crop, mirror, mean, scale) is the CPU path's, bit for bit.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import torch

_lock = threading.Lock()
_decode_device: torch.device | None = None


def unavailable() -> str | None:
    """Why JPEG records cannot be decoded on the GPU in this process (None: they can)."""
    if not torch.cuda.is_available():
        return "CUDA is not available"
    try:
        import torchvision.io  # noqa: F401
    except ImportError as exc:
        return f"torchvision is not installed ({exc})"
    return None


def decode_device(wanted: torch.device) -> torch.device:
    """The device every GPU decode of this process runs on: the first one asked for."""
    global _decode_device
    with _lock:
        if _decode_device is None:
            _decode_device = wanted
        return _decode_device


class GpuJpegDecoder:
    """Decodes a feed's batches of JPEG files with nvJPEG: ``decode(files)`` -> one
    (C, H, W) uint8 tensor per file (RGB, or gray for ``channels`` 1) on :attr:`device`."""

    def __init__(self, feed_device: torch.device, channels: int):
        from torchvision.io import ImageReadMode

        self.mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
        self.device = decode_device(feed_device)
        self._staging: torch.Tensor | None = None  # pinned: the batch's files, end to end
        self.stream: torch.cuda.Stream | None = None
        """Where a feed on another device stacks the decoded images (None: its own)."""
        if self.device != feed_device:
            self.stream = torch.cuda.Stream(self.device)

    def decode(self, files: Sequence[bytes | memoryview]) -> list[torch.Tensor]:
        """The files, decoded; the call returns when they are (torchvision synchronizes its
        decoder's stream and orders the caller's current stream after it)."""
        from torchvision.io import decode_jpeg

        lengths = [len(f) for f in files]
        staging = self._staging_for(sum(lengths))
        host, pos = staging.numpy(), 0
        for file, n in zip(files, lengths, strict=True):  # one copy into pinned memory
            host[pos:pos + n] = np.frombuffer(file, np.uint8)
            pos += n
        views = list(torch.split(staging[:pos], lengths))
        return decode_jpeg(views, mode=self.mode, device=self.device)

    def _staging_for(self, size: int) -> torch.Tensor:
        """The pinned buffer, grown to hold ``size`` bytes (reused: each decode is done
        with it when it returns)."""
        if self._staging is None or len(self._staging) < size:
            self._staging = torch.empty(size + size // 2, dtype=torch.uint8, pin_memory=True)
        return self._staging
