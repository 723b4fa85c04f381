"""Plain references for the detection layers, one box at a time as SSD's fork loops
(bbox_util.cpp's DecodeBBox, JaccardOverlap, ApplyNMSFast; detection_output_layer.cpp's
Forward_cpu), in float32: the oracles of the vectorized forms in caffe_py/layers/boxes.py and
detection.py."""
from __future__ import annotations

import numpy as np

F32 = np.float32


def size(b) -> F32:
    if b[2] < b[0] or b[3] < b[1]:
        return F32(0)
    return F32(F32(b[2] - b[0]) * F32(b[3] - b[1]))


def jaccard(a, b, sa=None, sb=None) -> F32:
    if b[0] > a[2] or b[2] < a[0] or b[1] > a[3] or b[3] < a[1]:
        return F32(0)
    w = F32(min(a[2], b[2]) - max(a[0], b[0]))
    h = F32(min(a[3], b[3]) - max(a[1], b[1]))
    if not (w > 0 and h > 0):
        return F32(0)
    inter = F32(w * h)
    sa = size(a) if sa is None else sa
    sb = size(b) if sb is None else sb
    return F32(inter / F32(F32(sa + sb) - inter))


def decode_center_size(prior, var, loc):
    pw, ph = F32(prior[2] - prior[0]), F32(prior[3] - prior[1])
    pcx, pcy = F32(F32(prior[0] + prior[2]) / F32(2)), F32(F32(prior[1] + prior[3]) / F32(2))
    cx = F32(F32(F32(var[0] * loc[0]) * pw) + pcx)
    cy = F32(F32(F32(var[1] * loc[1]) * ph) + pcy)
    w = F32(np.exp(np.float64(F32(var[2] * loc[2]))) * np.float64(pw))
    h = F32(np.exp(np.float64(F32(var[3] * loc[3]))) * np.float64(ph))
    return [F32(cx - F32(w / 2)), F32(cy - F32(h / 2)), F32(cx + F32(w / 2)),
            F32(cy + F32(h / 2))]


def nms_fast(boxes, sizes, scores, threshold, nms_threshold, eta, top_k):
    order = sorted((i for i in range(len(scores)) if scores[i] > threshold),
                   key=lambda i: -scores[i])  # sorted() is stable, as std::stable_sort
    if top_k is not None and top_k > -1:
        order = order[:top_k]
    kept: list[int] = []
    limit = F32(nms_threshold)
    for i in order:
        keep = all(jaccard(boxes[i], boxes[k], sizes[i], sizes[k]) <= limit for k in kept)
        if keep:
            kept.append(i)
            if eta < 1 and limit > 0.5:
                limit = F32(limit * F32(eta))
    return kept


def detection_output(loc, conf, prior, num_classes, background, threshold, nms_threshold,
                     eta, top_k, keep_top_k):
    """Forward_cpu of a share_location, CENTER_SIZE DetectionOutput: (D, 7) rows."""
    n = loc.shape[0]
    p = prior.shape[-1] // 4
    priors = prior.reshape(2, p, 4)
    rows = []
    for i in range(n):
        boxes = [decode_center_size(priors[0, j], priors[1, j], loc[i].reshape(p, 4)[j])
                 for j in range(p)]
        sizes = [size(b) for b in boxes]
        scores = conf[i].reshape(p, num_classes)
        picked: dict[int, list[int]] = {}
        for c in range(num_classes):
            if c == background:
                continue
            picked[c] = nms_fast(boxes, sizes, [F32(s) for s in scores[:, c]], threshold,
                                 nms_threshold, eta, top_k)
        total = sum(len(v) for v in picked.values())
        if keep_top_k > -1 and total > keep_top_k:
            pairs = sorted(((scores[j, c], c, j) for c, js in picked.items() for j in js),
                           key=lambda t: -t[0])[:keep_top_k]
            picked = {}
            for _, c, j in pairs:
                picked.setdefault(c, []).append(j)
        for c in sorted(picked):
            for j in picked[c]:
                rows.append([i, c, scores[j, c], *boxes[j]])
    if not rows:
        return np.asarray([[i] + [-1] * 6 for i in range(n)], F32)
    return np.asarray(rows, F32)
