"""Layer family: the segmentation forks' file layers. Their data layers, SegNet's
DenseImageData and DeepLab's / PSPNet's ImageSegData, read lists of image and label-image pairs
through the data pipeline (:mod:`caffe_py.io.db.seg_lists` is their database and decoder), so
they share the reader's producer, prefetching, round-robin over replicas, saved positions and
resume: each record arrives finished (image and label through one geometry) in one float32 row
that ``forward`` splits into the tops. DeepLab's MatWrite saves its bottoms as MATLAB files.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..errors import DataError
from ..spec.layer_params.data import TransformationParameter
from ..spec.layer_params.segmentation import (
    DenseImageDataParameter,
    ImageSegDataParameter,
    MatWriteParameter,
    SegTransformationParameter,
)
from ..spec.schema import is_set
from .base import Layer, Shape
from .data import FedLayer
from .registry import register

if TYPE_CHECKING:
    from ..io.db.caffe_rng import GlobalDraws
    from ..io.db.seg_lists import Normalize, Pair
    from ..io.reader.records import FeedSpec

PREFETCH = 4


class _PairLayer(FedLayer):
    """What both layers share: the list, the normaliser, the feed and the split of a row."""

    tops = (2, 2)
    capturable = False  # the feed's record (B, 1, 1, width) is not the tops' shape
    record_shape: tuple[int, int, int]

    def _normalize(self, tp: TransformationParameter, channels: int,
                   size: tuple[int, int] | None) -> Normalize:
        from ..io.db.seg_lists import Normalize
        from ..io.feed.transformer import read_mean_file

        if tp.mean_file:
            mean = read_mean_file(tp.mean_file)
            if size is not None and mean.shape != (channels, *size):
                raise self.fail(f"transform_param.mean_file is {list(mean.shape)} but the "
                                f"images come out {[channels, *size]}",
                                "use a mean of the output size, or mean_value")
            return Normalize(tp.scale, mean_image=mean)
        if tp.mean_value:
            if len(tp.mean_value) not in (1, channels):
                raise self.fail(f"transform_param.mean_value has {len(tp.mean_value)} values "
                                f"for {channels} channels", "give one, or one per channel")
            values = tp.mean_value * channels if len(tp.mean_value) == 1 else tp.mean_value
            return Normalize(tp.scale, mean_values=np.asarray(values, np.float32))
        return Normalize(tp.scale)

    def _pairs(self, source: str, *, tokens: bool, with_label: bool = True) -> list[Pair]:
        from ..io.db.seg_lists import read_pairs

        return read_pairs(Path(source), tokens=tokens, with_label=with_label)

    def _feed_spec(self, source: str, batch: int, opener: Any, decoder: Any) -> FeedSpec:
        from ..io.reader.records import FeedSpec

        return FeedSpec(source, batch, PREFETCH, self.record_shape, np.dtype(np.float32),
                        TransformationParameter(), opener=opener, decoder=decoder)

    def forward(self) -> tuple[torch.Tensor, ...]:
        rows, _ = self.next_batch()  # (B, 1, 1, width)
        batch = rows.shape[0]
        flat = rows.reshape(batch, -1)
        sizes = [int(np.prod(shape[1:])) for shape in self.top_shapes]
        parts = torch.split(flat, [*sizes, flat.shape[1] - sum(sizes)], dim=1)
        return tuple(part.reshape(batch, *shape[1:])
                     for part, shape in zip(parts, self.top_shapes, strict=False))


@register("DenseImageData")
class DenseImageData(_PairLayer):
    """SegNet's (and ENet's) DenseImageData: tops data (B, C, h, w) and label (B, 1, h', w').

    Each line of the list is ``image label_image``; images are read as Caffe reads them (BGR,
    or gray without is_color) and resized to new_height x new_width (INTER_LINEAR), label
    images read gray and resized with INTER_NEAREST (to new_height / label_divide_factor x
    new_width / label_divide_factor, ENet's fork). With dense_image_data_param.mirror both flip
    at random, with crop_height / crop_width both are cropped at a random place, in TRAIN and
    TEST alike as in the fork; then the image is ``(x - mean) * scale`` (transform_param's
    mean and scale) and the label keeps its pixel values.
    """

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p: DenseImageDataParameter = self.param()
        tp: TransformationParameter = self.param("transform_param")
        if tp.mirror or tp.crop_size:
            key = "mirror" if tp.mirror else "crop_size"
            raise self.fail(f"transform_param.{key} would transform the image but not its label "
                            "(the fork stops here: 'any stochastic transformation will break "
                            "layer')", "use dense_image_data_param.mirror, crop_height and "
                                       "crop_width, which move both")
        if p.label_divide_factor > 1 and (p.crop_height or not p.new_height):
            raise self.fail("label_divide_factor needs new_height and new_width and no crop "
                            "(the label is resized to new_height / factor)",
                            "set new_height and new_width, and no crop_height")
        given = self.given_record_shape(p.source)
        if given is not None:  # built without its list (`cpy net`)
            channels, h, w = given
        else:
            first = self._pairs(p.source, tokens=True)[0]
            root = self._root(p)
            h, w = self._read_size(root / first.image, p)
            channels = 3 if p.is_color else 1
        if p.new_height:
            h, w = p.new_height, p.new_width
        label = (h // p.label_divide_factor, w // p.label_divide_factor)
        if p.crop_height:
            if p.crop_height > h or p.crop_width > w:
                raise self.fail(f"the crop {p.crop_height} x {p.crop_width} is larger than the "
                                f"images ({h} x {w})", "crop less")
            h, w = label = (p.crop_height, p.crop_width)
        self.image_shape, self.label_shape = (channels, h, w), label
        self.normalize = self._normalize(tp, channels, (h, w))
        self.record_shape = (1, 1, channels * h * w + label[0] * label[1])
        return [(p.batch_size, channels, h, w), (p.batch_size, 1, *label)]

    def _root(self, p: DenseImageDataParameter) -> Path:
        from ..io.db.image_list import image_root

        return image_root(Path(p.source), p.root_folder,
                          self._pairs(p.source, tokens=True)[0].image)

    def _read_size(self, path: Path, p: DenseImageDataParameter) -> tuple[int, int]:
        from ..io.formats.images import load_image

        try:
            image = load_image(path, color=p.is_color)
        except DataError as exc:
            raise DataError(f"{p.source}: {exc}") from None
        return int(image.shape[1]), int(image.shape[2])

    def feed_spec(self, seed: int, draws: GlobalDraws) -> FeedSpec:
        """Caffe's shuffle and rand_skip draws (SegNet's Caffe predates the prefetch thread's
        own seed); crops and mirrors from an mt19937 seeded with the run's data seed."""
        from ..io.db.seg_lists import DenseDecoder, DenseSettings, SegListDatabase

        p = self.param()
        own = [draws.draw() for _ in range(int(p.shuffle) + int(p.rand_skip > 0))]
        pairs = self._pairs(p.source, tokens=True)
        if p.rand_skip > len(pairs):
            raise self.fail(f"rand_skip {p.rand_skip} is more than the {len(pairs)} pairs of "
                            f"{p.source}", f"use a rand_skip <= {len(pairs)}")
        settings = DenseSettings(
            self.image_shape[0], (p.new_height, p.new_width) if p.new_height else None,
            p.label_divide_factor, p.mirror,
            (p.crop_height, p.crop_width) if p.crop_height else None, self.normalize)

        def opener() -> SegListDatabase:
            return SegListDatabase(p.source, pairs, root_folder=p.root_folder,
                                   shuffle_seed=own[0] if p.shuffle else None,
                                   start=own[-1] % p.rand_skip if p.rand_skip else 0,
                                   draw_seed=seed, draws_per_record=settings.draws)

        def decoder() -> DenseDecoder:
            return DenseDecoder(p.source, opener().root, self.image_shape, self.label_shape,
                                settings)

        return self._feed_spec(p.source, p.batch_size, opener, decoder)


