"""AnnotatedData's per-record pipeline, as SSD's AnnotatedDataLayer::load_batch runs it:
distort (encoded records) -> expand -> batch samplers' crop -> transform (resize, crop,
mirror, (x - mean) x scale), the boxes following every step (data_transformer.cpp,
util/sampler.cpp, util/bbox_util.cpp, util/im_transforms.cpp).

Boxes are float32 [xmin, ymin, xmax, ymax] in the image's normalized coordinates and follow
the fork's float arithmetic. The random draws come from a numpy Generator per record (seeded by
the run's seed and the record's position in the stream): the same distributions as the fork,
not its random stream. The fork re-encodes an encoded image as JPEG after each of the distort,
expand and crop steps; caffe-py keeps the decoded pixels instead (no JPEG loss between steps).
Without random steps (TEST: resize, centre crop, mean), the output is the fork's, pixel for
pixel and box for box (tests/golden/forks/ssd: annotated_data).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import DataError
from ..formats.annotated import AnnotatedDatum
from ..formats.datum import datum_to_array, decode_image
from . import ssd_image

F32 = np.float32


@dataclass
class Box:
    """One annotation: the box (float32 corners), its instance id and difficult flag."""

    xmin: F32
    ymin: F32
    xmax: F32
    ymax: F32
    instance: int = 0
    difficult: bool = False

    @property
    def corners(self) -> tuple[F32, F32, F32, F32]:
        return self.xmin, self.ymin, self.xmax, self.ymax


Groups = list[tuple[int, list[Box]]]
"""The annotation groups of an image: (label, boxes) in record order."""


def groups_of(record: AnnotatedDatum) -> Groups:
    out: Groups = []
    for group in record.annotation_group:
        boxes = []
        for anno in group.annotation:
            b = anno.bbox
            if b is None:
                continue
            boxes.append(Box(F32(b.xmin), F32(b.ymin), F32(b.xmax), F32(b.ymax),
                             anno.instance_id or 0, bool(b.difficult)))
        out.append((group.group_label or 0, boxes))
    return out


# --- the fork's box arithmetic (bbox_util.cpp), on one box at a time, in float --------------
def size(x0: F32, y0: F32, x1: F32, y1: F32) -> F32:
    if x1 < x0 or y1 < y0:
        return F32(0)
    return F32(F32(x1 - x0) * F32(y1 - y0))


def clip(b: tuple[F32, ...]) -> tuple[F32, F32, F32, F32]:
    return tuple(F32(min(max(v, F32(0)), F32(1))) for v in b)  # type: ignore[return-value]


def intersect(a: tuple[F32, ...], b: tuple[F32, ...]) -> tuple[F32, F32, F32, F32]:
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return F32(0), F32(0), F32(0), F32(0)
    return max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])


def jaccard(a: tuple[F32, ...], b: tuple[F32, ...]) -> F32:
    i = intersect(a, b)
    w, h = F32(i[2] - i[0]), F32(i[3] - i[1])
    if w > 0 and h > 0:
        inter = F32(w * h)
        return F32(inter / F32(F32(size(*a) + size(*b)) - inter))
    return F32(0)


def coverage(a: tuple[F32, ...], b: tuple[F32, ...]) -> F32:
    inter = size(*intersect(a, b))
    return F32(inter / size(*a)) if inter > 0 else F32(0)


def project(src: tuple[F32, ...], b: tuple[F32, ...]) -> tuple[F32, F32, F32, F32] | None:
    """ProjectBBox: ``b`` in ``src``'s coordinates, clipped; None when it leaves nothing."""
    if b[0] >= src[2] or b[2] <= src[0] or b[1] >= src[3] or b[3] <= src[1]:
        return None
    w, h = F32(src[2] - src[0]), F32(src[3] - src[1])
    out = clip((F32(F32(b[0] - src[0]) / w), F32(F32(b[1] - src[1]) / h),
                F32(F32(b[2] - src[0]) / w), F32(F32(b[3] - src[1]) / h)))
    return out if size(*out) > 0 else None


