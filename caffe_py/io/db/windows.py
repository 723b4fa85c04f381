"""WindowData's source as a database: R-CNN windows sampled as Caffe's WindowDataLayer samples
them, and the decoder that crops, warps, pads, mirrors and normalizes each one.

The window file repeats, per image::

    # image_index
    image_path
    channels
    height
    width
    num_windows
    class_index overlap x1 y1 x2 y2      (num_windows lines)

A window with overlap >= fg_threshold is foreground (its class must be > 0); one with overlap <
bg_threshold is background (label 0); the others are not used. Each batch of B windows holds
``B - int(B * fg_fraction)`` background windows and then the foreground ones, each picked by one
draw of an mt19937 (``draw % count``) and, with mirror, flipped when a second draw is odd: so
window ``i`` of the stream uses draws ``i * k`` .. (k = 1 or 2) and any position can be found by
skipping draws. The sampling seed is one ``caffe_rng_rand()`` draw, as Caffe's prefetch_rng.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import DataError
from ..formats.images import load_image, resize_linear
from .caffe_rng import Mt19937
from .db import PartialChunk


@dataclass(frozen=True)
class Window:
    """One window of an image: its index in the file's image list, label, overlap, box."""

    image: int
    label: int
    overlap: float
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True)
class WindowFile:
    """A parsed window file: the images (path, (C, H, W) as written) and the foreground and
    background windows."""

    images: list[tuple[Path, tuple[int, int, int]]]
    foreground: list[Window]
    background: list[Window]


def read_window_file(path: Path, root: str, fg_threshold: float,
                     bg_threshold: float) -> WindowFile:
    """Parse a window file as Caffe does (whitespace-separated tokens)."""
    try:
        tokens = path.read_text(encoding="utf-8").split()
    except FileNotFoundError:
        raise DataError(f"{path}: window file not found; fix window_data_param.source") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory; window_data_param.source names a window "
                        "file") from None
    if not tokens:
        raise DataError(f"{path}: the window file is empty")
    images: list[tuple[Path, tuple[int, int, int]]] = []
    fg: list[Window] = []
    bg: list[Window] = []
    pos = 0
    try:
        while pos < len(tokens):
            if tokens[pos] != "#":
                raise ValueError(f"expected '#' before image {len(images)}, got {tokens[pos]!r}")
            index = int(tokens[pos + 1])
            image = _image_path(path, root, tokens[pos + 2])
            shape = (int(tokens[pos + 3]), int(tokens[pos + 4]), int(tokens[pos + 5]))
            count = int(tokens[pos + 6])
            pos += 7
            images.append((image, shape))
            for _ in range(count):
                label, overlap = int(tokens[pos]), float(tokens[pos + 1])
                box = [int(t) for t in tokens[pos + 2:pos + 6]]
                if len(box) < 4:
                    raise IndexError
                pos += 6
                if overlap >= fg_threshold:
                    if label <= 0:
                        raise ValueError(f"image {index} has a foreground window of class "
                                         f"{label}; foreground classes are > 0")
                    fg.append(Window(index, label, overlap, *box))
                elif overlap < bg_threshold:
                    bg.append(Window(index, 0, 0.0, *box))
    except IndexError:
        raise DataError(f"{path}: ends inside the entry of image {len(images) - 1}; each "
                        "image is '# index', path, channels, height, width, the window count "
                        "and that many 'class overlap x1 y1 x2 y2' lines") from None
    except ValueError as exc:
        raise DataError(f"{path}: {exc}; each image is '# index', path, channels, height, "
                        "width, the window count and its windows") from None
    for window in fg + bg:
        if not 0 <= window.image < len(images):
            raise DataError(f"{path}: a window names image {window.image} but the file lists "
                            f"{len(images)} images (numbered from 0 in file order)")
    return WindowFile(images, fg, bg)


def _image_path(window_file: Path, root: str, name: str) -> Path:
    """root_folder + path; without root_folder, relative to the window file's folder, or to
    the current directory where Caffe (reading from where it runs) would find it."""
    if root:
        return Path(root) / name
    beside = window_file.parent / name
    return beside if beside.exists() or not Path(name).exists() else Path(name)


