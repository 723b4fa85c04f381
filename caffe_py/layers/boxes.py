"""Box arithmetic of SSD's Caffe fork (src/caffe/util/bbox_util.cpp), in its float32 order.

Boxes are (..., 4) arrays of normalized corners [xmin, ymin, xmax, ymax]. Everything here
computes as the fork does in float: the size of a box is width x height (0 when a side is
negative), the overlap of two boxes is 0 unless they intersect, and a decoded box keeps the
size it had before any clipping. The matching and mining functions work on numpy arrays on the
host (they make index decisions, as the fork's do on the CPU); encoding, decoding and the
overlaps also take torch tensors on any device.

A plain reference, one box at a time as the fork's loops run, is in
tests/layers/detection_reference.py; the tests hold these vectorized forms to it.
"""
from __future__ import annotations

from typing import Any, TypeVar, cast

import numpy as np
import torch

Array = TypeVar("Array", np.ndarray, torch.Tensor)
F32 = np.float32


# --- sizes and overlaps ---------------------------------------------------------------------
def box_size(boxes: Array) -> Array:
    """BBoxSize(normalized): width x height, 0 for an invalid box (xmax < xmin or ymax <
    ymin). (..., 4) -> (...)."""
    w = boxes[..., 2] - boxes[..., 0]
    h = boxes[..., 3] - boxes[..., 1]
    size = w * h
    invalid = (w < 0) | (h < 0)
    if isinstance(size, torch.Tensor):
        return cast(Array, torch.where(invalid, torch.zeros_like(size), size))
    return cast(Array, np.where(invalid, F32(0), size).astype(size.dtype))


def overlaps(a: Array, b: Array, size_a: Array | None = None,
             size_b: Array | None = None) -> Array:
    """JaccardOverlap(normalized) of every box of ``a`` (..., A, 4) with every box of ``b``
    (..., B, 4) -> (..., A, B), with the boxes' stored sizes (default: :func:`box_size`)."""
    size_a = box_size(a) if size_a is None else size_a
    size_b = box_size(b) if size_b is None else size_b
    ax0, ay0, ax1, ay1 = (a[..., :, None, k] for k in range(4))
    bx0, by0, bx1, by1 = (b[..., None, :, k] for k in range(4))
    apart = (bx0 > ax1) | (bx1 < ax0) | (by0 > ay1) | (by1 < ay0)
    if isinstance(a, torch.Tensor):
        iw = torch.minimum(ax1, bx1) - torch.maximum(ax0, bx0)
        ih = torch.minimum(ay1, by1) - torch.maximum(ay0, by0)
        inter = iw * ih
        union = size_a[..., :, None] + size_b[..., None, :] - inter
        ok = ~apart & (iw > 0) & (ih > 0)
        return torch.where(ok, inter / torch.where(ok, union, torch.ones_like(union)),
                           torch.zeros_like(inter))
    iw = np.minimum(ax1, bx1) - np.maximum(ax0, bx0)
    ih = np.minimum(ay1, by1) - np.maximum(ay0, by0)
    inter = iw * ih
    union = size_a[..., :, None] + size_b[..., None, :] - inter
    ok = ~apart & (iw > 0) & (ih > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ok, inter / np.where(ok, union, F32(1)), F32(0)).astype(inter.dtype)


