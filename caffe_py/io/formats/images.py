"""Image files as Caffe's convert_imageset sees them through OpenCV: (C, H, W) uint8, BGR for
colour, resized with OpenCV's INTER_LINEAR fixed-point rule, re-encoded as PNG or JPEG.

The resize is OpenCV's own ``cv2.resize`` when opencv-python(-headless) is installed, and
otherwise :func:`resize_linear_numpy`, the same fixed-point arithmetic in numpy (bit for bit:
tests/io/formats/test_images.py holds the two equal; cv2 is 7-20x faster per image,
benchmarks/image_resize.py).
"""
from __future__ import annotations

import io
import stat
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DataError
from .datum import pil_to_chw

# OpenCV's resize keeps interpolation weights in 11-bit fixed point (INTER_RESIZE_COEF_BITS).
_COEF_BITS = 11
_COEF_SCALE = 1 << _COEF_BITS

ENCODE_TYPES = ("png", "jpg")


SPECIAL_FILES = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                 (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def check_image_file(path: Path) -> None:
    """Refuse a FIFO, socket or device where a conversion lists an image file: opening a FIFO
    waits for a writer, so one such entry would stop a conversion of a million images with no
    word. (A missing file is left to the open, which names it. A training run's reads have the
    reader's watchdog instead, which names the file a read is stuck on.)"""
    try:
        mode = path.stat().st_mode
    except OSError:
        return
    for test, kind in SPECIAL_FILES:
        if test(mode):
            raise DataError(f"{path}: not a regular file ({kind}); list image files only")


def load_image(path: Path, *, color: bool) -> np.ndarray:
    """An image file as (C, H, W) uint8: 3 channels BGR when ``color``, else 1 (cv::imread with
    IMREAD_COLOR / IMREAD_GRAYSCALE, including how each of OpenCV's decoders makes gray: see
    :func:`_gray`). Raises :class:`DataError` naming the file."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            if not color and image.format == "JPEG" and image.mode != "L":
                image.draft("L", image.size)  # libjpeg decodes the luma channel alone
            image.load()
            return pil_to_chw(image, color=True) if color else _gray(image)
    except FileNotFoundError:
        raise DataError(f"{path}: image not found") from None
    except Image.DecompressionBombError as exc:
        raise DataError(f"{path}: {bomb_reason(exc)}") from None
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable image ({exc})") from None


def largest_image_pixels() -> int:
    """The most pixels an image may have: Pillow refuses more (2 x its MAX_IMAGE_PIXELS) as a
    possible decompression bomb; a resize to more is refused too."""
    from PIL import Image

    return int((Image.MAX_IMAGE_PIXELS or 0) * 2)


def bomb_reason(exc: Exception) -> str:
    """Pillow's decompression-bomb refusal in caffe-py's words."""
    limit = largest_image_pixels() / 1e6
    return (f"the image is too large to decode safely ({exc}); over {limit:,.0f} megapixels "
            "Pillow refuses an image as a possible decompression bomb: resize it first")


def _gray(image) -> np.ndarray:
    """(1, H, W) uint8 as OpenCV's IMREAD_GRAYSCALE makes it: a gray file as it is; a colour
    PNG through libpng's rgb_to_gray (coefficients 9797, 19234, 3737 / 2^15, truncated); a JPEG
    as libjpeg's luma (``draft`` above); any other file through OpenCV's own BGR2Gray
    (4899, 9617, 1868 / 2^14, rounded)."""
    if image.mode in ("L", "1", "I;16", "I", "F") or image.format == "JPEG":
        return pil_to_chw(image, color=False)
    rgb = np.asarray(image.convert("RGB"), dtype=np.int32)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    if image.format == "PNG":
        gray = (9797 * r + 19234 * g + 3737 * b) >> 15
    else:
        gray = (4899 * r + 9617 * g + 1868 * b + (1 << 13)) >> 14
    return gray.astype(np.uint8)[None]


def _linear_taps(src: int, dst: int, *, clamp: bool) -> tuple[np.ndarray, np.ndarray,
                                                               np.ndarray]:
    """For each output index: the two source indices and their 11-bit weights, as cv::resize
    computes them: half-pixel centres in float32, each weight rounded on its own (cvRound of
    (1 - f) * 2048 and of f * 2048). ``clamp`` (the horizontal pass) moves a position past an
    edge onto the edge pixel with weights (2048, 0); the vertical pass keeps its weights and
    reads the edge row twice."""
    scale = 1.0 / (dst / src)
    f = ((np.arange(dst) + 0.5) * scale - 0.5).astype(np.float32)
    i0 = np.floor(f).astype(np.int64)
    frac = (f - i0.astype(np.float32)).astype(np.float32)
    if clamp:
        low = i0 < 0
        frac[low], i0[low] = 0.0, 0
        high = i0 >= src - 1
        frac[high], i0[high] = 0.0, src - 1
    w0 = np.rint((np.float32(1) - frac) * np.float32(_COEF_SCALE)).astype(np.int64)
    w1 = np.rint(frac * np.float32(_COEF_SCALE)).astype(np.int64)
    return np.clip(i0, 0, src - 1), np.clip(i0 + 1, 0, src - 1), np.stack([w0, w1])


def _opencv() -> Any:
    """OpenCV's Python module when it is installed, else None."""
    try:
        import cv2
    except ImportError:
        return None
    return cv2


_CV2: Any = _opencv()
"""cv2, used by :func:`resize_linear` when present (tests set it to None for the numpy path)."""


def resize_linear(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """(C, H, W) uint8 -> (C, height, width) uint8 as OpenCV's ``cv::resize`` with INTER_LINEAR
    (what Caffe's ReadImageToCVMat and WindowData call): ``cv2.resize`` itself when OpenCV's
    Python package is installed, else :func:`resize_linear_numpy` (the same bits)."""
    _, h, w = array.shape
    if (h, w) == (height, width):
        return array
    cv2 = _CV2
    if cv2 is None:
        return resize_linear_numpy(array, height, width)
    # cv2 takes (H, W, C) and gives (H, W) for one channel
    out = cv2.resize(np.ascontiguousarray(array.transpose(1, 2, 0)), (width, height),
                     interpolation=cv2.INTER_LINEAR)
    return np.ascontiguousarray(out.reshape(height, width, -1).transpose(2, 0, 1))


def resize_linear_numpy(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """(C, H, W) uint8 -> (C, height, width) uint8, bit for bit as OpenCV's ``cv::resize`` with
    INTER_LINEAR, in numpy (the reference :func:`resize_linear` falls back to).

    The horizontal pass sums two taps with 11-bit weights (values x 2048); the vertical pass is
    OpenCV's 8-bit rule ``((b0 (S0 >> 4)) >> 16) + ((b1 (S1 >> 4)) >> 16) + 2) >> 2``. Halving
    both sides exactly is OpenCV's INTER_AREA shortcut: the rounded mean of each 2 x 2 block.
    Checked against the genuine Caffe's ImageData output and cv2 (tests/io/formats/test_images.py).
    """
    _, h, w = array.shape
    if (h, w) == (height, width):
        return array
    if (h, w) == (2 * height, 2 * width):
        blocks = array.reshape(array.shape[0], height, 2, width, 2).astype(np.int32)
        return ((blocks.sum(axis=(2, 4)) + 2) >> 2).astype(np.uint8)
    x0, x1, wx = _linear_taps(w, width, clamp=True)
    y0, y1, wy = _linear_taps(h, height, clamp=False)
    src = array.astype(np.int64)
    rows = (src[:, :, x0] * wx[0] + src[:, :, x1] * wx[1]) >> 4  # (C, H, width), x 128
    top = (rows[:, y0, :] * wy[0][:, None]) >> 16
    bottom = (rows[:, y1, :] * wy[1][:, None]) >> 16
    return np.clip((top + bottom + 2) >> 2, 0, 255).astype(np.uint8)


def encode_image(array: np.ndarray, encode_type: str) -> bytes:
    """(C, H, W) uint8 (BGR for colour) as a PNG or JPEG file (cv::imencode; JPEG quality 95,
    OpenCV's default)."""
    from PIL import Image

    if array.shape[0] == 1:
        image = Image.fromarray(array[0], mode="L")
    else:
        image = Image.fromarray(np.ascontiguousarray(array[2::-1].transpose(1, 2, 0)), "RGB")
    buffer = io.BytesIO()
    if encode_type == "png":
        image.save(buffer, format="PNG")
    else:
        image.save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def extension_type(path: str) -> str:
    """The encoding a file name implies (lower-case extension without the dot)."""
    suffix = Path(path).suffix.lower().lstrip(".")
    return "jpg" if suffix == "jpeg" else suffix
