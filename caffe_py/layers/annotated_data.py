"""Layer family: SSD's AnnotatedData (weiliu89/caffe, annotated_data_layer.cpp): images and
their boxes from an LMDB of AnnotatedDatum records (``cpy convert annoset``, or SSD's
convert_annoset), through the fork's augmentation (batch samplers, distortion, expansion,
resize, crop, mirror, mean and scale).

Tops: data (B, C, h, w) and, optionally, the label: (1, 1, G, 8) rows [image, label, instance,
xmin, ymin, xmax, ymax, difficult] for the G boxes of the batch (one row of -1 when there is
none), or (B,) labels for records without annotations. G changes from batch to batch, so the
layer (and the losses that read it) runs eagerly, never in a CUDA graph. The reading goes
through the data pipeline as the Data layer's does (caffe_py.io.feed.annotated_feed).
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import DataError
from .base import Shape
from .data import FedLayer
from .registry import register

if TYPE_CHECKING:
    from ..io.db.caffe_rng import GlobalDraws
    from ..io.reader.records import FeedSpec

log = logging.getLogger(__name__)


@register("AnnotatedData")
class AnnotatedData(FedLayer):
    """SSD's AnnotatedData (see the module docstring)."""

    capturable = False  # the label top's row count changes every batch

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        from ..io.feed.annotated_transform import AnnotatedTransformer
        from ..io.feed.transformer import force_color, read_mean_file

        dp, tp = self.param("data_param"), self.param("transform_param")
        ap = self.param("annotated_data_param")
        self.transform = tp
        if tp.resize_param is not None and tp.resize_param.resize_mode == "FIT_SMALL_SIZE" \
                and dp.batch_size != 1:
            raise self.fail("resize_mode FIT_SMALL_SIZE needs batch_size 1 (images keep "
                            "their own sizes)", "set data_param.batch_size: 1")
        if (tp.crop_h > 0) != (tp.crop_w > 0) and not tp.crop_size:
            raise self.fail("crop_h and crop_w go together", "give both, or crop_size")
        mean = read_mean_file(tp.mean_file) if tp.mean_file else None
        self.transformer = AnnotatedTransformer(tp, list(ap.batch_sampler), self.phase,
                                                force_color(tp), mean)
        given = self.given_record_shape(dp.source)
        if given is not None:  # built without its database (`cpy net`)
            c, h, w = given
            if tp.resize_param is not None:
                h, w = tp.resize_param.height, tp.resize_param.width
            crop_h, crop_w = self.transformer.crop_size()
            self.annotated = True
            self.record_bytes = c * h * w
            return self._tops((c, crop_h or h, crop_w or w), dp.batch_size, boxes=1)
        first = self._first_record()
        self.annotated = first.type is not None or ap.anno_type is not None
        if first.type not in (None, 0) or ap.anno_type not in (None, "BBOX"):
            raise self.fail(f"annotation type {first.type} is not BBOX (0), the only one "
                            "SSD's fork reads", "convert the data with `cpy convert annoset`")
        try:
            shape = self.transformer.out_shape(first)
        except DataError as exc:
            raise self.fail(f"{dp.source}: {exc}") from None
        boxes = max(1, sum(len(g.annotation) for g in first.annotation_group))
        return self._tops(shape, dp.batch_size, boxes)

    def _tops(self, shape: tuple[int, int, int], batch: int, boxes: int) -> list[Shape]:
        # records differ in size: the shape FedLayer's record_shape gives is a transformed one
        self.record_shape = shape
        tops: list[Shape] = [(batch, *shape)]
        if len(self.spec.top) == 2:
            tops.append((1, 1, boxes, 8) if self.annotated else (batch,))
        return tops

    def _first_record(self) -> Any:
        from ..io.formats.annotated import decode_annotated_record

        with self.open_database() as db:
            key, value = db.first()
        self.record_bytes = len(value)
        return decode_annotated_record(value, source=self.param("data_param").source, key=key)

    def open_database(self) -> Any:
        from ..io.db.db import open_db

        dp = self.param("data_param")
        return open_db(dp.source, dp.backend,
                       switch=lambda found: f"set data_param.backend: {found.upper()}")

    def feed_spec(self, seed: int, draws: GlobalDraws) -> FeedSpec:
        """What the data pipeline reads: the database's records parsed by AnnotatedDecoder
        and this layer's own feed (caffe_py.io.feed.annotated_feed)."""
        from ..io.db.caffe_rng import needs_rand
        from ..io.feed.annotated_feed import AnnotatedDecoder, AnnotatedFeed
        from ..io.reader.records import FeedSpec

        dp = self.param("data_param")
        tp = self.transform
        draws.prefetching_layer(needs_rand(tp.mirror, tp.crop_size, self.phase), 0)
        source = dp.source

        def make_feed(records: Any, device: Any, run_seed: int, name: str) -> AnnotatedFeed:
            return AnnotatedFeed(records, self.transformer, dp.batch_size, device=device,
                                 seed=run_seed, annotated=self.annotated,
                                 prefetch=dp.prefetch, name=name)

        return FeedSpec(source, dp.batch_size, dp.prefetch, (0, 0, 0), np.dtype(object),
                        self.transform, None, dp.rand_skip, opener=self.open_database,
                        decoder=lambda: AnnotatedDecoder(source, self.record_bytes),
                        make_feed=make_feed)
