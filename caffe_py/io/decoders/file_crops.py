"""One record's file decoded and its crop window written into a batch: the code the decode
threads (:mod:`~caffe_py.io.feed.image_batch`) and the decode processes
(:mod:`.decode_processes`) share.

A record's file is an image file (JPEG, PNG), or the pixels of a raw record (big raw records of
an LMDB are cropped by the decode processes too: :data:`RAW`). The pixels are the reader's own
decoder's (PIL, :func:`~caffe_py.io.formats.datum.decode_image`), bit for bit; torchvision's JPEG
decoder (:mod:`.libjpeg`) gives the same pixels in less time. """
from __future__ import annotations

import io

import numpy as np

from ...errors import DataError
from ..formats.datum import format_key, pil_to_chw
from ..formats.envelope import is_jpeg

PIL, TORCHVISION, RAW = "pil", "torchvision", "raw"
"""What a record's file is and what reads it (:func:`crop_record`): an image file PIL decodes;
one torchvision decodes where it is a colour JPEG (PIL the rest); a raw record's pixels."""


def check_record(path: str, key: bytes, array: np.ndarray, shape: tuple[int, ...],
                 dtype: np.dtype) -> None:
    """A decoded record must have the first record's shape and dtype."""
    if tuple(array.shape) != tuple(shape) or array.dtype != dtype:
        raise DataError(f"{path}: record {format_key(key)} is {array.dtype} "
                        f"{list(array.shape)} but the first record is {dtype} {list(shape)}; a "
                        "Data layer needs records of one size and kind (resize when converting)")


def crop_record(path: str, record_shape: tuple[int, ...], color: bool | None, reads: str,
                file, key: bytes, out: np.ndarray, offset, flip: bool) -> None:
    """Record ``key``'s crop window at ``offset`` (h0, w0), mirrored where ``flip``, into
    ``out`` (C, h, w), from its ``file`` as ``reads`` says (:data:`PIL`, :data:`TORCHVISION`,
    :data:`RAW`); the record must be ``record_shape`` (C, H, W) uint8."""
    if reads == RAW:
        crop_raw(path, record_shape, file, key, out, offset, flip)
        return
    rgb = None
    if reads == TORCHVISION and is_jpeg(file):
        from . import libjpeg  # imports torch: only where torchvision decodes

        rgb = libjpeg.decode_rgb(file)
    decode_crop(path, record_shape, color, file, key, out, offset, flip, rgb)


def crop_raw(path: str, record_shape: tuple[int, ...], pixels, key: bytes, out: np.ndarray,
             offset, flip: bool) -> None:
    """A raw record's crop window: ``pixels`` are its (C, H, W) uint8 bytes in Caffe's order."""
    c, h, w = record_shape
    chw = np.frombuffer(pixels, np.uint8)
    if chw.size != c * h * w:
        raise DataError(f"{path}: record {format_key(key)} holds {chw.size} bytes of pixels "
                        f"but the first record is uint8 {list(record_shape)} ({c * h * w} "
                        "bytes); a Data layer needs records of one size (resize when "
                        "converting)")
    h0, w0 = offset
    _, ch, cw = out.shape
    window = chw.reshape(c, h, w)[:, h0:h0 + ch, w0:w0 + cw]
    out[...] = window[:, :, ::-1] if flip else window


def decode_crop(path: str, record_shape: tuple[int, ...], color: bool | None, file,
                key: bytes, out: np.ndarray, offset, flip: bool,
                rgb: np.ndarray | None = None) -> None:
    """Decode ``file`` (record ``key`` of database ``path``; ``color`` as the reader's
    decoder), check its size against ``record_shape``, and write its crop window at ``offset``
    (h0, w0), mirrored where ``flip``, into ``out`` (C, h, w) in Caffe's BGR order. ``rgb``:
    the file already decoded to (3, H, W) RGB."""
    uint8 = np.dtype(np.uint8)
    h0, w0 = offset
    _, ch, cw = out.shape
    if rgb is not None:
        check_record(path, key, rgb, record_shape, uint8)
        window = rgb[::-1, h0:h0 + ch, w0:w0 + cw]  # BGR
        out[...] = window[:, :, ::-1] if flip else window
        return
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(file)) as image:
            image.load()
            if image.mode == "RGB" and record_shape[0] == 3 and color is not False:
                hwc = np.asarray(image)  # (H, W, 3) RGB: the usual JPEG, read once
                check_record(path, key, hwc.transpose(2, 0, 1), record_shape, uint8)
                window = hwc[h0:h0 + ch, w0:w0 + cw, ::-1]  # BGR
                out[...] = (window[:, ::-1] if flip else window).transpose(2, 0, 1)
                return
            chw = pil_to_chw(image, color=color)
    except Image.DecompressionBombError as exc:
        from ..formats.images import bomb_reason

        raise DataError(f"{path}: record {format_key(key)}: {bomb_reason(exc)}") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"{path}: record {format_key(key)}: encoded image does not decode "
                        f"({exc})") from None
    check_record(path, key, chw, record_shape, uint8)
    window = chw[:, h0:h0 + ch, w0:w0 + cw]
    out[...] = window[:, :, ::-1] if flip else window