class WindowDatabase:
    """Sampled windows of batch ``batch_size``: one pass is one batch (the background windows,
    then the foreground ones); ``cursor()`` draws them from an mt19937 seeded ``seed``."""

    fixed_order = False

    def __init__(self, windows: WindowFile, *, source: str, batch_size: int,
                 fg_fraction: float, mirror: bool, seed: int):
        self.windows, self.source = windows, source
        self.batch_size, self.mirror, self.seed = batch_size, mirror, seed
        self.foreground = int(np.float32(batch_size) * np.float32(fg_fraction))
        if not windows.foreground or not windows.background:
            kind = "foreground" if not windows.foreground else "background"
            raise DataError(f"{source}: no {kind} window (overlap "
                            f"{'>= fg_threshold' if kind == 'foreground' else '< bg_threshold'})"
                            "; WindowData samples both kinds in every batch")

    def __len__(self) -> int:
        return self.batch_size

    def cursor(self) -> WindowCursor:
        return WindowCursor(self)

    def close(self) -> None:
        pass


class WindowCursor:
    """A position in the stream of sampled windows."""

    def __init__(self, db: WindowDatabase):
        self.db = db
        self.seek(0)

    def seek(self, index: int) -> None:
        self.rng = Mt19937(self.db.seed)
        self.rng.skip(index * (2 if self.db.mirror else 1))
        self.item = index % self.db.batch_size

    def read(self, count: int) -> tuple[Sequence[bytes], Sequence[tuple[Window, bool]]]:
        """The next ``count`` windows of this batch: keys and (window, flip)."""
        db, keys, values = self.db, [], []
        for _ in range(count):
            fg = self.item >= db.batch_size - db.foreground
            pool = db.windows.foreground if fg else db.windows.background
            window = pool[self.rng() % len(pool)]
            flip = bool(db.mirror and self.rng() % 2)
            keys.append(f"{db.windows.images[window.image][0].name}#{window.x1},{window.y1},"
                        f"{window.x2},{window.y2}".encode())
            values.append((window, flip))
            self.item = (self.item + 1) % db.batch_size
        return keys, values

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class WarpParams:
    """How windows become records: crop_size, context_pad, square crops, the mean (a
    (C, H, W) image or per-channel values) and the scale."""

    crop_size: int
    context_pad: int
    square: bool
    mean_image: np.ndarray | None
    mean_values: np.ndarray | None
    scale: float


