"""One image file of a record decoded and its crop window written into a batch: the code the
decode threads (:mod:`~caffe_py.io.feed.image_batch`) and the decode processes
(:mod:`.decode_processes`) share.

The pixels are the reader's own decoder's (PIL, :func:`~caffe_py.io.formats.datum.decode_image`),
bit for bit; a caller that has the file decoded already (torchvision's decoder, :mod:`.libjpeg`)
passes the RGB image instead. """
from __future__ import annotations

import io

import numpy as np

from ...errors import DataError
from ..formats.datum import format_key, pil_to_chw


def check_record(path: str, key: bytes, array: np.ndarray, shape: tuple[int, ...],
                 dtype: np.dtype) -> None:
    """A decoded record must have the first record's shape and dtype."""
    if tuple(array.shape) != tuple(shape) or array.dtype != dtype:
        raise DataError(f"{path}: record {format_key(key)} is {array.dtype} "
                        f"{list(array.shape)} but the first record is {dtype} {list(shape)}; a "
                        "Data layer needs records of one size and kind (resize when converting)")


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
