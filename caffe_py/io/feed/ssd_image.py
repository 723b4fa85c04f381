"""The image operations of SSD's data augmentation (weiliu89/caffe, util/im_transforms.cpp and
data_transformer.cpp) on (C, H, W) uint8 BGR arrays, as OpenCV computes them where it matters:

- resizes: INTER_LINEAR bit for bit (:func:`~.images.resize_linear`), INTER_NEAREST as
  OpenCV's (floor(dst x src / dst)), and AREA, CUBIC and LANCZOS4 through Pillow's box,
  bicubic and Lanczos filters (close to OpenCV's, not bit-identical);
- the padded resize (FIT_LARGE_SIZE_AND_PAD) with constant, mirrored (BORDER_REFLECT101) or
  repeated borders, and the aspect-keeping resize (FIT_SMALL_SIZE);
- brightness and contrast (``convertTo``: saturate(round(alpha x + beta))), saturation and hue
  in OpenCV's 8-bit HSV (H in [0, 180), its table-based forward conversion and float inverse),
  and the random channel order.
"""
from __future__ import annotations

import numpy as np

from ..formats.images import resize_linear

_HSV_SHIFT = 12


def saturate_u8(x: np.ndarray) -> np.ndarray:
    """OpenCV's saturate_cast<uchar> of float values: round half to even, then clip."""
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def convert_to(image: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """cv::Mat::convertTo(uchar, alpha, beta)."""
    return saturate_u8(image.astype(np.float64) * np.float32(alpha) + np.float32(beta))


def resize(image: np.ndarray, height: int, width: int, interp: str = "LINEAR") -> np.ndarray:
    """(C, H, W) uint8 -> (C, height, width) with one of OpenCV's interpolations."""
    if image.shape[1:] == (height, width) and interp != "NEAREST":
        return image
    if interp == "LINEAR":
        return resize_linear(image, height, width)
    if interp == "NEAREST":
        h, w = image.shape[1:]
        ys = np.minimum((np.arange(height) * (h / height)).astype(np.int64), h - 1)
        xs = np.minimum((np.arange(width) * (w / width)).astype(np.int64), w - 1)
        return np.ascontiguousarray(image[:, ys][:, :, xs])
    from PIL import Image

    filters = {"AREA": Image.Resampling.BOX, "CUBIC": Image.Resampling.BICUBIC,
               "LANCZOS4": Image.Resampling.LANCZOS}
    planes = [np.asarray(Image.fromarray(p).resize((width, height), filters[interp]))
              for p in image]
    return np.stack(planes).astype(np.uint8)


def pad(image: np.ndarray, top: int, bottom: int, left: int, right: int, mode: str,
        value: list[float]) -> np.ndarray:
    """cv::copyMakeBorder: CONSTANT (one value per channel), MIRRORED (BORDER_REFLECT101) or
    REPEAT_NEAREST (BORDER_REPLICATE)."""
    widths = ((0, 0), (top, bottom), (left, right))
    if mode == "MIRRORED":
        return np.pad(image, widths, mode="reflect")
    if mode == "REPEAT_NEAREST":
        return np.pad(image, widths, mode="edge")
    out = np.empty((image.shape[0], image.shape[1] + top + bottom,
                    image.shape[2] + left + right), np.uint8)
    if len(value) == 1:  # one value for every channel
        value = value * image.shape[0]
    for c in range(image.shape[0]):
        fill = value[c] if c < len(value) else 0.0
        out[c] = saturate_u8(np.asarray(fill))
    out[:, top:top + image.shape[1], left:left + image.shape[2]] = image
    return out


def apply_resize(image: np.ndarray, mode: str, height: int, width: int, interp: str,
                 pad_mode: str, pad_value: list[float]) -> np.ndarray:
    """ApplyResize: WARP, FIT_LARGE_SIZE_AND_PAD (AspectKeepingResizeAndPad) or
    FIT_SMALL_SIZE (AspectKeepingResizeBySmall)."""
    h, w = image.shape[1:]
    if mode == "WARP":
        return resize(image, height, width, interp)
    orig_aspect = np.float32(w) / np.float32(h)
    new_aspect = np.float32(width) / np.float32(height)
    if mode == "FIT_LARGE_SIZE_AND_PAD":
        if orig_aspect > new_aspect:
            rh = int(np.floor(np.float32(width) / orig_aspect))
            out = resize(image, rh, width, interp)
            top = int(np.floor((height - rh) / 2.0))
            return pad(out, top, height - rh - top, 0, 0, pad_mode, pad_value)
        rw = int(np.floor(orig_aspect * np.float32(height)))
        out = resize(image, height, rw, interp)
        left = int(np.floor((width - rw) / 2.0))
        return pad(out, 0, 0, left, width - rw - left, pad_mode, pad_value)
    if orig_aspect < new_aspect:  # FIT_SMALL_SIZE
        return resize(image, int(np.floor(np.float32(width) / orig_aspect)), width, interp)
    return resize(image, height, int(np.floor(orig_aspect * np.float32(height))), interp)


def bgr_to_hsv(image: np.ndarray) -> np.ndarray:
    """OpenCV's 8-bit BGR2HSV (H in [0, 180)), its fixed-point division tables included."""
    b, g, r = (image[k].astype(np.int64) for k in range(3))
    v = np.maximum(np.maximum(b, g), r)
    vmin = np.minimum(np.minimum(b, g), r)
    diff = v - vmin
    sdiv = np.zeros(256, np.int64)
    hdiv = np.zeros(256, np.int64)
    i = np.arange(1, 256)
    sdiv[1:] = np.rint((255 << _HSV_SHIFT) / i)
    hdiv[1:] = np.rint((180 << _HSV_SHIFT) / (6.0 * i))
    half = 1 << (_HSV_SHIFT - 1)
    s = (diff * sdiv[v] + half) >> _HSV_SHIFT
    vr = v == r
    vg = v == g
    h = np.where(vr, g - b, np.where(vg, b - r + 2 * diff, r - g + 4 * diff))
    h = (h * hdiv[diff] + half) >> _HSV_SHIFT
    h = np.where(h < 0, h + 180, h)
    return np.stack([h, s, v]).astype(np.uint8)


def hsv_to_bgr(hsv: np.ndarray) -> np.ndarray:
    """OpenCV's 8-bit HSV2BGR: through float, hue wrapped into [0, 6) sectors."""
    f32 = np.float32
    h = hsv[0].astype(f32) * f32(6.0 / 180.0)
    s = hsv[1].astype(f32) * f32(1.0 / 255.0)
    v = hsv[2].astype(f32) * f32(1.0 / 255.0)
    h = np.mod(h, f32(6.0)).astype(f32)
    sector = np.floor(h).astype(np.int64)
    frac = (h - sector).astype(f32)
    bad = (sector < 0) | (sector >= 6)
    sector = np.where(bad, 0, sector)
    frac = np.where(bad, f32(0), frac)
    tab = np.stack([v, v * (f32(1) - s), v * (f32(1) - s * frac),
                    v * (f32(1) - s * (f32(1) - frac))])
    order = np.array([[1, 3, 0], [1, 0, 2], [3, 0, 1], [0, 2, 1], [0, 1, 3], [2, 1, 0]])
    pick = order[sector]                                     # (H, W, 3): b, g, r rows of tab
    rows, cols = np.indices(sector.shape)
    out = np.stack([tab[pick[..., k], rows, cols] for k in range(3)])
    gray = s == 0
    out = np.where(gray[None], v[None], out)
    return saturate_u8(out.astype(f32) * f32(255.0))


def adjust_saturation(image: np.ndarray, delta: float) -> np.ndarray:
    hsv = bgr_to_hsv(image)
    hsv[1] = convert_to(hsv[1], delta, 0.0)
    return hsv_to_bgr(hsv)


def adjust_hue(image: np.ndarray, delta: float) -> np.ndarray:
    hsv = bgr_to_hsv(image)
    hsv[0] = convert_to(hsv[0], 1.0, delta)
    return hsv_to_bgr(hsv)
