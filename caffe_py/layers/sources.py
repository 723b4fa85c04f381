"""Layer family: data from files other than a database (ImageData, WindowData, HDF5Data) and
HDF5Output, which writes its bottoms to a file.

ImageData, WindowData and HDF5Data read through the data pipeline as Data does: each says what
to read in ``feed_spec`` (a database of :mod:`caffe_py.io`: an image list, sampled R-CNN windows,
the rows of HDF5 files; and the decoder of its records), so they share the reader's producer,
prefetching, round-robin over replicas, saved positions and resume. Where Caffe draws their
order from its random streams (ImageData's shuffle, WindowData's sampling, HDF5Data's shuffle),
they draw the same numbers for the same random_seed (:mod:`caffe_py.io.db.caffe_rng`).
"""
from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import DataError
from ..spec.layer_params.data import TransformationParameter
from ..spec.schema import is_set
from .base import Layer, Shape
from .data import FedLayer, upgraded_transform
from .registry import register

if TYPE_CHECKING:
    from ..io.db.caffe_rng import GlobalDraws
    from ..io.reader.records import FeedSpec

log = logging.getLogger(__name__)
PREFETCH = 4  # Caffe's data_param.prefetch default, which these layers read too


# --- ImageData ------------------------------------------------------------------------------
@register("ImageData")
class ImageData(FedLayer):
    """Images a list file names (``path label`` lines): tops data (B, C, h, w) and label (B,).

    Each image is read as Caffe's ReadImageToCVMat reads it (BGR, or gray without is_color),
    resized to new_height x new_width with cv::resize's INTER_LINEAR when they are set, then
    transformed as the Data layer transforms (transform_param). With shuffle, the list order is
    Caffe's for the same random_seed (docs/data.md says when that holds exactly).
    """

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        from ..io.db.image_list import ImageDecoder, ImageListDatabase

        p = self.param()
        self.transform = upgraded_transform(self, p, self.param("transform_param"))
        given = self.given_record_shape(p.source)
        if given is not None:  # built without its list (`cpy net`)
            c = given[0]
            self.record_shape = (c, p.new_height, p.new_width) if p.new_height else given
            shapes: list[Shape] = [(p.batch_size, *self.cropped(self.transform, self.record_shape))]
            return shapes + [(p.batch_size,)] if len(self.spec.top) == 2 else shapes
        db = ImageListDatabase(p.source, root_folder=p.root_folder)
        if p.rand_skip > len(db):
            raise self.fail(f"image_data_param.rand_skip {p.rand_skip} is more than the "
                            f"{len(db)} images of {p.source}", f"use a rand_skip <= {len(db)}")
        resize = (p.new_height, p.new_width) if p.new_height else None
        first = ImageDecoder(p.source, (0, 0, 0), color=p.is_color, resize=resize)
        c, h, w = (int(d) for d in first.load(db.path(db.entries[0])).shape)
        self.record_shape = (c, h, w)
        transformer = self.checked_transformer(self.transform, self.record_shape)
        shapes = [(p.batch_size, *transformer.out_shape)]
        return shapes + [(p.batch_size,)] if len(self.spec.top) == 2 else shapes

    def feed_spec(self, seed: int, draws: GlobalDraws) -> FeedSpec:
        """The list, shuffled as Caffe shuffles it (the shuffle's seed and rand_skip's skip
        are this layer's draws of Caffe's stream), decoded by :class:`ImageDecoder`."""
        from ..io.db.caffe_rng import needs_rand
        from ..io.db.image_list import ImageDecoder, ImageListDatabase
        from ..io.reader.records import FeedSpec

        p, tp = self.param(), self.transform
        own = draws.prefetching_layer(needs_rand(tp.mirror, tp.crop_size, self.phase),
                                      int(p.shuffle) + int(p.rand_skip > 0))
        shuffle_seed = own[0] if p.shuffle else None
        start = own[-1] % p.rand_skip if p.rand_skip else 0
        resize = (p.new_height, p.new_width) if p.new_height else None

        def opener() -> ImageListDatabase:
            return ImageListDatabase(p.source, root_folder=p.root_folder,
                                     shuffle_seed=shuffle_seed, start=start)

        def decoder() -> ImageDecoder:
            return ImageDecoder(p.source, self.record_shape, color=p.is_color, resize=resize)

        return FeedSpec(p.source, p.batch_size, PREFETCH, self.record_shape, np.dtype(np.uint8),
                        tp, opener=opener, decoder=decoder)