def coverage(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """BBoxCoverage(a, b): the area of a & b over the area of a; (4,) boxes or (..., 4)
    broadcast."""
    x0 = np.maximum(a[..., 0], b[..., 0])
    y0 = np.maximum(a[..., 1], b[..., 1])
    x1 = np.minimum(a[..., 2], b[..., 2])
    y1 = np.minimum(a[..., 3], b[..., 3])
    apart = (b[..., 0] > a[..., 2]) | (b[..., 2] < a[..., 0]) | (b[..., 1] > a[..., 3]) | \
        (b[..., 3] < a[..., 1])
    inter = box_size(np.stack([x0, y0, x1, y1], -1).astype(F32))
    inter = np.where(apart, F32(0), inter)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(inter > 0, inter / box_size(a), F32(0)).astype(F32)


# --- encoding and decoding ------------------------------------------------------------------
def decode(loc: Array, priors: Array, variances: Array, code_type: str,
           variance_in_target: bool) -> Array:
    """DecodeBBox: offsets ``loc`` (..., P, 4) against ``priors`` (P, 4) with ``variances``
    (P, 4) -> boxes (..., P, 4), in the fork's float order (without clipping)."""
    px0, py0, px1, py1 = (priors[..., k] for k in range(4))
    var = [variances[..., k] for k in range(4)]
    lx0, ly0, lx1, ly1 = (loc[..., k] for k in range(4))
    if code_type == "CORNER":
        if variance_in_target:
            out = [px0 + lx0, py0 + ly0, px1 + lx1, py1 + ly1]
        else:
            out = [px0 + var[0] * lx0, py0 + var[1] * ly0, px1 + var[2] * lx1,
                   py1 + var[3] * ly1]
    elif code_type == "CENTER_SIZE":
        pw, ph = px1 - px0, py1 - py0
        pcx, pcy = (px0 + px1) / 2, (py0 + py1) / 2
        if variance_in_target:
            cx, cy = lx0 * pw + pcx, ly0 * ph + pcy
            w, h = _exp_times(lx1, pw), _exp_times(ly1, ph)
        else:
            cx, cy = var[0] * lx0 * pw + pcx, var[1] * ly0 * ph + pcy
            w, h = _exp_times(var[2] * lx1, pw), _exp_times(var[3] * ly1, ph)
        out = [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]
    elif code_type == "CORNER_SIZE":
        pw, ph = px1 - px0, py1 - py0
        if variance_in_target:
            out = [px0 + lx0 * pw, py0 + ly0 * ph, px1 + lx1 * pw, py1 + ly1 * ph]
        else:
            out = [px0 + var[0] * lx0 * pw, py0 + var[1] * ly0 * ph, px1 + var[2] * lx1 * pw,
                   py1 + var[3] * ly1 * ph]
    else:
        raise ValueError(f"unknown code_type {code_type}")
    if isinstance(loc, torch.Tensor):
        return torch.stack(torch.broadcast_tensors(*out), -1)
    return np.stack(np.broadcast_arrays(*out), -1).astype(F32)


def _exp_times(x: Array, scale: Array) -> Array:
    """float(exp(double(x)) * scale): the fork's exp of a float is the double one, and the
    product is rounded to float once."""
    if isinstance(x, torch.Tensor):
        return (x.double().exp() * scale.double()).to(x.dtype)
    return (np.exp(x.astype(np.float64)) * scale.astype(np.float64)).astype(F32)


def encode(gt: np.ndarray, priors: np.ndarray, variances: np.ndarray, code_type: str,
           variance_in_target: bool) -> np.ndarray:
    """EncodeBBox: ground-truth boxes ``gt`` (M, 4) against their priors (M, 4) -> targets
    (M, 4), float32 as the fork computes them."""
    gx0, gy0, gx1, gy1 = (gt[:, k] for k in range(4))
    px0, py0, px1, py1 = (priors[:, k] for k in range(4))
    v = [variances[:, k] for k in range(4)]
    if code_type == "CORNER":
        out = [gx0 - px0, gy0 - py0, gx1 - px1, gy1 - py1]
        if not variance_in_target:
            out = [o / v[k] for k, o in enumerate(out)]
    elif code_type == "CENTER_SIZE":
        pw, ph = px1 - px0, py1 - py0
        pcx, pcy = (px0 + px1) / F32(2), (py0 + py1) / F32(2)
        gw, gh = gx1 - gx0, gy1 - gy0
        gcx, gcy = (gx0 + gx1) / F32(2), (gy0 + gy1) / F32(2)
        # the fork's unqualified log() is the double one: log and division in double
        lw = np.log((gw / pw).astype(np.float64))
        lh = np.log((gh / ph).astype(np.float64))
        if variance_in_target:
            out = [(gcx - pcx) / pw, (gcy - pcy) / ph, lw.astype(F32), lh.astype(F32)]
        else:
            out = [(gcx - pcx) / pw / v[0], (gcy - pcy) / ph / v[1],
                   (lw / v[2].astype(np.float64)).astype(F32),
                   (lh / v[3].astype(np.float64)).astype(F32)]
    elif code_type == "CORNER_SIZE":
        pw, ph = px1 - px0, py1 - py0
        out = [(gx0 - px0) / pw, (gy0 - py0) / ph, (gx1 - px1) / pw, (gy1 - py1) / ph]
        if not variance_in_target:
            out = [o / v[k] for k, o in enumerate(out)]
    else:
        raise ValueError(f"unknown code_type {code_type}")
    return np.stack(out, -1).astype(F32)


def crosses_boundary(boxes: np.ndarray) -> np.ndarray:
    """IsCrossBoundaryBBox: a corner outside [0, 1]."""
    return np.asarray(((boxes < 0) | (boxes > 1)).any(-1))


# --- non-maximum suppression ----------------------------------------------------------------
def nms_fast(boxes: torch.Tensor, sizes: torch.Tensor, scores: torch.Tensor, threshold: float,
             nms_threshold: float, eta: float, top_k: int | None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """ApplyNMSFast for a batch of rows at once: ``boxes`` (R, P, 4), their ``sizes`` (R, P)
    and ``scores`` (R, P) -> keep (R, K) bool over each row's candidates and the candidates'
    prior indices (R, K). The candidates are the boxes scoring above ``threshold``, best first
    (a stable sort: ties keep prior order), at most ``top_k`` of them.

    A candidate is kept when it overlaps every box kept before it by at most the adaptive
    threshold, which starts at ``nms_threshold`` and, when ``eta`` < 1, is multiplied by eta
    after each kept box while it is above 0.5: the fork's rule, candidate by candidate."""
    rows, priors = scores.shape
    limit_k = priors if top_k is None or top_k < 0 else min(top_k, priors)
    above = int((scores > threshold).sum(1).max()) if rows else 0
    k = min(limit_k, above)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
    keep = torch.zeros(rows, k, dtype=torch.bool, device=scores.device)
    if k == 0:
        return keep, order
    step = max(1, _NMS_ELEMENTS // (k * k))  # rows per pass: the overlaps fit in memory
    for first in range(0, rows, step):
        part = slice(first, first + step)
        keep[part] = _nms_rows(boxes[part], sizes[part], scores[part], order[part], threshold,
                               nms_threshold, eta)
    return keep, order


_NMS_ELEMENTS = 1 << 25
"""The most pairwise overlaps one pass of :func:`nms_fast` holds (128 MB of float32)."""


def _nms_rows(boxes: torch.Tensor, sizes: torch.Tensor, scores: torch.Tensor,
              order: torch.Tensor, threshold: float, nms_threshold: float,
              eta: float) -> torch.Tensor:
    rows, k = order.shape
    valid = torch.gather(scores, 1, order) > threshold
    cand = torch.gather(boxes, 1, order[..., None].expand(-1, -1, 4))
    cand_sizes = torch.gather(sizes, 1, order)
    iou = overlaps(cand, cand, cand_sizes, cand_sizes)  # (R, K, K)
    keep = torch.zeros(rows, k, dtype=torch.bool, device=scores.device)
    limit = torch.full((rows,), float(np.float32(nms_threshold)), dtype=torch.float32,
                       device=scores.device)
    eta32 = float(np.float32(eta))
    for j in range(k):
        if j == 0:
            ok = valid[:, 0]
        else:
            suppressed = (keep[:, :j] & (iou[:, j, :j] > limit[:, None])).any(1)
            ok = valid[:, j] & ~suppressed
        keep[:, j] = ok
        if eta < 1:
            limit = torch.where(ok & (limit > 0.5), limit * eta32, limit)
    return keep


def nms_plain(boxes: np.ndarray, scores: np.ndarray, threshold: float,
              top_k: int | None) -> list[int]:
    """ApplyNMS (the older rule MultiBoxLoss's HARD_EXAMPLE mining uses): the ``top_k`` best
    (stable order), boxes smaller than 1e-5 dropped, each kept box removing those overlapping it
    by more than ``threshold``, stopping once ``top_k`` are kept. Indices into ``scores``."""
    order = np.argsort(-scores, kind="stable")
    if top_k is not None and -1 < top_k < len(order):
        order = order[:top_k]
    sizes = box_size(boxes)
    pool = [int(i) for i in order]
    kept: list[int] = []
    while pool:
        best = pool.pop(0)
        if sizes[best] < 1e-5:
            continue
        kept.append(best)
        if top_k is not None and top_k > -1 and len(kept) >= top_k:
            break
        if not pool:
            break
        rest = np.asarray(pool)
        small = sizes[rest] < 1e-5
        iou = overlaps(boxes[best][None], boxes[rest])[0]
        pool = [int(i) for i, s, o in zip(rest, small, iou, strict=True)
                if not s and not o > threshold]
    return kept


# --- matching ---------------------------------------------------------------------------------
def match(gt: np.ndarray, gt_labels: np.ndarray, preds: np.ndarray, label: int, match_type: str,
          overlap_threshold: float, ignore_cross_boundary: bool
          ) -> tuple[np.ndarray, np.ndarray]:
    """MatchBBox: for each of ``preds`` (P, 4) the index of its ground-truth box in ``gt``
    (G, 4) or -1 (-2: ignored as crossing the border), and its overlap.

    Bipartite first: the globally best (prediction, ground truth) pair, repeatedly, each side
    used once (ties: the first prediction, then the first ground truth); PER_PREDICTION then
    gives every other prediction its best ground truth overlapping it by at least
    ``overlap_threshold``. ``label`` -1 matches every ground truth, else those of that label."""
    num_pred = len(preds)
    indices = np.full(num_pred, -1, np.int64)
    best = np.zeros(num_pred, F32)
    gt_ids = np.arange(len(gt)) if label == -1 else np.flatnonzero(gt_labels == label)
    if len(gt_ids) == 0:
        return indices, best
    ignored = crosses_boundary(preds) if ignore_cross_boundary else np.zeros(num_pred, bool)
    indices[ignored] = -2
    iou = overlaps(preds.astype(F32), gt[gt_ids].astype(F32))   # (P, G)
    iou[ignored] = 0
    positive = iou > F32(1e-6)
    best = np.where(positive, iou, F32(0)).max(1).astype(F32)
    pool = np.where(positive, iou, F32(-1))
    while True:
        flat = int(np.argmax(pool))
        i, j = divmod(flat, pool.shape[1])
        if pool[i, j] < 0:
            break
        indices[i] = gt_ids[j]
        best[i] = iou[i, j]
        pool[i, :] = -1
        pool[:, j] = -1
    if match_type == "PER_PREDICTION":
        rest = np.flatnonzero((indices == -1) & positive.any(1))
        if len(rest):
            cand = np.where(positive[rest] & (iou[rest] >= F32(overlap_threshold)),
                            iou[rest], F32(-1))
            j = np.argmax(cand, 1)
            found = cand[np.arange(len(rest)), j] >= 0
            indices[rest[found]] = gt_ids[j[found]]
            best[rest[found]] = cand[np.arange(len(rest)), j][found]
    return indices, best


def softmax_loss_per_row(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """-log(max(softmax(scores)[label], FLT_MIN)) per row (ComputeConfLoss, SOFTMAX), float32."""
    x = scores.astype(F32)
    top = x.max(1, keepdims=True)
    e = np.exp(x - top)
    total = np.zeros(len(x), F32)
    for c in range(x.shape[1]):  # the fork's running sum, class by class
        total += e[:, c]
    prob = e[np.arange(len(x)), labels] / total
    return -np.log(np.maximum(prob, np.finfo(F32).tiny)).astype(F32)


def logistic_loss_per_row(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """ComputeConfLoss, LOGISTIC: the sigmoid cross-entropy summed over classes, the target 1
    at ``label``."""
    x = scores.astype(F32)
    target = np.zeros_like(x)
    target[np.arange(len(x)), labels] = 1
    pos = (x >= 0).astype(F32)
    terms = x * (target - pos) - np.log1p(np.exp(x - 2 * x * pos))
    total = np.zeros(len(x), F32)
    for c in range(x.shape[1]):
        total -= terms[:, c]
    return total


def smooth_l1_rows(diff: np.ndarray) -> np.ndarray:
    """The fork's per-row SmoothL1 (|d| < 1: 0.5 d^2, else |d| - 0.5) summed over 4 values."""
    a = np.abs(diff)
    return np.where(a < 1, F32(0.5) * diff * diff, a - F32(0.5)).astype(F32).sum(-1,
                                                                                 dtype=F32)


def as_numpy(x: Any) -> np.ndarray:
    """A host float32 copy of a tensor (or array)."""
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float32).numpy()
    return np.asarray(x, F32)