def meets_emit(crop: tuple[F32, ...], b: tuple[F32, ...], emit: Any) -> bool:
    if emit.emit_type == "CENTER":
        cx, cy = F32(F32(b[0] + b[2]) / F32(2)), F32(F32(b[1] + b[3]) / F32(2))
        return bool(crop[0] <= cx <= crop[2] and crop[1] <= cy <= crop[3])
    return bool(coverage(b, crop) > F32(emit.emit_overlap))


def update_by_resize(r: Any, old_w: int, old_h: int,
                     b: tuple[F32, ...]) -> tuple[F32, F32, F32, F32]:
    """UpdateBBoxByResizePolicy."""
    new_h, new_w = F32(r.height), F32(r.width)
    orig_aspect = F32(F32(old_w) / F32(old_h))
    new_aspect = F32(new_w / new_h)
    x0, y0 = F32(b[0] * F32(old_w)), F32(b[1] * F32(old_h))
    x1, y1 = F32(b[2] * F32(old_w)), F32(b[3] * F32(old_h))

    def scaled(v: F32, new: F32, old: int) -> F32:
        return F32(F32(v * new) / F32(old))

    zero = F32(0)
    if r.resize_mode == "FIT_LARGE_SIZE_AND_PAD":
        if orig_aspect > new_aspect:
            padding = F32(F32(new_h - F32(new_w / orig_aspect)) / F32(2))
            x0, x1 = max(zero, scaled(x0, new_w, old_w)), min(new_w, scaled(x1, new_w, old_w))
            inner = F32(new_h - F32(2) * padding)
            y0 = F32(padding + max(zero, scaled(y0, inner, old_h)))
            y1 = F32(padding + min(new_h, scaled(y1, inner, old_h)))
        else:
            padding = F32(F32(new_w - F32(orig_aspect * new_h)) / F32(2))
            inner = F32(new_w - F32(2) * padding)
            x0 = F32(padding + max(zero, scaled(x0, inner, old_w)))
            x1 = F32(padding + min(new_w, scaled(x1, inner, old_w)))
            y0, y1 = max(zero, scaled(y0, new_h, old_h)), min(new_h, scaled(y1, new_h, old_h))
    else:
        if r.resize_mode == "FIT_SMALL_SIZE":
            if orig_aspect < new_aspect:
                new_h = F32(new_w / orig_aspect)
            else:
                new_w = F32(orig_aspect * new_h)
        x0, x1 = max(zero, scaled(x0, new_w, old_w)), min(new_w, scaled(x1, new_w, old_w))
        y0, y1 = max(zero, scaled(y0, new_h, old_h)), min(new_h, scaled(y1, new_h, old_h))
    return F32(x0 / new_w), F32(y0 / new_h), F32(x1 / new_w), F32(y1 / new_h)


def extrapolate(r: Any, height: int, width: int, crop: tuple[F32, ...],
                b: tuple[F32, ...]) -> tuple[F32, ...]:
    """ExtrapolateBBox (FIT_SMALL_SIZE with height_scale and width_scale)."""
    hs, ws = F32(r.height_scale), F32(r.width_scale)
    if not (hs > 0 and ws > 0 and r.resize_mode == "FIT_SMALL_SIZE"):
        return b
    orig_aspect = F32(F32(width) / F32(height))
    rh, rw = F32(r.height), F32(r.width)
    if orig_aspect < F32(rw / rh):
        rh = F32(rw / orig_aspect)
    else:
        rw = F32(rh * orig_aspect)
    ch, cw = F32(rh * F32(crop[3] - crop[1])), F32(rw * F32(crop[2] - crop[0]))
    return (F32(F32(b[0] * cw) / ws), F32(F32(b[1] * ch) / hs), F32(F32(b[2] * cw) / ws),
            F32(F32(b[3] * ch) / hs))