# --- WindowData -----------------------------------------------------------------------------
@register("WindowData")
class WindowData(FedLayer):
    """R-CNN windows: tops data (B, C, crop, crop) float32 and label (B,).

    Each batch holds background windows and then ``int(B * fg_fraction)`` foreground ones, each
    cropped with ``context_pad`` pixels of context (``crop_mode`` warp or square), warped to
    transform_param.crop_size, mirrored when transform_param.mirror draws it, then
    ``(x - mean) * window_data_param.scale`` (the mean from transform_param), exactly as
    Caffe's WindowDataLayer for the same random_seed.
    """

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        from ..io.db.windows import read_window_file

        p = self.param()
        tp = upgraded_transform(self, p, self.param("transform_param"),
                                keys=("mean_file", "crop_size", "mirror"))
        if is_set(tp, "scale"):
            raise self.fail("transform_param.scale is not read by WindowData (nor by Caffe's)",
                            "set window_data_param.scale instead")
        if tp.crop_size <= 0:
            raise self.fail("needs transform_param.crop_size > 0 (the size windows are "
                            "warped to)", "set transform_param.crop_size, e.g. 227")
        self.transform = tp
        self.record_shape = (3, tp.crop_size, tp.crop_size)
        shapes: list[Shape] = [(p.batch_size, *self.record_shape)]
        if self.given_record_shape(p.source) is not None:  # built without its files (`cpy net`)
            return shapes + [(p.batch_size,)] if len(self.spec.top) == 2 else shapes
        self.windows = read_window_file(Path(p.source), p.root_folder, p.fg_threshold,
                                        p.bg_threshold)
        channels = self.windows.images[-1][1][0]  # Caffe takes the last image's channels
        if channels != 3:
            raise self.fail(f"{p.source} says the images have {channels} channels; WindowData "
                            "reads images as 3-channel BGR", "write 3 as every image's channels")
        self.mean_image, self.mean_values = self._mean(tp)
        return shapes + [(p.batch_size,)] if len(self.spec.top) == 2 else shapes

    def _mean(self, tp: TransformationParameter) -> tuple[np.ndarray | None, np.ndarray | None]:
        from ..io.feed.transformer import read_mean_file

        if tp.mean_file:
            return read_mean_file(tp.mean_file), None
        if tp.mean_value:
            if len(tp.mean_value) not in (1, 3):
                raise self.fail(f"transform_param.mean_value has {len(tp.mean_value)} values "
                                "for 3 channels", "give one value, or one per channel")
            values = tp.mean_value * 3 if len(tp.mean_value) == 1 else tp.mean_value
            return None, np.asarray(values, np.float32).reshape(3, 1, 1)
        return None, None

    def feed_spec(self, seed: int, draws: GlobalDraws) -> FeedSpec:
        """Windows sampled from an mt19937 seeded with this layer's draw of Caffe's stream,
        made into finished float32 records by :class:`WindowDecoder` (so the feed's own
        transform is the identity)."""
        from ..io.db.caffe_rng import needs_rand
        from ..io.db.windows import WarpParams, WindowDatabase, WindowDecoder
        from ..io.reader.records import FeedSpec

        p, tp = self.param(), self.transform
        (sampling_seed,) = draws.prefetching_layer(
            needs_rand(tp.mirror, tp.crop_size, self.phase), 1)
        params = WarpParams(tp.crop_size, p.context_pad, p.crop_mode == "square",
                            self.mean_image, self.mean_values, p.scale)

        def opener() -> WindowDatabase:
            return WindowDatabase(self.windows, source=p.source, batch_size=p.batch_size,
                                  fg_fraction=p.fg_fraction, mirror=tp.mirror,
                                  seed=sampling_seed)

        def decoder() -> WindowDecoder:
            return WindowDecoder(p.source, self.windows, 3, params,
                                 cache_images=p.cache_images)

        return FeedSpec(p.source, p.batch_size, PREFETCH, self.record_shape,
                        np.dtype(np.float32), TransformationParameter(), opener=opener,
                        decoder=decoder)


