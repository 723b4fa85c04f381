"""Layer family: SSD's MultiBoxLoss (weiliu89/caffe, multibox_loss_layer.cpp and
util/bbox_util.cpp), as the fork computes it on the CPU.

One forward: the ground truth is read (``[image, label, instance, xmin, ymin, xmax, ymax,
difficult]`` rows), each image's priors are matched to it (bipartite, then per prediction
from overlap_threshold), negatives are mined (MAX_NEGATIVE: the highest-loss unmatched priors,
neg_pos_ratio per positive; HARD_EXAMPLE: the highest combined-loss priors, sample_size of
them, optionally after NMS), and the loss is

    (loc_weight x L_loc + L_conf) / normalizer

with L_loc the SmoothL1 (or half squared) distance of the matched priors' predictions to
their encoded ground truth, L_conf the softmax (or logistic) loss of the matched priors and
the mined negatives, and the normalizer of loss_param (VALID: the number of matches). The
matching and mining are index decisions made on the host, as in the fork; the losses are
computed from the selected rows of the bottoms, so autograd gives the fork's gradients
(SmoothL1's and Caffe's softmax gradient p - onehot included).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..errors import DataError
from ..spec.schema import message_at
from . import boxes
from .base import Layer, Shape, count
from .loss import _CaffeSoftmaxLoss, normalization_mode
from .registry import register

F32 = np.float32


@dataclass
class Matches:
    """One image's matching: per loc label (-1 with share_location) the gt index of every
    prior (-1: none, -2: ignored) and its overlap; and the mined negatives."""

    indices: dict[int, np.ndarray] = field(default_factory=dict)
    overlaps: dict[int, np.ndarray] = field(default_factory=dict)
    negatives: list[int] = field(default_factory=list)


@register("MultiBoxLoss")
class MultiBoxLoss(Layer):
    """SSD's MultiBoxLoss. Bottoms: loc (N, P x L x 4), conf (N, P x C), priors (1, 2, P x 4)
    from PriorBox, ground truth (1, 1, G, 8) from AnnotatedData. Top: the loss. Gradients flow
    into loc and conf only (as propagate_down says; the fork's default is [true, true, false,
    false], and a term whose bottom does not propagate is left out of the loss)."""

    bottoms = (4, 4)
    is_loss = True
    capturable = False  # matching and mining decide on the host every forward

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        self.num_classes = p.num_classes
        self.loc_classes = 1 if p.share_location else p.num_classes
        self.mode = normalization_mode(self.param("loss_param"), "VALID")
        loc, conf, prior, label = bottom_shapes
        if len(prior) < 3 or count(prior) % 8:
            raise self.bottom_error(2, f"has shape {list(prior)}; expected PriorBox's "
                                       "(1, 2, P x 4)")
        self.num_priors = count(prior) // 8
        if count(loc, 1) != self.num_priors * self.loc_classes * 4:
            raise self.bottom_error(0, f"has {count(loc, 1)} values per image; "
                                       f"{self.num_priors} priors need "
                                       f"{self.num_priors * self.loc_classes * 4}",
                                    "check the loc predictions' num_output")
        if count(conf, 1) != self.num_priors * self.num_classes:
            raise self.bottom_error(1, f"has {count(conf, 1)} values per image; "
                                       f"{self.num_priors} priors of {self.num_classes} "
                                       f"classes need {self.num_priors * self.num_classes}",
                                    "check the conf predictions' num_output")
        if len(label) != 4 or label[3] != 8:
            raise self.bottom_error(3, f"has shape {list(label)}; expected AnnotatedData's "
                                       "label (1, 1, G, 8)")
        down = self.spec.propagate_down
        self.down = (bool(down[0]), bool(down[1])) if down else (True, True)
        if down and (down[2] or down[3]):
            raise self.fail("cannot back-propagate to the priors or the labels",
                            "set propagate_down: [true, true, false, false]")
        self.last: dict[str, Any] = {}
        """The last forward's counts (matches, negatives), for tests and logs."""
        return [()]

    # --- the host side: ground truth, matching, mining ---------------------------------------
    def ground_truth(self, gt: np.ndarray) -> dict[int, np.ndarray]:
        """GetGroundTruth: image -> (M, 8) rows (rows of image -1 skipped; difficult ones
        dropped unless use_difficult_gt)."""
        p = self.param()
        out: dict[int, list[np.ndarray]] = {}
        for row in gt:
            item = int(row[0])
            if item == -1:
                continue
            if not 0 <= int(row[1]) < self.num_classes:   # an IndexError in the loss before
                raise DataError(message_at(self.spec, f"found the label {int(row[1])} in the "
                                           f"ground truth, outside its {self.num_classes} "
                                           "classes [0, num_classes)",
                                           "check the data's labels and num_classes",
                                           named=True))
            if int(row[1]) == p.background_label_id:
                raise DataError(message_at(self.spec, "found the background label "
                                           f"{p.background_label_id} in the ground truth",
                                           "check the data's labels and background_label_id",
                                           named=True))
            if not p.use_difficult_gt and bool(row[7]):
                continue
            out.setdefault(item, []).append(row)
        return {k: np.asarray(v, F32) for k, v in out.items()}

    def find_matches(self, gts: dict[int, np.ndarray], priors: np.ndarray,
                     variances: np.ndarray, loc: np.ndarray | None, n: int) -> list[Matches]:
        """FindMatches for every image."""
        p = self.param()
        out = []
        for i in range(n):
            m = Matches()
            gt = gts.get(i)
            if gt is None:
                out.append(m)
                continue
            boxes_gt, labels = gt[:, 3:7], gt[:, 1].astype(np.int64)
            if not p.use_prior_for_matching:
                assert loc is not None
                for c in range(self.loc_classes):
                    label = -1 if p.share_location else c
                    if not p.share_location and label == p.background_label_id:
                        continue
                    decoded = boxes.decode(loc[i, :, c], priors, variances, p.code_type,
                                           p.encode_variance_in_target)
                    m.indices[label], m.overlaps[label] = boxes.match(
                        boxes_gt, labels, decoded, label, p.match_type, p.overlap_threshold,
                        p.ignore_cross_boundary_bbox)
            else:
                idx, ov = boxes.match(boxes_gt, labels, priors, -1, p.match_type,
                                      p.overlap_threshold, p.ignore_cross_boundary_bbox)
                if p.share_location:
                    m.indices[-1], m.overlaps[-1] = idx, ov
                else:
                    for c in range(self.loc_classes):
                        if c == p.background_label_id:
                            continue
                        per = np.full_like(idx, -1)
                        hit = idx > -1
                        per[hit] = np.where(labels[idx[hit]] == c, idx[hit], -1)
                        m.indices[c], m.overlaps[c] = per, ov.copy()
            out.append(m)
        return out

    def mine(self, matches: list[Matches], gts: dict[int, np.ndarray], conf: np.ndarray | None,
             loc: np.ndarray, priors: np.ndarray, variances: np.ndarray) -> int:
        """MineHardExamples: fills each image's negatives (and, HARD_EXAMPLE, unmatches the
        positives it does not pick); returns the number of matches left."""
        p = self.param()
        num_matches = sum(int((idx > -1).sum()) for m in matches for idx in m.indices.values())
        if p.mining_type == "NONE" or conf is None:
            return num_matches
        hard = p.mining_type == "HARD_EXAMPLE"
        has_nms = p.nms_param is not None
        nms_threshold = p.nms_param.nms_threshold if has_nms else 0.0
        # the fork reads nms_param.top_k's default (0) when it is not written
        top_k = (p.nms_param.top_k or 0) if has_nms else -1
        for i, m in enumerate(matches):
            conf_loss = self._conf_loss_per_prior(conf[i], m, gts.get(i))
            loss = conf_loss + (self._loc_loss_per_prior(i, m, gts, loc, priors, variances)
                                if hard else F32(0))
            selected: set[int] = set()
            for label in sorted(m.indices):
                idx, ov = m.indices[label], m.overlaps[label]
                eligible = np.ones(len(idx), bool) if hard else \
                    (idx == -1) & (ov < F32(p.neg_overlap))
                cand = np.flatnonzero(eligible)
                if hard:
                    num_sel = min(p.sample_size, len(cand))
                else:
                    num_pos = int((idx > -1).sum())
                    num_sel = min(int(F32(num_pos) * F32(p.neg_pos_ratio)), len(cand))
                if has_nms and nms_threshold > 0:
                    if p.use_prior_for_nms:
                        sel_boxes = priors[cand]
                    else:
                        sel_boxes = boxes.decode(loc[i, :, 0], priors, variances, p.code_type,
                                                 p.encode_variance_in_target)[cand]
                    kept = boxes.nms_plain(sel_boxes, loss[cand], nms_threshold, top_k)
                    selected.update(int(cand[k]) for k in kept[:num_sel])
                else:
                    order = np.argsort(-loss[cand], kind="stable")
                    selected.update(int(cand[k]) for k in order[:num_sel])
                for j in range(len(idx)):
                    if idx[j] > -1:
                        if hard and j not in selected:
                            idx[j] = -1
                            num_matches -= 1
                    elif idx[j] == -1 and j in selected:
                        m.negatives.append(j)
        return num_matches

    def _conf_loss_per_prior(self, conf: np.ndarray, m: Matches,
                             gt: np.ndarray | None) -> np.ndarray:
        """ComputeConfLoss with the matches: each prior's class loss against its matched label
        (background when unmatched)."""
        p = self.param()
        labels = np.full(self.num_priors, p.background_label_id, np.int64)
        assigned = np.zeros(self.num_priors, bool)
        for label in sorted(m.indices):
            idx = m.indices[label]
            hit = (idx > -1) & ~assigned
            if gt is not None and hit.any():
                labels[hit] = gt[idx[hit], 1].astype(np.int64)
            assigned |= hit
        if p.conf_loss_type == "SOFTMAX":
            return boxes.softmax_loss_per_row(conf, labels)
        return boxes.logistic_loss_per_row(conf, labels)

    def _loc_loss_per_prior(self, i: int, m: Matches, gts: dict[int, np.ndarray],
                            loc: np.ndarray, priors: np.ndarray,
                            variances: np.ndarray) -> np.ndarray:
        """ComputeLocLoss for HARD_EXAMPLE: each matched prior's box loss."""
        out = np.zeros(self.num_priors, F32)
        rows = self.encoded_rows([m], {0: gts[i]} if i in gts else {}, priors, variances,
                                 loc[i:i + 1])
        if not rows.image.size:
            return out
        diff = rows.pred_values - rows.target
        if self.param().loc_loss_type == "SMOOTH_L1":
            per = boxes.smooth_l1_rows(diff)
        else:
            per = (F32(0.5) * diff * diff).sum(-1, dtype=F32)
        out[rows.prior] = per
        return out

    # --- the selected rows ------------------------------------------------------------------
    def encoded_rows(self, matches: list[Matches], gts: dict[int, np.ndarray],
                     priors: np.ndarray, variances: np.ndarray, loc: np.ndarray) -> LocRows:
        """EncodeLocPrediction: the matched (image, prior, loc class) rows in the fork's order,
        their encoded ground truth, the predicted values and which of them are replaced by the
        target (bp_inside)."""
        p = self.param()
        image, prior, cls, gt_rows = [], [], [], []
        for i, m in enumerate(matches):
            for label in sorted(m.indices):
                idx = m.indices[label]
                for j in np.flatnonzero(idx > -1):
                    image.append(i)
                    prior.append(int(j))
                    cls.append(0 if p.share_location else label)
                    gt_rows.append(gts[i][idx[j], 3:7])
        rows = LocRows(np.asarray(image, np.int64), np.asarray(prior, np.int64),
                       np.asarray(cls, np.int64))
        if not image:
            return rows
        gt_boxes = np.asarray(gt_rows, F32)
        target = boxes.encode(gt_boxes, priors[rows.prior], variances[rows.prior], p.code_type,
                              p.encode_variance_in_target)
        pred = loc[rows.image, rows.prior, rows.cls].astype(F32)
        replace = np.zeros_like(pred, dtype=bool)
        raw_target = target
        if p.bp_inside:
            inside_of = priors[rows.prior]
            if not p.use_prior_for_matching:
                inside_of = boxes.decode(pred, priors[rows.prior], variances[rows.prior],
                                         p.code_type, p.encode_variance_in_target)
            replace = (inside_of < 0) | (inside_of > 1)
            pred = np.where(replace, target, pred)
        scale = np.ones_like(target)
        if p.encode_variance_in_target:
            scale = variances[rows.prior].astype(F32)
            target = (target / scale).astype(F32)
            pred = (pred / scale).astype(F32)
        rows.target, rows.raw_target, rows.pred_values = target, raw_target, pred
        rows.replace, rows.scale = replace, scale
        return rows

    def conf_rows(self, matches: list[Matches], gts: dict[int, np.ndarray]
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """EncodeConfPrediction with mining: (image, prior, label, is negative) of the matched
        priors then the negatives, image by image."""
        p = self.param()
        image: list[int] = []
        prior: list[int] = []
        label: list[int] = []
        negative: list[bool] = []
        for i, m in enumerate(matches):
            if i not in gts:
                continue
            for lab in sorted(m.indices):
                idx = m.indices[lab]
                for matched in np.flatnonzero(idx > -1):
                    image.append(i)
                    prior.append(int(matched))
                    label.append(p.background_label_id + 1 if p.map_object_to_agnostic
                                 else int(gts[i][idx[matched], 1]))
                    negative.append(False)
            for negative_prior in m.negatives:
                image.append(i)
                prior.append(int(negative_prior))
                label.append(p.background_label_id)
                negative.append(True)
        return (np.asarray(image, np.int64), np.asarray(prior, np.int64),
                np.asarray(label, np.int64), np.asarray(negative, bool))

    # --- forward ------------------------------------------------------------------------------
    def forward(self, loc: torch.Tensor, conf: torch.Tensor, prior: torch.Tensor,
                label: torch.Tensor) -> torch.Tensor:
        p = self.param()
        n = loc.shape[0]
        loc4 = loc.reshape(n, self.num_priors, self.loc_classes, 4)
        conf3 = conf.reshape(n, self.num_priors, self.num_classes)
        pv = boxes.as_numpy(prior).reshape(2, -1, 4)
        priors, variances = pv[0], pv[1]
        gts = self.ground_truth(boxes.as_numpy(label).reshape(-1, 8))
        needs_loc = (not p.use_prior_for_matching or p.mining_type == "HARD_EXAMPLE" or
                     (p.nms_param is not None and not p.use_prior_for_nms) or p.bp_inside)
        loc_host = boxes.as_numpy(loc4) if needs_loc else np.zeros((n, self.num_priors,
                                                                    self.loc_classes, 4), F32)
        matches = self.find_matches(gts, priors, variances, loc_host, n)
        conf_host = boxes.as_numpy(conf3) if p.mining_type != "NONE" else None
        num_matches = self.mine(matches, gts, conf_host, loc_host, priors, variances)
        normalizer = float(self._normalizer(n, num_matches))
        total = loc.new_zeros(())
        if self.down[0] and num_matches >= 1:
            total = total + p.loc_weight * self._loc_loss(loc4, matches, gts, priors,
                                                          variances, loc_host) / normalizer
        if self.down[1]:
            total = total + self._conf_loss(conf3, matches, gts) / normalizer
        negatives = sum(len(m.negatives) for m in matches)
        self.last = {"matches": num_matches, "negatives": negatives, "normalizer": normalizer}
        return total

    def _normalizer(self, n: int, num_matches: int) -> float:
        if self.mode == "VALID":
            value = num_matches
        else:
            value = {"FULL": n * self.num_priors, "BATCH_SIZE": n, "NONE": 1}[self.mode]
        return max(1.0, float(F32(value)))

    def _loc_loss(self, loc4: torch.Tensor, matches: list[Matches], gts: dict[int, np.ndarray],
                  priors: np.ndarray, variances: np.ndarray,
                  loc_host: np.ndarray) -> torch.Tensor:
        rows = self.encoded_rows(matches, gts, priors, variances, loc_host)
        dev = loc4.device
        pred = loc4[torch.from_numpy(rows.image).to(dev), torch.from_numpy(rows.prior).to(dev),
                    torch.from_numpy(rows.cls).to(dev)]
        target = torch.from_numpy(rows.target).to(dev, pred.dtype)
        if rows.replace.any():  # bp_inside: the target itself, so no gradient there
            raw_target = torch.from_numpy(rows.raw_target).to(dev, pred.dtype)
            pred = torch.where(torch.from_numpy(rows.replace).to(dev), raw_target, pred)
        if self.param().encode_variance_in_target:
            # the fork divides the copied predictions by the variances and copies their
            # gradient straight back: the value is divided, the gradient is not
            scaled = pred.detach() / torch.from_numpy(rows.scale).to(dev, pred.dtype)
            pred = pred + (scaled - pred.detach())
        diff = pred - target
        if self.param().loc_loss_type == "SMOOTH_L1":
            a = diff.abs()
            return torch.where(a < 1, 0.5 * diff * diff, a - 0.5).sum()
        return (diff * diff).sum() / 2  # EuclideanLoss over one "image" of num_matches x 4

    def _conf_loss(self, conf3: torch.Tensor, matches: list[Matches],
                   gts: dict[int, np.ndarray]) -> torch.Tensor:
        p = self.param()
        dev = conf3.device
        c = self.num_classes
        if p.mining_type != "NONE":
            image, prior, label, negative = self.conf_rows(matches, gts)
            if len(image) == 0:
                return conf3.new_zeros(())
            scores = conf3[torch.from_numpy(image).to(dev), torch.from_numpy(prior).to(dev)]
            if p.conf_loss_type == "SOFTMAX":
                target = torch.from_numpy(label).to(dev)
                return _CaffeSoftmaxLoss.apply(scores, target, 1.0, None)[0]
            # the fork fills the targets with the background id, then writes the ones
            target_np = np.full((len(image), c), float(p.background_label_id), F32)
            positive = np.flatnonzero(~negative)
            target_np[positive, label[positive]] = 1.0
            if 0 <= p.background_label_id < c:
                target_np[negative, p.background_label_id] = 1.0
            return _sigmoid_ce(scores, torch.from_numpy(target_np).to(dev, scores.dtype))
        # no mining: every prior, background unless matched
        n = conf3.shape[0]
        if p.conf_loss_type == "SOFTMAX":
            target_np = np.full((n, self.num_priors), p.background_label_id, np.int64)
            for i, m in enumerate(matches):
                if i not in gts:
                    continue
                for lab in sorted(m.indices):
                    idx = m.indices[lab]
                    hit = np.flatnonzero(idx > -1)
                    target_np[i, hit] = (p.background_label_id + 1 if p.map_object_to_agnostic
                                         else gts[i][idx[hit], 1].astype(np.int64))
            target = torch.from_numpy(target_np.reshape(-1)).to(dev)
            return _CaffeSoftmaxLoss.apply(conf3.reshape(-1, c), target, 1.0, None)[0]
        # LOGISTIC without mining: the fork steps its target pointer by num_priors per image
        # (not num_priors x num_classes), so image i's ones land at i x P + j x C + label
        flat = np.full(n * self.num_priors * c, float(p.background_label_id), F32)
        for i, m in enumerate(matches):
            if i not in gts:
                continue
            for lab in sorted(m.indices):
                idx = m.indices[lab]
                for j in np.flatnonzero(idx > -1):
                    gl = (p.background_label_id + 1 if p.map_object_to_agnostic
                          else int(gts[i][idx[j], 1]))
                    flat[i * self.num_priors + j * c + gl] = 1.0
        target = torch.from_numpy(flat.reshape(n * self.num_priors, c)).to(dev, conf3.dtype)
        return _sigmoid_ce(conf3.reshape(-1, c), target)


@dataclass
class LocRows:
    """The matched rows of a loss: image, prior and loc class per row, and (once encoded) the
    target, the predicted values, where bp_inside puts the target instead, and the variances
    divided out (encode_variance_in_target)."""

    image: np.ndarray
    prior: np.ndarray
    cls: np.ndarray
    target: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), F32))
    raw_target: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), F32))
    pred_values: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), F32))
    replace: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), bool))
    scale: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), F32))


def _sigmoid_ce(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """SigmoidCrossEntropyLoss summed (its normalizer is the outer count, 1 here): the stable
    form x (t - [x >= 0]) - log(1 + exp(x - 2 x [x >= 0])), gradient sigmoid(x) - t."""
    return _SigmoidSum.apply(x, target)


class _SigmoidSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        pos = (x >= 0).to(x.dtype)
        loss = -(x * (target - pos) - torch.log1p(torch.exp(x - 2 * x * pos))).sum()
        ctx.save_for_backward(x, target)
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        x, target = ctx.saved_tensors
        return (torch.sigmoid(x) - target) * grad, None