def transform_groups(groups: Groups, img_h: int, img_w: int, crop: tuple[F32, ...],
                     mirror: bool, tp: Any, do_resize: bool) -> Groups:
    """TransformAnnotation: every box resized (with do_resize), checked against the emit
    constraint, projected into ``crop``, mirrored; groups left empty are dropped."""
    resize = tp.resize_param if do_resize else None
    out: Groups = []
    for label, boxes in groups:
        kept = []
        for box in boxes:
            b = box.corners
            if resize is not None:
                b = update_by_resize(resize, img_w, img_h, b)
            if tp.emit_constraint is not None and not meets_emit(crop, b, tp.emit_constraint):
                continue
            p: tuple[F32, ...] | None = project(crop, b)
            if p is None:
                continue
            if mirror:
                p = (F32(F32(1) - p[2]), p[1], F32(F32(1) - p[0]), p[3])
            if resize is not None:
                p = extrapolate(resize, img_h, img_w, crop, p)
            xmin, ymin, xmax, ymax = p
            kept.append(Box(xmin, ymin, xmax, ymax, instance=box.instance,
                            difficult=box.difficult))
        if kept:
            out.append((label, kept))
    return out


def all_boxes(groups: Groups) -> list[tuple[F32, F32, F32, F32]]:
    return [b.corners for _, boxes in groups for b in boxes]


# --- the per-record pipeline ----------------------------------------------------------------
@dataclass
class Image:
    """An image on its way through the pipeline: pixels (C, H, W) uint8, whether the record
    was encoded (distortion applies to encoded records only, and the canvas of an expansion is
    the mean for them, 32 for raw records, as in the fork), its annotations."""

    pixels: np.ndarray
    encoded: bool
    groups: Groups = field(default_factory=list)

    @property
    def height(self) -> int:
        return int(self.pixels.shape[1])

    @property
    def width(self) -> int:
        return int(self.pixels.shape[2])


