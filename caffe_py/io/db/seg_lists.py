"""The segmentation forks' sources as databases: lists of image and label-image pairs, read as
SegNet's DenseImageData and DeepLab's / PSPNet's ImageSegData read them.

A record is finished here (the feed's own transform is the identity): the image resized,
mirrored, cropped (with PSPNet's padding), ``(x - mean) * scale``, and the label image taken
through the same geometry, flattened side by side in one float32 row
``[image (C*h*w), label (h'*w'), and for ImageSegData the image's (height, width)]`` that the
layer splits into its tops.

Order: the list, shuffled as Caffe shuffles it (``caffe::shuffle`` on an mt19937 seeded by one
draw of Caffe's stream, once at setup and again after every pass; rand_skip's start). Random
crops and mirrors: record ``i`` of the stream takes draws ``k*i .. k*i+k-1`` of an mt19937 (k
fixed by the settings), so any position can be reached by skipping draws, as for WindowData.
PSPNet's fork draws them from its transformer's generator, whose seed is a draw of Caffe's
stream: the same numbers here for the same random_seed. SegNet's fork draws them from its
prefetch thread's generator, which no seed reaches; here that generator is seeded with the
run's data seed.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import DataError
from ..formats.images import load_image, resize_linear
from .caffe_rng import Mt19937, caffe_shuffle
from .db import PartialChunk
from .image_list import image_root, read_list_text

NO_LABEL = ""


@dataclass(frozen=True)
class Pair:
    """One line of a list: the image and its label (a label image's path, a class number for
    ImageSegData's label_type IMAGE, or NO_LABEL), with the line it came from."""

    image: str
    label: str
    line: int


def read_pairs(listfile: Path, *, tokens: bool, with_label: bool = True) -> list[Pair]:
    """The pairs of a list file. ``tokens``: SegNet's reading, whitespace-separated words taken
    two at a time (``infile >> image >> label``); else DeepLab's, the first one or two words of
    each line (blank lines are skipped)."""
    text = read_list_text(listfile)
    pairs: list[Pair] = []
    if tokens:
        tokens_at = [(w, n) for n, line in enumerate(text.splitlines(), 1) for w in line.split()]
        pairs = [Pair(tokens_at[i][0], tokens_at[i + 1][0], tokens_at[i][1])
                 for i in range(0, len(tokens_at) - 1, 2)]
    else:
        for number, line in enumerate(text.splitlines(), start=1):
            words = line.split()
            if not words:
                continue
            if with_label and len(words) < 2:
                raise DataError(f"{listfile}:{number}: {line.strip()!r} has no label; each "
                                "line is 'image label'")
            pairs.append(Pair(words[0], words[1] if with_label else NO_LABEL, number))
    if not pairs:
        raise DataError(f"{listfile}: the list is empty; each line is 'image label_image'")
    return pairs


class SegListDatabase:
    """The pairs of a list in Caffe's order (``shuffle_seed``: shuffled as the forks shuffle),
    each record with its ``draws_per_record`` draws of an mt19937 seeded ``draw_seed``."""

    def __init__(self, listfile: str | Path, pairs: list[Pair], *, root_folder: str = "",
                 shuffle_seed: int | None = None, start: int = 0, draw_seed: int = 0,
                 draws_per_record: int = 0):
        self.source = str(listfile)
        self.pairs = pairs
        self.root = image_root(Path(listfile), root_folder, pairs[0].image)
        self.shuffle_seed, self.start = shuffle_seed, start
        self.draw_seed, self.draws_per_record = draw_seed, draws_per_record
        self.fixed_order = shuffle_seed is None and draws_per_record == 0

    def __len__(self) -> int:
        return len(self.pairs)

    def path(self, name: str) -> Path:
        return self.root / name

    def cursor(self) -> SegListCursor:
        return SegListCursor(self)

    def close(self) -> None:
        pass


class SegListCursor:
    """A position in a pair list's read order, and in its stream of random draws."""

    def __init__(self, db: SegListDatabase):
        self.db = db
        self.seek(0)

    def seek(self, index: int) -> None:
        """Stand on record ``index`` counted from the first record of pass 0."""
        db = self.db
        passes, self.index = divmod(index + db.start, len(db))
        self.order = list(db.pairs)
        self._shuffler = None
        if db.shuffle_seed is not None:
            self._shuffler = Mt19937(db.shuffle_seed)
            for _ in range(passes + 1):  # setup shuffles once, every pass's end once more
                caffe_shuffle(self.order, self._shuffler)
        self._draws = Mt19937(db.draw_seed)
        self._draws.skip(index * db.draws_per_record)

    def read(self, count: int) -> tuple[Sequence[bytes], Sequence[tuple[Pair, tuple[int, ...]]]]:
        """The next ``count`` pairs of this pass: keys (the image paths) and (pair, draws)."""
        picked = self.order[self.index:self.index + count]
        self.index += len(picked)
        if self.index >= len(self.order):
            self.index = 0
            if self._shuffler is not None:  # the forks reshuffle when a pass ends
                caffe_shuffle(self.order, self._shuffler)
        k = self.db.draws_per_record
        draws = [tuple(int(d) for d in self._draws.draws(k)) if k else () for _ in picked]
        return [p.image.encode() for p in picked], list(zip(picked, draws, strict=True))

    def close(self) -> None:
        pass


def resize_nearest(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """(C, H, W) -> (C, height, width) as cv::resize with INTER_NEAREST: output x reads input
    min(floor(x * (W / width)), W - 1) (the ratio in double, as OpenCV's resizeNN)."""
    _, h, w = array.shape
    if (h, w) == (height, width):
        return array
    ys = np.minimum(np.floor(np.arange(height) * (1.0 / (height / h))).astype(np.int64), h - 1)
    xs = np.minimum(np.floor(np.arange(width) * (1.0 / (width / w))).astype(np.int64), w - 1)
    return np.ascontiguousarray(array[:, ys][:, :, xs])


@dataclass(frozen=True)
class Normalize:
    """``(pixel - mean) * scale``: the mean an image (C, H, W) or per-channel values (C,)."""

    scale: float = 1.0
    mean_image: np.ndarray | None = None
    mean_values: np.ndarray | None = None

    def apply(self, pixels: np.ndarray, offset: tuple[int, int] = (0, 0)) -> np.ndarray:
        """float32 (C, h, w) of ``pixels``; a mean image is read at ``offset`` (h, w)."""
        x = pixels.astype(np.float32)
        if self.mean_image is not None:
            c, h, w = x.shape
            x = x - self.mean_image[:, offset[0]:offset[0] + h, offset[1]:offset[1] + w]
        elif self.mean_values is not None:
            x = x - self.mean_values.reshape(-1, 1, 1)
        return x * np.float32(self.scale) if self.scale != 1 else x


@dataclass(frozen=True)
class DenseSettings:
    """What DenseImageData does to each pair (SegNet's dense_image_data_layer.cpp)."""

    channels: int
    resize: tuple[int, int] | None
    label_divide: int
    mirror: bool
    crop: tuple[int, int] | None
    normalize: Normalize

    @property
    def draws(self) -> int:
        return int(self.mirror) + (2 if self.crop else 0)


class DenseDecoder:
    """SegNet's load_batch for one pair: read (labels gray, resized INTER_NEAREST), mirror
    (one draw, % 2), crop (two draws: row, then column offset), then the image's mean and
    scale; the label's pixel values unchanged."""

    dtype = np.dtype(np.float32)

    def __init__(self, source: str, db_root: Path, image_shape: tuple[int, int, int],
                 label_shape: tuple[int, int], settings: DenseSettings):
        self.path, self.root, self.settings = source, db_root, settings
        self.image_shape, self.label_shape = image_shape, label_shape
        self.width = math.prod(image_shape) + math.prod(label_shape)
        self.record_shape = (1, 1, self.width)

    @property
    def record_bytes(self) -> int:
        return 4 * self.width

    def pair(self, pair: Pair, draws: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """One pair as (image (C, h, w) float32, label (h', w') float32)."""
        s = self.settings
        image = load_image(self.root / pair.image, color=s.channels == 3)
        label = load_image(self.root / pair.label, color=False)
        if s.resize:
            image = resize_linear(image, *s.resize)
            label = resize_nearest(label, s.resize[0] // s.label_divide,
                                   s.resize[1] // s.label_divide)
        draws = list(draws)
        if s.mirror and draws.pop(0) % 2:
            image, label = image[:, :, ::-1], label[:, :, ::-1]
        offset = (0, 0)
        if s.crop:
            h, w = image.shape[1:]
            ch, cw = s.crop
            if h < ch or w < cw:
                raise DataError(f"{self.path}: {pair.image} is {h} x {w}, smaller than the "
                                f"crop {ch} x {cw}")
            offset = (draws.pop(0) % (h - ch + 1), draws.pop(0) % (w - cw + 1))
            image = image[:, offset[0]:offset[0] + ch, offset[1]:offset[1] + cw]
            label = label[:, offset[0]:offset[0] + ch, offset[1]:offset[1] + cw]
        return s.normalize.apply(image), label[0].astype(np.float32)

    def decode(self, keys: Sequence[bytes], values: Sequence[tuple[Pair, tuple[int, ...]]],
               wanted: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        out = np.zeros((len(values), *self.record_shape), np.float32)
        labels = np.zeros(len(values), np.int64)
        for i, (pair, draws) in enumerate(values):
            if wanted is not None and not wanted[i]:
                continue
            try:
                image, label = self.pair(pair, draws)
                _check(self.path, pair, "image", image.shape, self.image_shape)
                _check(self.path, pair, "label image", label.shape, self.label_shape)
            except DataError as exc:
                raise PartialChunk((out[:i], labels[:i]), exc) from None
            out[i, 0, 0] = np.concatenate([image.reshape(-1), label.reshape(-1)])
        return out, labels


@dataclass(frozen=True)
class SegSettings:
    """What ImageSegData does to each pair (DeepLab's / PSPNet's image_seg_data_layer.cpp and
    DataTransformer::TransformImgAndSeg)."""

    channels: int
    resize: tuple[int, int] | None
    label_type: str
    ignore_label: int
    crop: tuple[int, int] | None
    train: bool
    mirror: bool
    scale_factors: tuple[float, ...]
    normalize: Normalize
    pad_values: tuple[float, ...]
    out_size: tuple[int, int]

    @property
    def draws(self) -> int:
        return (int(self.mirror) + int(bool(self.scale_factors))
                + (2 if self.crop and self.train else 0))


class SegDecoder:
    """TransformImgAndSeg for one pair, then the image's (height, width) as the fork's
    data_dim top (capped at the output size)."""

    dtype = np.dtype(np.float32)

    def __init__(self, source: str, db_root: Path, settings: SegSettings):
        self.path, self.root, self.settings = source, db_root, settings
        h, w = settings.out_size
        self.width = settings.channels * h * w + h * w + 2
        self.record_shape = (1, 1, self.width)

    @property
    def record_bytes(self) -> int:
        return 4 * self.width

    def read(self, pair: Pair) -> tuple[np.ndarray, np.ndarray]:
        """The image (C, H, W) uint8 and its label (1, H, W) uint8, as the layer reads them."""
        s = self.settings
        image = load_image(self.root / pair.image, color=s.channels == 3)
        if s.resize:
            image = resize_linear(image, *s.resize)
        shape = (1, *image.shape[1:])
        if s.label_type == "PIXEL":
            label = load_image(self.root / pair.label, color=False)
            if s.resize:  # the fork resizes label images with INTER_LINEAR too
                label = resize_linear(label, *s.resize)
        elif s.label_type == "IMAGE":
            label = np.full(shape, _atoi(pair.label) & 0xFF, np.uint8)
        else:
            label = np.full(shape, s.ignore_label & 0xFF, np.uint8)
        if label.shape != shape:
            raise DataError(f"{self.path}: {pair.label} is {label.shape[1]} x {label.shape[2]} "
                            f"but {pair.image} is {shape[1]} x {shape[2]}")
        return image, label

    def pair(self, pair: Pair, draws: Sequence[int]) -> tuple[np.ndarray, ...]:
        """(image (C, h, w), label (h, w), (height, width)) float32."""
        s = self.settings
        image, label = self.read(pair)
        dims = np.array([min(s.out_size[0], image.shape[1]),
                         min(s.out_size[1], image.shape[2])], np.float32)
        draws = list(draws)
        flip = bool(s.mirror and draws.pop(0) % 2)
        if s.scale_factors:
            factor = np.float32(s.scale_factors[draws.pop(0) % len(s.scale_factors)])
            if factor != 1:
                h = int(np.float32(image.shape[1]) * factor)  # int *= float: truncation
                w = int(np.float32(image.shape[2]) * factor)
                image, label = resize_linear(image, h, w), resize_nearest(label, h, w)
        pixels = image.astype(np.float64)
        if s.crop:
            pixels, label = self._pad(pixels, label)
        h, w = pixels.shape[1:]
        ch, cw = s.crop if s.crop else s.out_size
        if (h, w) != (ch, cw) and not s.crop:
            raise DataError(f"{self.path}: {pair.image} is {h} x {w} but the first image is "
                            f"{ch} x {cw}; without a crop every image needs its size (set "
                            "new_height and new_width, or a crop)")
        if s.train and s.crop:
            off = (draws.pop(0) % (h - ch + 1), draws.pop(0) % (w - cw + 1))
        else:
            off = ((h - ch) // 2, (w - cw) // 2)
        pixels = pixels[:, off[0]:off[0] + ch, off[1]:off[1] + cw]
        label = label[0, off[0]:off[0] + ch, off[1]:off[1] + cw]
        data = s.normalize.apply(pixels.astype(np.float32))
        if flip:
            data, label = data[:, :, ::-1], label[:, ::-1]
        return data, label.astype(np.float32), dims

    def _pad(self, pixels: np.ndarray, label: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pad below and right up to the crop: the image with the mean values, the label with
        ignore_label (cv::copyMakeBorder)."""
        s = self.settings
        assert s.crop is not None
        c, h, w = pixels.shape
        ph, pw = max(s.crop[0] - h, 0), max(s.crop[1] - w, 0)
        if not ph and not pw:
            return pixels, label
        padded = np.empty((c, h + ph, w + pw), np.float64)
        padded[:] = np.asarray(s.pad_values[:c], np.float64).reshape(c, 1, 1)
        padded[:, :h, :w] = pixels
        lab = np.full((1, h + ph, w + pw), s.ignore_label & 0xFF, np.uint8)
        lab[:, :h, :w] = label
        return padded, lab

    def decode(self, keys: Sequence[bytes], values: Sequence[tuple[Pair, tuple[int, ...]]],
               wanted: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        out = np.zeros((len(values), *self.record_shape), np.float32)
        labels = np.zeros(len(values), np.int64)
        for i, (pair, draws) in enumerate(values):
            if wanted is not None and not wanted[i]:
                continue
            try:
                data, label, dims = self.pair(pair, draws)
            except DataError as exc:
                raise PartialChunk((out[:i], labels[:i]), exc) from None
            out[i, 0, 0] = np.concatenate([data.reshape(-1), label.reshape(-1), dims])
        return out, labels


def _check(source: str, pair: Pair, what: str, got: tuple[int, ...],
           want: tuple[int, ...]) -> None:
    if tuple(got) != tuple(want):
        raise DataError(f"{source}: the {what} of line {pair.line} ({pair.image}) comes out "
                        f"{' x '.join(map(str, got))} but the first comes out "
                        f"{' x '.join(map(str, want))}; images of one batch need one size: set "
                        "new_height and new_width, or a crop")


def _atoi(text: str) -> int:
    """C's atoi: the leading integer of ``text`` (0 when there is none)."""
    digits = ""
    for i, ch in enumerate(text.strip()):
        if ch.isdigit() or (i == 0 and ch in "+-"):
            digits += ch
        else:
            break
    try:
        return int(digits)
    except ValueError:
        return 0
