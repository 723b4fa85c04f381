"""Layer family: SSD's detection layers (weiliu89/caffe, branch ssd): PriorBox, Permute,
Normalize, DetectionOutput and DetectionEvaluate (MultiBoxLoss is in :mod:`.multibox`).

Their numbers are the fork's CPU code's (prior_box_layer.cpp, permute_layer.cpp,
normalize_layer.cpp, detection_output_layer.cpp, detection_evaluate_layer.cpp and
util/bbox_util.cpp), float32 rounding included; tests/golden/forks/ssd holds what the fork
itself computes. DetectionOutput's decoding and non-maximum suppression run as tensor
operations on the layer's device (CPU or CUDA: the same operations, the same numbers); its
top, like DetectionEvaluate's, has as many rows as there are detections, so these layers
change their top shapes from batch to batch and are not captured in CUDA graphs.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import DataError
from . import boxes
from .base import Layer, Shape, count
from .registry import register

log = logging.getLogger(__name__)
F32 = np.float32


# --- PriorBox -------------------------------------------------------------------------------
def _aspect_ratios(given: list[float], flip: bool) -> list[float]:
    """1, then each new ratio (within 1e-6 of none before) and, with flip, its inverse."""
    ratios = [1.0]
    for r in given:
        r = float(F32(r))
        if any(abs(r - seen) < 1e-6 for seen in ratios):
            continue
        ratios.append(r)
        if flip:
            ratios.append(float(F32(1.0 / r)))
    return ratios


@register("PriorBox")
class PriorBox(Layer):
    """SSD's default boxes for one feature map: top (1, 2, H x W x num_priors x 4), the boxes'
    normalized corners then their variances.

    Bottoms: the feature map (N, C, H, W) and the image (N, C, h, w), whose sizes (or img_size,
    step) place the boxes. Per cell: for each min_size a square of that side, the square
    sqrt(min_size x max_size) when max_size is given, then one box per other aspect ratio.
    """

    bottoms = (2, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        for i, shape in enumerate(bottom_shapes):
            self.require_axes(i, shape, 4)
        self.ratios = _aspect_ratios(p.aspect_ratio, p.flip)
        self.num_priors = len(self.ratios) * len(p.min_size) + len(p.max_size)
        self._cache: dict[tuple[int, ...], torch.Tensor] = {}
        h, w = bottom_shapes[0][2:]
        if h * w == 0:
            raise self.bottom_error(0, f"has shape {list(bottom_shapes[0])}: no cell to place "
                                       "priors in")
        return [(1, 2, h * w * self.num_priors * 4)]

    def priors(self, layer_h: int, layer_w: int, img_h: int, img_w: int) -> np.ndarray:
        """(2, H x W x num_priors x 4) float32: the boxes, then the variances."""
        p = self.param()
        if p.img_h is not None:
            img_h, img_w = p.img_h, p.img_w
        elif p.img_size is not None:
            img_h = img_w = p.img_size
        if p.step_h is not None:
            step_h, step_w = F32(p.step_h), F32(p.step_w)
        elif p.step is not None:
            step_h = step_w = F32(p.step)
        else:
            step_w, step_h = F32(img_w) / F32(layer_w), F32(img_h) / F32(layer_h)
        offset = F32(p.offset)
        cx = ((np.arange(layer_w, dtype=F32) + offset) * step_w).astype(np.float64)
        cy = ((np.arange(layer_h, dtype=F32) + offset) * step_h).astype(np.float64)
        sizes: list[tuple[float, float]] = []  # (width, height) per prior of a cell, as floats
        for s, min_size in enumerate(p.min_size):
            side = int(min_size)  # the fork keeps min_size in an int
            sizes.append((float(F32(side)), float(F32(side))))
            if p.max_size:
                square = float(F32(math.sqrt(side * int(p.max_size[s]))))
                sizes.append((square, square))
            for r in self.ratios:
                if abs(r - 1.0) < 1e-6:
                    continue
                sizes.append((float(F32(side * math.sqrt(r))), float(F32(side / math.sqrt(r)))))
        bw = np.array([w for w, _ in sizes])
        bh = np.array([h for _, h in sizes])
        x = cx[None, :, None]
        y = cy[:, None, None]
        out = np.stack(np.broadcast_arrays(
            (x - bw / 2.0) / img_w, (y - bh / 2.0) / img_h,
            (x + bw / 2.0) / img_w, (y + bh / 2.0) / img_h), -1).astype(F32)  # (H, W, K, 4)
        flat = out.reshape(-1)
        if p.clip:
            flat = np.clip(flat, F32(0), F32(1))
        variance = p.variance or [0.1]
        var = np.empty_like(flat)
        if len(variance) == 1:
            var[:] = F32(variance[0])
        else:
            var.reshape(-1, 4)[:] = np.asarray(variance, F32)
        return np.stack([flat, var])

    def forward(self, feature: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        key = (*feature.shape[2:], *image.shape[2:])
        top = self._cache.get(key)
        if top is None:
            values = self.priors(feature.shape[2], feature.shape[3], image.shape[2],
                                 image.shape[3])
            top = torch.from_numpy(values[None]).to(feature.device)
            self._cache = {key: top}  # one shape at a time: the latest
        return top


# --- Permute --------------------------------------------------------------------------------
@register("Permute")
class Permute(Layer):
    """The axes in a new order (SSD's Permute): ``order`` first, the others after it."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        shape = bottom_shapes[0]
        order = list(self.param().order)
        for axis in order:
            if axis >= len(shape):
                raise self.fail(f"permute_param.order names axis {axis} but bottom "
                                f"'{self.spec.bottom[0]}' has {len(shape)} axes "
                                f"{list(shape)}", "name axes of the bottom")
        self.order = order + [a for a in range(len(shape)) if a not in order]
        return [tuple(shape[a] for a in self.order)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.order == list(range(x.dim())):
            return x
        return x.permute(*self.order).contiguous()


# --- Normalize ------------------------------------------------------------------------------
@register("Normalize")
class Normalize(Layer):
    """L2 normalization, then a learned scale (SSD's Normalize): x / sqrt(sum(x^2) + eps) x
    scale, the sum over C x H x W per sample (across_spatial) or over C per position; the
    scale one value (channel_shared) or one per channel. Its backward is the exact derivative,
    as the fork's."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        from ..spec.layer_params.shared import FillerParameter

        p = self.param()
        shape = bottom_shapes[0]
        if len(shape) < 2:
            raise self.bottom_error(0, f"has shape {list(shape)}; Normalize needs >= 2 axes")
        filler = p.scale_filler or FillerParameter(type="constant", value=1.0)
        self.add_blob("scale", () if p.channel_shared else (shape[1],), filler)
        return [shape]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.param()
        return _Normalize.apply(x, self.scale, p.across_spatial, p.channel_shared, p.eps)


class _Normalize(torch.autograd.Function):
    """Normalize with the fork's backward: the bottom's gradient is the normalization's
    derivative applied to the top's gradient, then multiplied by the scale (with one scale
    per channel this is not the exact derivative: the fork leaves the scale out of the dot
    product); the scale's gradient is sum(top x top_diff) / scale."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: torch.Tensor, across_spatial: bool,
                shared: bool, eps: float) -> torch.Tensor:
        x3 = x.reshape(x.shape[0], x.shape[1], -1)  # (N, C, H x W)
        dims = (1, 2) if across_spatial else (1,)
        norm = (x3.square().sum(dim=dims, keepdim=True) + eps).sqrt()
        s = scale if shared else scale.reshape(1, -1, 1)
        top = x3 / norm * s
        ctx.save_for_backward(x3, norm, scale, top)
        ctx.dims, ctx.shared, ctx.shape = dims, shared, x.shape
        return top.reshape(x.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x3, norm, scale, top = ctx.saved_tensors
        g = grad.reshape(x3.shape)
        s = scale if ctx.shared else scale.reshape(1, -1, 1)
        dot = (x3 * g).sum(dim=ctx.dims, keepdim=True)
        dx = (g - x3 * (dot / norm / norm)) / norm * s
        if ctx.shared:
            dscale = ((top * g).sum() / scale).reshape(scale.shape)
        else:
            dscale = (top * g).sum(dim=(0, 2)) / scale
        return dx.reshape(ctx.shape), dscale, None, None, None


# --- DetectionOutput ------------------------------------------------------------------------
@register("DetectionOutput")
class DetectionOutput(Layer):
    """Decode every prior's box, keep per class the boxes that survive NMS, then the
    ``keep_top_k`` best per image (SSD's DetectionOutput).

    Bottoms: loc (N, P x L x 4) (L = 1 with share_location, else num_classes), conf
    (N, P x num_classes) (softmax probabilities), priors (1, 2, P x 4). Top (1, 1, D, 7): per
    detection [image, label, score, xmin, ymin, xmax, ymax], per image by class then score;
    with no detection at all, one row [i, -1, ...] per image. Writes VOC result files with
    save_output_param (output_directory, label_map_file and name_size_file given).
    """

    bottoms = (3, 4)
    capturable = False  # the number of detections changes every batch

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        self.num_classes = p.num_classes
        self.loc_classes = 1 if p.share_location else p.num_classes
        self.num_priors = self._num_priors(bottom_shapes)
        nms = p.nms_param
        self.threshold = -float(np.finfo(F32).max) if p.confidence_threshold is None \
            else float(F32(p.confidence_threshold))
        self.top_k = nms.top_k
        if p.visualize:
            log.warning(f"layer '{self.name}' (DetectionOutput): visualize draws in the fork's "
                        "OpenCV window; caffe-py draws nothing")
        self.writer: ResultWriter | None = None
        self._writer_ready = not p.save_output_param.output_directory
        return [(1, 1, 1, 7)]

    def _num_priors(self, bottom_shapes: list[Shape]) -> int:
        loc, conf, prior = bottom_shapes[:3]
        if len(prior) not in (3, 4) or prior[1] != 2 or prior[2] % 4 or \
                any(d != 1 for d in prior[3:]):   # (1, 2, P x 4), or with a last axis of 1
            raise self.bottom_error(2, f"has shape {list(prior)}; expected PriorBox's "
                                       "(1, 2, P x 4)")
        priors = prior[2] // 4 if len(prior) >= 3 else 0
        if count(loc, 1) != priors * self.loc_classes * 4:
            raise self.bottom_error(0, f"has {count(loc, 1)} values per image for {priors} "
                                       f"priors; expected {priors * self.loc_classes * 4}",
                                    "check the loc predictions' num_output")
        if count(conf, 1) != priors * self.num_classes:
            raise self.bottom_error(1, f"has {count(conf, 1)} values per image for {priors} "
                                       f"priors of {self.num_classes} classes; expected "
                                       f"{priors * self.num_classes}",
                                    "check the conf predictions' num_output")
        return priors

    def decoded(self, loc: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
        """(N, L, P, 4) boxes, in the fork's float order."""
        p = self.param()
        n = loc.shape[0]
        priors = prior.reshape(2, -1, 4)
        offsets = loc.reshape(n, self.num_priors, self.loc_classes, 4).transpose(1, 2)
        return boxes.decode(offsets.float(), priors[0].float(), priors[1].float(), p.code_type,
                            p.variance_encoded_in_target)

    @torch.no_grad()
    def forward(self, loc: torch.Tensor, conf: torch.Tensor, prior: torch.Tensor,
                *_: torch.Tensor) -> torch.Tensor:
        p = self.param()
        n, c, num_p = loc.shape[0], self.num_classes, self.num_priors
        decoded = self.decoded(loc, prior)                       # (N, L, P, 4)
        sizes = boxes.box_size(decoded)
        scores = conf.reshape(n, num_p, c).transpose(1, 2).float()   # (N, C, P)
        classes = [k for k in range(c) if k != p.background_label_id]
        if not classes:
            return self._empty(n, loc.device)
        cls = torch.tensor(classes, device=loc.device)
        which = torch.zeros_like(cls) if p.share_location else cls
        rows_boxes = decoded[:, which].reshape(-1, num_p, 4)
        rows_sizes = sizes[:, which].reshape(-1, num_p)
        rows_scores = scores[:, cls].reshape(-1, num_p)
        keep, order = boxes.nms_fast(rows_boxes, rows_sizes, rows_scores, self.threshold,
                                     p.nms_param.nms_threshold, p.nms_param.eta, self.top_k)
        k = keep.shape[1]
        image = torch.arange(n, device=loc.device).repeat_interleave(len(classes))
        label = cls.repeat(n)
        # the kept candidates as rows (image, label, rank, prior), in image, class, rank order
        r, j = keep.nonzero(as_tuple=True)
        prior_idx = order[r, j]
        det_image, det_label = image[r], label[r]
        det_score = rows_scores[r, prior_idx]
        det_box = rows_boxes[r, prior_idx]
        if p.keep_top_k > -1:
            det_image, det_label, det_score, det_box = self._keep_top_k(
                det_image, det_label, det_score, det_box, n, p.keep_top_k)
        del k
        if det_image.numel() == 0:
            log.info("Couldn't find any detections")
            return self._empty(n, loc.device)
        top = torch.cat([det_image[:, None].float(), det_label[:, None].float(),
                         det_score[:, None], det_box], 1)
        if not self._writer_ready:  # the result files' setup reads files: at first use
            self.writer, self._writer_ready = ResultWriter.of(self), True
        if self.writer is not None:
            self.writer.add(top.cpu().numpy(), n)
        return top[None, None]

    @staticmethod
    def _keep_top_k(image: torch.Tensor, label: torch.Tensor, score: torch.Tensor,
                    box: torch.Tensor, n: int, keep: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per image with more than ``keep`` detections: its ``keep`` best (score order, ties
        in class-then-rank order), listed again by class, then score."""
        per_image = torch.bincount(image, minlength=n)
        if bool((per_image <= keep).all()):
            return image, label, score, box
        # rank each detection within its image by score (stable: class, rank order on ties)
        order = torch.argsort(score, descending=True, stable=True)
        order = order[torch.argsort(image[order], stable=True)]
        start = torch.cumsum(per_image, 0) - per_image
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order), device=order.device) - start[image[order]]
        chosen = (rank < keep) | (per_image[image] <= keep)
        idx = chosen.nonzero(as_tuple=True)[0]
        # back to image, class, score order (the fork's map by label, each list by score)
        sub_score = score[idx]
        by_score = torch.argsort(sub_score, descending=True, stable=True)
        idx = idx[by_score]
        idx = idx[torch.argsort(label[idx], stable=True)]
        idx = idx[torch.argsort(image[idx], stable=True)]
        return image[idx], label[idx], score[idx], box[idx]

    @staticmethod
    def _empty(n: int, device: torch.device) -> torch.Tensor:
        top = torch.full((1, 1, n, 7), -1.0, device=device)
        top[0, 0, :, 0] = torch.arange(n, device=device, dtype=torch.float32)
        return top


class ResultWriter:
    """save_output_param's VOC files: per class ``<prefix><name>.txt`` with ``image score xmin
    ymin xmax ymax`` lines (pixels of the original image, truncated to integers), written
    every num_test_image images, as the fork writes them."""

    def __init__(self, layer: DetectionOutput, directory: Path, prefix: str,
                 names: dict[int, str], images: list[tuple[str, int, int]], per_pass: int):
        self.layer, self.directory, self.prefix = layer, directory, prefix
        self.names, self.images, self.per_pass = names, images, per_pass
        self.rows: list[tuple[int, str, float, list[float]]] = []
        self.count = 0

    @classmethod
    def of(cls, layer: DetectionOutput) -> ResultWriter | None:
        from ..io.formats.labelmap import read_label_map

        s = layer.param().save_output_param
        if s.output_format not in ("VOC", ""):
            raise layer.fail(f"save_output_param.output_format {s.output_format} is not "
                             "written by caffe-py", "use output_format: VOC, or leave "
                             "save_output_param out")
        if not s.label_map_file or not s.name_size_file:
            log.warning(f"layer '{layer.name}' (DetectionOutput): save_output_param needs "
                        "label_map_file and name_size_file; no result files are written")
            return None
        try:
            names = {item.label: item.name for item in read_label_map(s.label_map_file)}
            images = read_name_size(s.name_size_file)
        except DataError as exc:
            raise layer.fail(str(exc)) from None
        directory = Path(s.output_directory)
        directory.mkdir(parents=True, exist_ok=True)
        per_pass = s.num_test_image or len(images)
        return cls(layer, directory, s.output_name_prefix, names, images, per_pass)

    def add(self, top: np.ndarray, n: int) -> None:
        for i in range(n):
            if self.count >= len(self.images):
                return
            name, height, width = self.images[self.count]
            for row in top[top[:, 0] == i]:
                label = int(row[1])
                if label < 0:
                    continue
                clipped = np.clip(row[3:7], 0, 1)
                pixels = clipped * np.array([width, height, width, height], F32)
                self.rows.append((label, name, float(row[2]), [float(v) for v in pixels]))
            self.count += 1
            if self.count % self.per_pass == 0:
                self.flush()

    def flush(self) -> None:
        p = self.layer.param()
        for label, name in self.names.items():
            if label == p.background_label_id:
                continue
            lines = []
            for row_label, image, score, (x0, y0, x1, y1) in self.rows:
                if row_label != label:
                    continue
                box = [round(v * 100) / 100 for v in (x0, y0, x1 - x0, y1 - y0)]
                ints = [int(v) for v in box]
                lines.append(f"{image} {score:g} {ints[0]} {ints[1]} {ints[0] + ints[2]} "
                             f"{ints[1] + ints[3]}\n")
            (self.directory / f"{self.prefix}{name}.txt").write_text("".join(lines))
        self.rows = []
        self.count %= max(1, len(self.images))


def read_name_size(path: str) -> list[tuple[str, int, int]]:
    """A name_size_file: ``name height width`` per line."""
    try:
        tokens = Path(path).read_text(encoding="utf-8").split()
    except OSError as exc:
        raise DataError(f"{path}: cannot read the name size file ({exc.strerror})") from None
    out = []
    for i in range(0, len(tokens) - 2, 3):
        try:
            out.append((tokens[i], int(tokens[i + 1]), int(tokens[i + 2])))
        except ValueError:
            raise DataError(f"{path}: entry {i // 3 + 1} is not 'name height width'") from None
    return out


# --- DetectionEvaluate ----------------------------------------------------------------------
@register("DetectionEvaluate")
class DetectionEvaluate(Layer):
    """Mark each detection a true or false positive (SSD's DetectionEvaluate).

    Bottoms: detections (1, 1, D, 7) from DetectionOutput and ground truth (1, 1, G, 8) from
    AnnotatedData ([image, label, instance, xmin, ymin, xmax, ymax, difficult]). Top
    (1, 1, K + D', 5): first one row [-1, class, positives, -1, -1] per class, then per
    detection [image, label, score, tp, fp], an image's detections of a class by score, each
    matched to the unmatched ground truth of its class it overlaps most (from
    overlap_threshold). The solver's detection evaluation turns these rows into mAP.
    """

    bottoms = (2, 2)
    capturable = False

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        det, gt = bottom_shapes
        if len(det) != 4 or det[:2] != (1, 1) or det[3] != 7:
            raise self.bottom_error(0, f"has shape {list(det)}; expected DetectionOutput's "
                                       "(1, 1, D, 7)")
        if len(gt) != 4 or gt[:2] != (1, 1) or gt[3] != 8:
            raise self.bottom_error(1, f"has shape {list(gt)}; expected AnnotatedData's "
                                       "label (1, 1, G, 8)")
        self._sizes: list[tuple[int, int]] | None = None if p.name_size_file else []
        self.count = 0
        positive = p.num_classes if p.background_label_id == -1 else p.num_classes - 1
        return [(1, 1, positive, 5)]

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """name_size_file's (height, width) per test image, read at first use."""
        if self._sizes is None:
            try:
                self._sizes = [(h, w) for _, h, w in
                               read_name_size(self.param().name_size_file)]
            except DataError as exc:
                raise self.fail(str(exc)) from None
        return self._sizes

    @torch.no_grad()
    def forward(self, detections: torch.Tensor, gt: torch.Tensor) -> torch.Tensor:
        rows = evaluate_detections(self, boxes.as_numpy(detections).reshape(-1, 7),
                                   boxes.as_numpy(gt).reshape(-1, 8))
        return torch.from_numpy(rows).to(detections.device)[None, None]


def evaluate_detections(layer: DetectionEvaluate, det: np.ndarray,
                        gt: np.ndarray) -> np.ndarray:
    """The fork's DetectionEvaluateLayer::Forward_cpu on host arrays -> (rows, 5)."""
    from ..io.feed.annotated_transform import output_box

    p = layer.param()
    bg = p.background_label_id
    # ground truth: image -> label -> boxes (stops at the first row of image -1)
    gts: dict[int, dict[int, list[np.ndarray]]] = {}
    for row in gt:
        item = int(row[0])
        if item == -1:
            break
        label = int(row[1])
        if label == bg:
            raise DataError(layer.fail("found the background label in the ground truth").args[0])
        gts.setdefault(item, {}).setdefault(label, []).append(row)
    dets: dict[int, dict[int, list[np.ndarray]]] = {}
    for row in det:
        item = int(row[0])
        if item == -1:
            continue
        label = int(row[1])
        if label == bg:
            raise DataError(layer.fail("found the background label in the detections").args[0])
        dets.setdefault(item, {}).setdefault(label, []).append(row)
    num_pos: dict[int, int] = {}
    for labels in gts.values():
        for label, rows in labels.items():
            n = len(rows) if p.evaluate_difficult_gt else sum(1 for r in rows if not r[7])
            num_pos[label] = num_pos.get(label, 0) + n
    out = [[-1.0, float(c), float(num_pos.get(c, 0)), -1.0, -1.0]
           for c in range(p.num_classes) if c != bg]
    normalized = not layer.sizes
    for image in sorted(dets):
        for label in sorted(dets[image]):
            if label == -1:
                continue
            found = dets[image][label]
            matches = gts.get(image, {}).get(label)
            if matches is None:
                out.extend([float(image), float(label), float(r[2]), 0.0, 1.0] for r in found)
                continue
            gt_boxes = np.array([r[3:7] for r in matches], F32)
            difficult = [bool(r[7]) for r in matches]
            gt_sizes = boxes.box_size(gt_boxes)
            if not normalized:
                size = layer.sizes[layer.count]
                gt_boxes, gt_sizes = output_box(gt_boxes, size, p.resize_param)
            visited = [False] * len(matches)
            found = sorted(found, key=lambda r: -float(r[2]))
            for r in found:
                box = np.asarray(r[3:7], F32)[None]
                size_d = boxes.box_size(box)
                if not normalized:
                    box, size_d = output_box(box, layer.sizes[layer.count], p.resize_param)
                if normalized:
                    iou = boxes.overlaps(box, gt_boxes, size_d, gt_sizes)[0]
                else:
                    iou = pixel_overlaps(box[0], size_d[0], gt_boxes, gt_sizes)
                best, j = (F32(-1), -1)
                for k, value in enumerate(iou):
                    if value > best:
                        best, j = value, k
                row = [float(image), float(label), float(r[2]), 0.0, 1.0]
                if best >= F32(p.overlap_threshold):
                    if p.evaluate_difficult_gt or not difficult[j]:
                        if not visited[j]:
                            row[3:5] = [1.0, 0.0]
                            visited[j] = True
                    else:
                        row[3:5] = [0.0, 0.0]
                out.append(row)
        if layer.sizes:
            layer.count = (layer.count + 1) % len(layer.sizes)
    return np.asarray(out, F32).reshape(-1, 5)


def pixel_overlaps(box: np.ndarray, size: F32, gt: np.ndarray, gt_sizes: np.ndarray
                   ) -> np.ndarray:
    """JaccardOverlap(normalized=false): widths and heights of the intersection + 1 pixel."""
    out = np.zeros(len(gt), F32)
    for k, g in enumerate(gt):
        if g[0] > box[2] or g[2] < box[0] or g[1] > box[3] or g[3] < box[1]:
            continue
        w = F32(min(box[2], g[2]) - max(box[0], g[0]) + F32(1))
        h = F32(min(box[3], g[3]) - max(box[1], g[1]) + F32(1))
        if w > 0 and h > 0:
            inter = F32(w * h)
            out[k] = F32(inter / F32(size + gt_sizes[k] - inter))
    return out