class AnnotatedTransformer:
    """SSD's data pipeline for one layer: ``__call__(record, rng)`` -> (data (C, h, w)
    float32, groups)."""

    def __init__(self, tp: Any, samplers: list[Any], phase: str, color: bool | None,
                 mean_image: np.ndarray | None):
        self.tp, self.samplers, self.phase, self.color = tp, samplers, phase, color
        self.mean_image = mean_image
        self.mean_values = list(tp.mean_value)

    # -- decoding --
    def image(self, record: AnnotatedDatum) -> Image:
        datum = record.datum
        if datum.encoded:
            pixels = decode_image(datum.data, color=self.color)
        else:
            pixels = datum_to_array(datum)
            if pixels.dtype != np.uint8:
                raise DataError("AnnotatedData reads uint8 images; the record holds "
                                "float_data")
        return Image(np.ascontiguousarray(pixels), bool(datum.encoded), groups_of(record))

    def out_shape(self, record: AnnotatedDatum) -> tuple[int, int, int]:
        """InferBlobShape of a record: channels, then the resize (with FIT_SMALL_SIZE's
        rounding) and the crop."""
        img = self.image(record)
        c, h, w = img.pixels.shape
        r = self.tp.resize_param
        if r is not None and img.encoded:
            h, w = r.height, r.width
            if r.resize_mode == "FIT_SMALL_SIZE":
                orig = F32(F32(img.width) / F32(img.height))
                aspect = F32(F32(r.width) / F32(r.height))
                if orig < aspect:
                    h = int(F32(r.width) / orig)
                else:
                    w = int(orig * F32(r.height))
        crop_h, crop_w = self.crop_size()
        return c, crop_h or h, crop_w or w

    def crop_size(self) -> tuple[int, int]:
        tp = self.tp
        if tp.crop_size:
            return tp.crop_size, tp.crop_size
        return tp.crop_h, tp.crop_w

    # -- the steps --
    def __call__(self, record: AnnotatedDatum, rng: np.random.Generator
                 ) -> tuple[np.ndarray, Groups]:
        img = self.image(record)
        if self.tp.distort_param is not None and img.encoded:
            img = Image(self.distort(img.pixels, rng), True, img.groups)
        if self.tp.expand_param is not None:
            img = self.expand(img, rng)
        if self.samplers:
            sampled = self.generate_samples(img.groups, rng)
            if sampled:
                img = self.crop(img, sampled[int(rng.integers(len(sampled)))])
        return self.transform(img, rng)

    def distort(self, pixels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """ApplyDistort: two fixed orders of brightness, contrast, saturation and hue, then
        the random channel order."""
        d = self.tp.distort_param
        out = pixels

        def brightness(x: np.ndarray) -> np.ndarray:
            if rng.random() < d.brightness_prob:
                delta = rng.uniform(-d.brightness_delta, d.brightness_delta)
                return ssd_image.convert_to(x, 1.0, delta) if abs(delta) > 0 else x
            return x

        def contrast(x: np.ndarray) -> np.ndarray:
            if rng.random() < d.contrast_prob:
                delta = rng.uniform(d.contrast_lower, d.contrast_upper)
                return ssd_image.convert_to(x, delta, 0.0) if abs(delta - 1) > 1e-3 else x
            return x

        def saturation(x: np.ndarray) -> np.ndarray:
            if rng.random() < d.saturation_prob and x.shape[0] == 3:
                return ssd_image.adjust_saturation(
                    x, rng.uniform(d.saturation_lower, d.saturation_upper))
            return x

        def hue(x: np.ndarray) -> np.ndarray:
            if rng.random() < d.hue_prob and x.shape[0] == 3:
                delta = rng.uniform(-d.hue_delta, d.hue_delta)
                return ssd_image.adjust_hue(x, delta) if abs(delta) > 0 else x
            return x

        steps = [brightness, contrast, saturation, hue] if rng.random() > 0.5 else \
            [brightness, saturation, hue, contrast]
        for step in steps:
            out = step(out)
        if rng.random() < d.random_order_prob and out.shape[0] == 3:
            out = np.ascontiguousarray(out[rng.permutation(3)])
        return out

    def expand(self, img: Image, rng: np.random.Generator) -> Image:
        """ExpandImage: the image at a random place on a canvas up to max_expand_ratio times
        its size, filled with the mean (32 for raw records, as the fork)."""
        e = self.tp.expand_param
        if rng.random() > e.prob or abs(e.max_expand_ratio - 1.0) < 1e-2:
            return img
        ratio = F32(rng.uniform(1.0, e.max_expand_ratio))
        h, w = img.height, img.width
        height, width = int(F32(h) * ratio), int(F32(w) * ratio)
        h_off = float(np.floor(rng.uniform(0, height - h)))
        w_off = float(np.floor(rng.uniform(0, width - w)))
        crop = (F32(-w_off / w), F32(-h_off / h), F32((width - w_off) / w),
                F32((height - h_off) / h))
        c = img.pixels.shape[0]
        if img.encoded:
            canvas = np.zeros((c, height, width), np.uint8)
            if self.mean_values:
                values = self.mean_values * c if len(self.mean_values) == 1 else \
                    self.mean_values
                for k in range(c):
                    canvas[k] = ssd_image.saturate_u8(np.asarray(values[k]))
        else:
            canvas = np.full((c, height, width), 32, np.uint8)
        y, x = int(h_off), int(w_off)
        canvas[:, y:y + h, x:x + w] = img.pixels
        groups = transform_groups(img.groups, h, w, crop, False, self.tp, do_resize=False)
        return Image(canvas, img.encoded, groups)

    def generate_samples(self, groups: Groups, rng: np.random.Generator
                         ) -> list[tuple[F32, F32, F32, F32]]:
        """GenerateBatchSamples: each batch sampler's boxes that meet its constraint."""
        objects = all_boxes(groups)
        found_all: list[tuple[F32, F32, F32, F32]] = []
        for bs in self.samplers:
            if not bs.use_original_image:
                continue
            found = 0
            for _ in range(bs.max_trials):
                if bs.max_sample is not None and found >= bs.max_sample:
                    break
                box = sample_box(bs.sampler, rng)
                if satisfies(box, objects, bs.sample_constraint):
                    found += 1
                    found_all.append(box)
        return found_all

    def crop(self, img: Image, box: tuple[F32, ...]) -> Image:
        """CropImage: the pixels of the clipped box (offsets and sizes truncated), the boxes
        projected into it."""
        clipped = clip(box)
        h, w = img.height, img.width
        x0, y0 = F32(clipped[0] * F32(w)), F32(clipped[1] * F32(h))
        x1, y1 = F32(clipped[2] * F32(w)), F32(clipped[3] * F32(h))
        w_off, h_off = int(x0), int(y0)
        width, height = int(F32(x1 - x0)), int(F32(y1 - y0))
        pixels = np.ascontiguousarray(img.pixels[:, h_off:h_off + height, w_off:w_off + width])
        groups = transform_groups(img.groups, h, w, clipped, False, self.tp, do_resize=False)
        return Image(pixels, img.encoded, groups)

    def transform(self, img: Image, rng: np.random.Generator) -> tuple[np.ndarray, Groups]:
        """DataTransformer::Transform: resize (encoded records), crop, mirror, (x - mean) x
        scale; the boxes through TransformAnnotation."""
        tp = self.tp
        mirror = bool(tp.mirror and rng.integers(2))
        pixels = img.pixels
        r = tp.resize_param
        if r is not None and img.encoded:
            interp = r.interp_mode[int(rng.integers(len(r.interp_mode)))] if r.interp_mode \
                else "LINEAR"
            pixels = ssd_image.apply_resize(pixels, r.resize_mode, r.height, r.width, interp,
                                            r.pad_mode, list(r.pad_value))
        c, height, width = pixels.shape
        crop_h, crop_w = self.crop_size()
        h_off = w_off = 0
        if crop_h and crop_w:
            if crop_h > height or crop_w > width:
                raise DataError(f"the crop {crop_h} x {crop_w} is larger than the image "
                                f"({height} x {width})")
            if self.phase == "TRAIN":
                h_off = int(rng.integers(height - crop_h + 1))
                w_off = int(rng.integers(width - crop_w + 1))
            else:
                h_off, w_off = (height - crop_h) // 2, (width - crop_w) // 2
            out_h, out_w = crop_h, crop_w
        else:
            out_h, out_w = height, width
        crop = (F32(F32(w_off) / F32(width)), F32(F32(h_off) / F32(height)),
                F32(F32(w_off + out_w) / F32(width)), F32(F32(h_off + out_h) / F32(height)))
        region = pixels[:, h_off:h_off + out_h, w_off:w_off + out_w].astype(F32)
        # an encoded record is mirrored before the mean image is subtracted (the fork indexes
        # the mean at the output column), a raw one after (at the input column)
        if mirror and img.encoded:
            region = region[:, :, ::-1]
        if self.mean_image is not None:
            mean = self.mean_image
            if mean.shape != (c, height, width):
                raise DataError(f"the mean image is {list(mean.shape)} but the images are "
                                f"{[c, height, width]} (after the resize)")
            region = region - mean[:, h_off:h_off + out_h, w_off:w_off + out_w]
        elif self.mean_values:
            values = self.mean_values * c if len(self.mean_values) == 1 else self.mean_values
            if len(values) != c:
                raise DataError(f"{len(self.mean_values)} mean values for {c} channels")
            region = region - np.asarray(values, F32).reshape(c, 1, 1)
        data = (region * F32(tp.scale)).astype(F32)
        if mirror and not img.encoded:
            data = data[:, :, ::-1]
        groups = transform_groups(img.groups, img.height, img.width, crop, mirror, tp,
                                  do_resize=True)
        return np.ascontiguousarray(data), groups


def sample_box(s: Any, rng: np.random.Generator) -> tuple[F32, F32, F32, F32]:
    """SampleBBox: scale and aspect ratio drawn, the ratio kept within [scale^2, 1/scale^2],
    the box placed at random inside the unit square."""
    scale = F32(rng.uniform(s.min_scale, s.max_scale))
    ratio = F32(rng.uniform(s.min_aspect_ratio, s.max_aspect_ratio))
    ratio = max(ratio, F32(scale ** 2))
    ratio = min(ratio, F32(1 / scale ** 2))
    # at most 1 (float rounding can pass it, and the fork's uniform draw then fails)
    bw = min(F32(scale * np.sqrt(ratio)), F32(1))
    bh = min(F32(scale / np.sqrt(ratio)), F32(1))
    x = F32(rng.uniform(0, F32(1) - bw))
    y = F32(rng.uniform(0, F32(1) - bh))
    return x, y, F32(x + bw), F32(y + bh)


def satisfies(box: tuple[F32, ...], objects: list[tuple[F32, F32, F32, F32]], c: Any) -> bool:
    """SatisfySampleConstraint: any one object within every given bound (no bound: yes)."""
    has_j = c.min_jaccard_overlap is not None or c.max_jaccard_overlap is not None
    has_s = c.min_sample_coverage is not None or c.max_sample_coverage is not None
    has_o = c.min_object_coverage is not None or c.max_object_coverage is not None
    if not (has_j or has_s or has_o):
        return True
    for obj in objects:
        found = False
        if has_j:
            j = jaccard(box, obj)
            if (c.min_jaccard_overlap is not None and j < F32(c.min_jaccard_overlap)) or \
                    (c.max_jaccard_overlap is not None and j > F32(c.max_jaccard_overlap)):
                continue
            found = True
        if has_s:
            v = coverage(box, obj)
            if (c.min_sample_coverage is not None and v < F32(c.min_sample_coverage)) or \
                    (c.max_sample_coverage is not None and v > F32(c.max_sample_coverage)):
                continue
            found = True
        if has_o:
            v = coverage(obj, box)
            if (c.min_object_coverage is not None and v < F32(c.min_object_coverage)) or \
                    (c.max_object_coverage is not None and v > F32(c.max_object_coverage)):
                continue
            found = True
        if found:
            return True
    return False


def label_rows(batch: list[Groups]) -> np.ndarray:
    """The label top's rows [image, label, instance, xmin, ymin, xmax, ymax, difficult]
    (1, 1, G, 8); one row of -1 when the batch holds no box."""
    rows = [[i, label, b.instance, b.xmin, b.ymin, b.xmax, b.ymax, float(b.difficult)]
            for i, groups in enumerate(batch) for label, boxes in groups for b in boxes]
    if not rows:
        return np.full((1, 1, 1, 8), -1, F32)
    return np.asarray(rows, F32)[None, None]


def output_box(boxes: np.ndarray, image_size: tuple[int, int], r: Any
               ) -> tuple[np.ndarray, np.ndarray]:
    """OutputBBox: normalized boxes (M, 4) -> pixel boxes of the original ``image_size``
    (height, width) and their sizes, undoing ``r`` (the test data's resize_param, or None)."""
    height, width = image_size
    out: list[tuple[F32, ...]] = []
    sizes: list[F32] = []
    for b in boxes.astype(F32):
        box = tuple(F32(v) for v in b)
        mode = r.resize_mode if r is not None else None
        if mode == "FIT_LARGE_SIZE_AND_PAD":
            rh, rw = F32(r.height), F32(r.width)
            aspect = F32(F32(width) / F32(height))
            if aspect > F32(rw / rh):
                padding = F32(F32(rh - F32(rw / aspect)) / F32(2))
                source = (F32(0), F32(padding / rh), F32(1), F32(F32(1) - F32(padding / rh)))
            else:
                padding = F32(F32(rw - F32(rh * aspect)) / F32(2))
                source = (F32(padding / rw), F32(0), F32(F32(1) - F32(padding / rw)), F32(1))
            projected = project(source, box)
            box = projected if projected is not None else box
        if mode == "FIT_SMALL_SIZE" and r.height_scale and r.width_scale:
            corners = _scale(box, r.height_scale, r.width_scale)[0]
            clipped = tuple(F32(min(max(v, F32(0)), F32(limit))) for v, limit in
                            zip(corners, (width, height, width, height), strict=True))
            out.append(clipped)
            sizes.append(size(*clipped))  # ClipBBox re-measures in normalized form
            continue
        scaled, measured = _scale(clip(box), height, width)
        out.append(scaled)
        sizes.append(measured)
    return np.asarray(out, F32).reshape(-1, 4), np.asarray(sizes, F32)


def _scale(b: tuple[F32, ...], height: int, width: int) -> tuple[tuple[F32, ...], F32]:
    """ScaleBBox: to pixels, the size as (w + 1) x (h + 1) once the image exceeds 1 x 1."""
    s = (F32(b[0] * F32(width)), F32(b[1] * F32(height)), F32(b[2] * F32(width)),
         F32(b[3] * F32(height)))
    if not (width > 1 or height > 1):
        return s, size(*s)
    if s[2] < s[0] or s[3] < s[1]:
        return s, F32(0)
    return s, F32(F32(s[2] - s[0] + F32(1)) * F32(s[3] - s[1] + F32(1)))