# --- HDF5Data -------------------------------------------------------------------------------
@register("HDF5Data")
class HDF5Data(FedLayer):
    """Rows of the HDF5 files hdf5_data_param.source lists: one top per dataset, named as the
    dataset, each (B, *row shape) float32 (integer datasets are read as float, as in Caffe).

    The rows travel through the data pipeline side by side in one float32 record per row and
    are split into the tops here. No transform_param (Caffe refuses one too).
    """

    tops = (1, None)
    capturable = False  # the feed's record (B, 1, 1, width) is not the tops' shape

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        from ..io.db.hdf5_rows import Hdf5RowsDatabase

        p = self.param()
        given = self.ctx.options.get("record_shapes")
        if given is not None and not Path(p.source).exists():  # built without its files
            missing = [t for t in self.spec.top if t not in given]
            if missing:
                shape = shlex.quote(f"{missing[0]}=D")
                raise self.fail(f"source {p.source} does not exist, so the shape of top "
                                f"'{missing[0]}' is unknown",
                                f"give it, e.g. cpy net --input-shape {shape} (one row's "
                                "shape; nothing for a scalar)")
            self.transform = TransformationParameter()
            return [(p.batch_size, *(int(d) for d in given[t])) for t in self.spec.top]
        self.rows = Hdf5RowsDatabase(p.source, self.spec.top, shuffle=p.shuffle)
        self.layout = self.rows.layout
        self.record_shape = (1, 1, self.layout.width)
        self.transform = TransformationParameter()
        return [(p.batch_size, *shape) for shape in self.layout.shapes]

    def feed_spec(self, seed: int, draws: GlobalDraws) -> FeedSpec:
        """The rows in Caffe's order (its shuffle draws from glibc's rand(), not from the
        seeded stream: HDF5DataLayer takes no draw of it)."""
        from ..io.db.hdf5_rows import RowDecoder
        from ..io.reader.records import FeedSpec

        p = self.param()
        return FeedSpec(p.source, p.batch_size, PREFETCH, self.record_shape,
                        np.dtype(np.float32), self.transform, opener=lambda: self.rows,
                        decoder=lambda: RowDecoder(self.layout.width))

    def forward(self) -> torch.Tensor | tuple[torch.Tensor, ...]:
        rows, _ = self.next_batch()  # (B, 1, 1, width)
        batch = rows.shape[0]
        parts = torch.split(rows.reshape(batch, -1), self.layout.sizes, dim=1)
        tops = tuple(part.reshape(batch, *shape)
                     for part, shape in zip(parts, self.layout.shapes, strict=True))
        return tops[0] if len(tops) == 1 else tops


# --- HDF5Output -----------------------------------------------------------------------------
@register("HDF5Output")
class HDF5Output(Layer):
    """Writes bottoms 0 and 1 to datasets 'data' and 'label' of hdf5_output_param.file_name on
    every forward, as Caffe's HDF5OutputLayer (4-D: num, channels, height, width); no tops.

    The file is created (emptied) when the net is built, as in Caffe (not when it is built
    for inspection, net option ``inspect``: ``cpy net``). Caffe 1.0 writes the
    datasets on the first forward and fails on the second (they exist); here every forward
    appends its rows, so after one forward the file holds what Caffe's holds.
    """

    bottoms = (2, None)
    tops = (0, 0)
    capturable = False  # it writes a file

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        from ..io.db.hdf5_rows import h5py_module

        for i, shape in enumerate(bottom_shapes[:2]):
            if len(shape) > 4 or len(shape) < 1:
                raise self.bottom_error(i, f"has {len(shape)} axes; HDF5Output writes blobs of "
                                           "1 to 4 axes (num, channels, height, width)")
        if bottom_shapes[0][0] != bottom_shapes[1][0]:
            raise self.bottom_error(1, f"has {bottom_shapes[1][0]} rows but the data has "
                                       f"{bottom_shapes[0][0]}", "give both the same batch")
        self.file = Path(self.param().file_name)
        if self.ctx.options.get("inspect"):   # cpy net: shapes only, no file
            return []
        h5py = h5py_module()
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            h5py.File(self.file, "w").close()
        except OSError as exc:
            raise DataError(f"{self.file}: cannot create the HDF5 output file ({exc}); fix "
                            "hdf5_output_param.file_name") from None
        return []

    def forward(self, data: torch.Tensor, label: torch.Tensor, *rest: torch.Tensor) -> tuple:
        from ..io.db.hdf5_rows import h5py_module

        h5py = h5py_module()
        with h5py.File(self.file, "a") as f:
            for name, blob in (("data", data), ("label", label)):
                rows = blob.detach().to("cpu", torch.float32).numpy()
                rows = rows.reshape(*rows.shape, *[1] * (4 - rows.ndim))
                if name not in f:
                    f.create_dataset(name, data=rows, maxshape=(None, *rows.shape[1:]),
                                     chunks=True)
                    continue
                dataset = f[name]
                old = dataset.shape[0]
                dataset.resize(old + len(rows), axis=0)
                dataset[old:] = rows
        return ()
