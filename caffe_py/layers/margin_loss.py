"""Layer family: margin losses (ContrastiveLoss, HingeLoss), as Caffe 1.0 computes them
(contrastive_loss_layer.cpp, hinge_loss_layer.cpp). Labels and similarity flags are
truncated to integers, as Caffe's static_cast<int>, and get no gradient."""
from __future__ import annotations

import torch

from .base import Layer, Shape, count
from .loss import LabelRange, require_batch_axis
from .registry import register


class _ContrastiveFunction(torch.autograd.Function):
    """Caffe's contrastive loss and its backward, whose dissimilar-pair gradient divides by
    (d + 1e-4) rather than d (so that d = 0 stays finite)."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, similar: torch.Tensor, margin: float,
                legacy: bool) -> torch.Tensor:
        diff = a - b  # (N, C)
        dist_sq = (diff * diff).sum(1)  # (N,)
        if legacy:
            dissimilar = torch.clamp(margin - dist_sq, min=0)
        else:
            dissimilar = torch.clamp(margin - dist_sq.sqrt(), min=0).square()
        loss = torch.where(similar, dist_sq, dissimilar).sum() / a.shape[0] / 2
        ctx.save_for_backward(diff, dist_sq, similar)
        ctx.margin, ctx.legacy = margin, legacy
        return loss

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        diff, dist_sq, similar = ctx.saved_tensors
        alpha = grad / diff.shape[0]
        if ctx.legacy:
            mdist = ctx.margin - dist_sq
            beta = -alpha.expand_as(dist_sq)
        else:
            dist = dist_sq.sqrt()
            mdist = ctx.margin - dist
            beta = -alpha * mdist / (dist + 1e-4)
        coeff = torch.where(similar, alpha.expand_as(dist_sq),
                            torch.where(mdist > 0, beta, torch.zeros_like(beta)))
        grad_a = coeff.unsqueeze(1) * diff
        return grad_a, -grad_a, None, None, None


@register("ContrastiveLoss")
class ContrastiveLoss(Layer):
    """(1/2N) sum_n [d_n^2 if y_n else max(margin - d_n, 0)^2], d_n = ||a_n - b_n||, or with
    ``legacy_version`` max(margin - d_n^2, 0) for dissimilar pairs. Bottoms: a and b (N x C,
    or N x C x 1 x 1) and the similarity y (N values; non-zero means similar)."""

    bottoms = (3, 3)
    is_loss = True

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        a, b, y = bottom_shapes
        require_batch_axis(self, a)
        for index, shape in ((0, a), (1, b)):
            if len(shape) < 2 or len(shape) > 4 or any(d != 1 for d in shape[2:]):
                raise self.bottom_error(index, f"has shape {list(shape)}; expected N x C (or "
                                               "N x C x 1 x 1)")
        if b[:2] != a[:2]:
            raise self.bottom_error(1, f"has shape {list(b)} but bottom "
                                       f"'{self.spec.bottom[0]}' has {list(a)}",
                                    "both features need the same N and C")
        if not y or y[0] != a[0] or count(y) != a[0]:
            raise self.bottom_error(2, f"has shape {list(y)}; expected one similarity flag per "
                                       f"pair (N = {a[0]})")
        p = self.param()
        self.margin, self.legacy = p.margin, p.legacy_version
        return [()]

    def forward(self, a: torch.Tensor, b: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        similar = y.detach().reshape(-1).long() != 0
        return _ContrastiveFunction.apply(a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1),
                                          similar, self.margin, self.legacy)


@register("HingeLoss")
class HingeLoss(Layer):
    """(1/N) sum over items and classes of max(0, 1 - s_label) at the label and
    max(0, 1 + s_j) elsewhere (L1), or of their squares (L2); each item's scores are its
    values flattened, labels are N class indices."""

    bottoms = (2, 2)
    is_loss = True

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        scores, labels = bottom_shapes
        require_batch_axis(self, scores)
        if not labels or labels[0] != scores[0] or count(labels) != scores[0]:
            raise self.bottom_error(1, f"has shape {list(labels)}; expected one label per item "
                                       f"(N = {scores[0]})")
        self.classes = count(scores, 1)
        self.squared = self.param().norm == "L2"
        self.labels = LabelRange(self, self.classes, None)
        return [()]

    def forward(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        flat = scores.reshape(scores.shape[0], -1)  # (N, dim)
        lab = labels.detach().reshape(-1, 1).long()
        self.labels.observe(lab, None)
        sign = torch.ones_like(flat).scatter_(1, lab.clamp(0, self.classes - 1), -1.0)
        hinge = torch.relu(1 + flat * sign)
        total = (hinge * hinge).sum() if self.squared else hinge.sum()
        return total / scores.shape[0]