@register("ImageSegData")
class ImageSegData(_PairLayer):
    """DeepLab's (v2) and PSPNet's ImageSegData: tops data (B, C, h, w), label (B, 1, h, w)
    and, optionally, data_dim (B, 1, 1, 2): each image's (height, width).

    Lines are ``image label`` (label_type PIXEL: a label image; IMAGE: one class for the whole
    image; NONE: no label, every pixel ignore_label). Images and label images are resized to
    new_height x new_width (both INTER_LINEAR, as the fork), rescaled by a random one of
    transform_param.scale_factors (image INTER_LINEAR, label INTER_NEAREST), padded below and
    right up to the crop (the image with the mean values, the label with ignore_label),
    cropped (random in TRAIN, the centre in TEST) and mirrored at random; the image is then
    ``(x - mean_value) * scale``.
    """

    tops = (2, 3)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p: ImageSegDataParameter = self.param()
        tp: SegTransformationParameter = self.param("transform_param")
        if tp.mean_file:
            raise self.fail("transform_param.mean_file is refused by ImageSegData (as the "
                            "fork)", "give mean_value instead")
        for key in ("scale", "mean_file", "crop_size", "mirror"):
            if is_set(p, key):
                raise self.fail(f"image_data_param.{key} is not read by ImageSegData (the fork "
                                "reads transform_param's)", f"move it to transform_param.{key}")
        self.crop = ((tp.crop_size, tp.crop_size) if tp.crop_size else
                     (tp.crop_height, tp.crop_width) if tp.crop_height else None)
        channels = 3 if p.is_color else 1
        given = self.given_record_shape(p.source)
        if self.crop is not None:
            h, w = self.crop
        elif given is not None:
            h, w = (p.new_height, p.new_width) if p.new_height else given[1:]
        elif p.new_height:
            h, w = p.new_height, p.new_width
        else:
            h, w = self._first_size(p)
        if given is not None:
            channels = given[0]
        self.channels, self.out_size = channels, (h, w)
        self.normalize = self._normalize(tp, channels, None)
        self.record_shape = (1, 1, channels * h * w + h * w + 2)
        shapes: list[Shape] = [(p.batch_size, channels, h, w), (p.batch_size, 1, h, w)]
        return shapes + [(p.batch_size, 1, 1, 2)] * (len(self.spec.top) - 2)

    def _first_size(self, p: ImageSegDataParameter) -> tuple[int, int]:
        from ..io.db.image_list import image_root
        from ..io.formats.images import load_image

        first = self._pairs(p.source, tokens=False, with_label=p.label_type != "NONE")[0]
        root = image_root(Path(p.source), p.root_folder, first.image)
        image = load_image(root / first.image, color=p.is_color)
        return int(image.shape[1]), int(image.shape[2])

    def feed_spec(self, seed: int, draws: GlobalDraws) -> FeedSpec:
        """Caffe 1.0's draws for a prefetching layer: the transformer's seed (InitRand, taken
        twice, the second kept), the shuffle and rand_skip draws, the thread's seed."""
        from ..io.db.caffe_rng import needs_rand
        from ..io.db.seg_lists import SegDecoder, SegListDatabase, SegSettings

        p, tp = self.param(), self.param("transform_param")
        has_rng = needs_rand(tp.mirror, tp.crop_size, self.phase)
        if has_rng:
            draws.draw()
        own = [draws.draw() for _ in range(int(p.shuffle) + int(p.rand_skip > 0))]
        transformer_seed = draws.draw() if has_rng else seed  # none in the fork: the run's
        draws.draw()  # the prefetch thread's seed
        pairs = self._pairs(p.source, tokens=False, with_label=p.label_type != "NONE")
        if p.rand_skip > len(pairs):
            raise self.fail(f"rand_skip {p.rand_skip} is more than the {len(pairs)} lines of "
                            f"{p.source}", f"use a rand_skip <= {len(pairs)}")
        values = self.normalize.mean_values
        pad = tuple(float(v) for v in values) if values is not None else (0.0,) * self.channels
        settings = SegSettings(
            self.channels, (p.new_height, p.new_width) if p.new_height else None, p.label_type,
            p.ignore_label, self.crop, self.phase == "TRAIN", tp.mirror,
            tuple(tp.scale_factors), self.normalize, pad, self.out_size)

        def opener() -> SegListDatabase:
            return SegListDatabase(p.source, pairs, root_folder=p.root_folder,
                                   shuffle_seed=own[0] if p.shuffle else None,
                                   start=own[-1] % p.rand_skip if p.rand_skip else 0,
                                   draw_seed=transformer_seed,
                                   draws_per_record=settings.draws)

        def decoder() -> SegDecoder:
            return SegDecoder(p.source, opener().root, settings)

        return self._feed_spec(p.source, p.batch_size, opener, decoder)