class WindowDecoder:
    """Crops each window with its context, warps it to crop_size (cv::resize INTER_LINEAR),
    mirrors it when drawn, places it in a zero (C, crop, crop) float32 record and subtracts the
    mean and scales there, exactly as Caffe's WindowDataLayer::load_batch."""

    dtype = np.dtype(np.float32)

    def __init__(self, source: str, windows: WindowFile, channels: int, params: WarpParams,
                 *, cache_images: bool):
        self.path, self.windows, self.params = source, windows, params
        c = params.crop_size
        self.record_shape = (channels, c, c)
        self._cache: dict[int, np.ndarray] | None = {} if cache_images else None

    @property
    def record_bytes(self) -> int:
        return 4 * int(np.prod(self.record_shape))

    def image(self, index: int) -> np.ndarray:
        """Image ``index`` as (C, H, W) uint8 BGR (kept when cache_images)."""
        if self._cache is not None and index in self._cache:
            return self._cache[index]
        array = load_image(self.windows.images[index][0], color=True)
        if self._cache is not None:
            self._cache[index] = array
        return array

    def decode(self, keys: Sequence[bytes], values: Sequence[tuple[Window, bool]],
               wanted: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        out = np.zeros((len(values), *self.record_shape), np.float32)
        labels = np.array([w.label for w, _ in values], np.int64)
        for i, (window, flip) in enumerate(values):
            if wanted is not None and not wanted[i]:
                continue
            try:
                out[i] = self.record(window, flip)
            except DataError as exc:
                raise PartialChunk((out[:i], labels[:i]), exc) from None
        return out, labels

    def record(self, window: Window, flip: bool) -> np.ndarray:
        """One window as a (C, crop, crop) float32 record (zeros around the warped crop)."""
        img = self.image(window.image)
        box, size, pad = warp_geometry(window, img.shape[1], img.shape[2], flip, self.params)
        x1, y1, x2, y2 = box
        if not (0 <= x1 <= x2 < img.shape[2] and 0 <= y1 <= y2 < img.shape[1]):
            raise DataError(f"{self.path}: window ({window.x1}, {window.y1}, {window.x2}, "
                            f"{window.y2}) lies outside image {window.image} "
                            f"({img.shape[2]} x {img.shape[1]})")
        crop = resize_linear(np.ascontiguousarray(img[:, y1:y2 + 1, x1:x2 + 1]), *size)
        if flip:
            crop = crop[:, :, ::-1]
        return self._place(crop, pad)

    def _place(self, crop: np.ndarray, pad: tuple[int, int]) -> np.ndarray:
        p = self.params
        record = np.zeros(self.record_shape, np.float32)
        pad_h, pad_w = pad
        h, w = crop.shape[1:]
        pixels = crop.astype(np.float32)
        if p.mean_image is not None:
            off = (p.mean_image.shape[2] - p.crop_size) // 2  # Caffe's offset, from the width
            mean = p.mean_image[:, off + pad_h:off + pad_h + h, off + pad_w:off + pad_w + w]
            if mean.shape[1:] != (h, w):
                raise DataError(f"{self.path}: the mean image {list(p.mean_image.shape)} is "
                                f"smaller than crop_size {p.crop_size}")
            pixels = (pixels - mean) * np.float32(p.scale)
        elif p.mean_values is not None:
            pixels = (pixels - p.mean_values) * np.float32(p.scale)
        else:
            pixels = pixels * np.float32(p.scale)
        record[:, pad_h:pad_h + h, pad_w:pad_w + w] = pixels
        return record


def warp_geometry(window: Window, rows: int, cols: int, flip: bool, p: WarpParams
                  ) -> tuple[tuple[int, int, int, int], tuple[int, int], tuple[int, int]]:
    """The clipped box (x1, y1, x2, y2) to crop, the size (h, w) to warp it to, and where it
    goes in the record (pad_h, pad_w), as Caffe computes them (float32 arithmetic)."""
    f32 = np.float32
    x1, y1, x2, y2 = window.x1, window.y1, window.x2, window.y2
    crop = p.crop_size
    if not (p.context_pad > 0 or p.square):
        return (x1, y1, x2, y2), (crop, crop), (0, 0)
    context = f32(crop) / f32(crop - 2 * p.context_pad)
    half_h, half_w = f32(y2 - y1 + 1) / f32(2.0), f32(x2 - x1 + 1) / f32(2.0)
    cx, cy = f32(x1) + half_w, f32(y1) + half_h
    if p.square:
        half_h = half_w = max(half_h, half_w)
    x1, x2 = _round(cx - half_w * context), _round(cx + half_w * context)
    y1, y2 = _round(cy - half_h * context), _round(cy + half_h * context)
    unclipped_h, unclipped_w = y2 - y1 + 1, x2 - x1 + 1
    pad_x1, pad_y1 = max(0, -x1), max(0, -y1)
    pad_x2, pad_y2 = max(0, x2 - cols + 1), max(0, y2 - rows + 1)
    x1, x2, y1, y2 = x1 + pad_x1, x2 - pad_x2, y1 + pad_y1, y2 - pad_y2
    scale_x, scale_y = f32(crop) / f32(unclipped_w), f32(crop) / f32(unclipped_h)
    width = _round(f32(x2 - x1 + 1) * scale_x)
    height = _round(f32(y2 - y1 + 1) * scale_y)
    pad_x1, pad_x2 = _round(f32(pad_x1) * scale_x), _round(f32(pad_x2) * scale_x)
    pad_h = _round(f32(pad_y1) * scale_y)
    pad_w = pad_x2 if flip else pad_x1  # mirroring mirrors the padding too
    height = min(height, crop - pad_h)
    width = min(width, crop - pad_w)
    return (x1, y1, x2, y2), (height, width), (pad_h, pad_w)


def _round(value: np.float32) -> int:
    """C's round() on a float32: halves away from zero."""
    v = float(value)
    return int(np.floor(v + 0.5)) if v >= 0 else -int(np.floor(-v + 0.5))