@register("MatWrite")
class MatWrite(Layer):
    """DeepLab's MatWrite: every ``period``-th forward writes each bottom i to
    ``prefix + name + "_blob_<i>.mat"``, name the list's line for that forward (``source``,
    less ``strip`` characters) or ``iter_<n>``: a MATLAB v5 file holding ``data``, the blob as
    MATLAB sees Caffe's memory (width x height x channels x num). No tops."""

    bottoms = (1, None)
    tops = (0, 0)
    capturable = False  # it writes files

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p: MatWriteParameter = self.param()
        self.prefix, self.period, self.iteration = p.prefix, p.period, 0
        self.names: list[str] | None = None
        without_files = self.ctx.options.get("record_shapes") is not None  # `cpy net`
        if p.source and not (without_files and not Path(p.source).exists()):
            self.names = self._read_names(p)
        return []

    def _read_names(self, p: MatWriteParameter) -> list[str]:
        try:
            lines = Path(p.source).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise DataError(f"{p.source}: cannot read mat_write_param.source ({exc})") \
                from None
        words = [line.split()[0] for line in lines if line.split()]
        short = [w for w in words if len(w) <= p.strip]
        if short:
            raise self.fail(f"mat_write_param.strip {p.strip} cuts all of {short[0]!r} "
                            f"({p.source})", "strip fewer characters")
        return [w[:len(w) - p.strip] for w in words]

    def forward(self, *bottoms: torch.Tensor) -> tuple:
        from scipy.io import savemat

        if self.iteration % self.period == 0:
            if self.names is not None and self.iteration >= len(self.names):
                raise DataError(f"layer '{self.name}' (MatWrite): forward {self.iteration} but "
                                f"{self.param().source} names {len(self.names)} files (the fork "
                                "stops too: 'Test has run for more iterations than it was "
                                "supposed to')")
            name = self.names[self.iteration] if self.names is not None else \
                f"iter_{self.iteration}"
            for i, blob in enumerate(bottoms):
                array = blob.detach().to("cpu", torch.float32).numpy()
                array = array.reshape(array.shape + (1,) * (4 - array.ndim))
                path = Path(f"{self.prefix}{name}_blob_{i}.mat")
                try:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    savemat(str(path), {"data": array.transpose(3, 2, 1, 0)})
                except OSError as exc:
                    raise DataError(f"{path}: cannot write ({exc}); fix "
                                    "mat_write_param.prefix") from None
        self.iteration += 1
        return ()
