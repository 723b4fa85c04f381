"""Layer family: the face-recognition forks' margin and center layers, each with its fork's
forward and its fork's backward (neither of the two with a custom backward is the exact
derivative of its forward, so each is a ``torch.autograd.Function`` of the fork's formulas).

- ``MarginInnerProduct`` (SphereFace, wy1iu/sphereface's caffe-sphereface): every forward
  first scales each weight row to unit length, in place (the blob itself changes, as in the
  fork), then computes x W^T; the label's entry becomes ``|x| psi_m(theta)`` (psi: the fork's
  Chebyshev forms for m = 1..4) and every entry of the row ``(top + lambda x W^T) / (1 +
  lambda)`` with ``lambda = max(base (1 + gamma iter)^-power, lambda_min)``, ``iter``
  counting forwards from ``iteration``. Backward, as the fork: the weights get top_diff^T x;
  x gets W's rows blended as the fork does, the label's part along the unit vector of its
  (w, x) coefficients. A second top holds lambda.
- ``LabelSpecificAdd`` (AM-Softmax, happynear/caffe-windows): in TRAIN, the label's score gets
  ``bias`` added where it exceeds -bias (AM-Softmax writes bias: -m); the gradient passes
  unchanged. With bias_base written the bias anneals per forward; a second top holds it.
- ``CenterLoss`` (ydwen/caffe-face): loss = sum_i |x_i - c_{y_i}|^2 / (2 M); x gets
  (x - c_y) top_diff / M; center j gets sum_{y_i = j} (c_j - x_i) / (1 + n_j), the paper's
  update, regardless of the loss weight (as the fork).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..spec.layer_params.face import (
    CenterLossParameter,
    LabelSpecificAddParameter,
    MarginInnerProductParameter,
)
from ..spec.schema import is_set
from .base import Layer, Shape, canonical_axis, count
from .loss import LabelRange, require_batch_axis
from .registry import register

_MARGINS = {"SINGLE": 1, "DOUBLE": 2, "TRIPLE": 3, "QUADRUPLE": 4}


def _sign(t: torch.Tensor) -> torch.Tensor:
    return torch.sign(t)


def margin_terms(cos: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor,
                                                      torch.Tensor]:
    """For the label entries' cos(theta): psi(theta) (the forward's factor of |x|), and the
    backward's coefficients of w and of x * (-1 / |x|), as caffe-sphereface writes them."""
    s0 = _sign(cos)
    c2, c3, c4 = cos * cos, cos ** 3, cos ** 4
    if m == 1:
        return cos, torch.ones_like(cos), torch.zeros_like(cos)
    if m == 2:
        return 2 * s0 * c2 - 1, 4 * s0 * cos, 2 * s0 * c2 + 1
    if m == 3:
        s1 = _sign(cos.abs() - 0.5)
        s2 = s0 * (1 + s1) - 2
        return s1 * (4 * c3 - 3 * cos) + s2, s1 * (12 * c2 - 3), 8 * s1 * c3 - s2
    s3 = s0 * _sign(2 * c2 - 1)
    s4 = 2 * s0 + s3 - 3
    return s3 * (8 * c4 - 8 * c2 + 1) + s4, s3 * (32 * c3 - 16 * cos), \
        s3 * (24 * c4 - 8 * c2 - 1) - s4


class _MarginProduct(torch.autograd.Function):
    """(M, K) x, (N, K) unit-row weights, labels (M,) -> (M, N), with the fork's backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, label: torch.Tensor, m: int,
                lam: float) -> torch.Tensor:
        xw = x @ weight.t()
        if m == 1:
            ctx.save_for_backward(x, weight)
            ctx.m = 1
            return xw
        norm = x.norm(dim=1)
        rows = torch.arange(x.shape[0], device=x.device)
        cos = xw[rows, label] / norm
        psi, coeff_w, coeff_x = margin_terms(cos, m)
        top = xw.clone()
        top[rows, label] = norm * psi
        top = (top + lam * xw) / (1 + lam)
        coeff_x = -coeff_x / norm
        length = torch.sqrt(coeff_w * coeff_w + coeff_x * coeff_x)
        ctx.save_for_backward(x, weight, label, coeff_w / length, coeff_x / length)
        ctx.m, ctx.lam = m, lam
        return top

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        if ctx.m == 1:
            x, weight = ctx.saved_tensors
            return grad @ weight, grad.t() @ x, None, None, None
        x, weight, label, unit_w, unit_x = ctx.saved_tensors
        lam = ctx.lam
        rows = torch.arange(x.shape[0], device=x.device)
        at_label = grad[rows, label]
        others = grad.clone()
        others[rows, label] = 0
        grad_x = (others @ weight) / (1 + lam) + (grad @ weight) * (lam / (1 + lam))
        scale = (at_label / (1 + lam)).unsqueeze(1)
        grad_x = grad_x + scale * (unit_w.unsqueeze(1) * weight[label] +
                                   unit_x.unsqueeze(1) * x)
        return grad_x, grad.t() @ x, None, None, None


@register("MarginInnerProduct")
class MarginInnerProduct(Layer):
    """SphereFace's A-Softmax inner product (module docstring): bottoms x and labels, tops
    the scores (M, num_output) and, optionally, lambda (1,)."""

    bottoms = (2, 2)
    tops = (1, 2)
    capturable = False  # lambda follows a host-side count of forwards

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        x, labels = bottom_shapes
        p: MarginInnerProductParameter = self.param()
        self.axis = canonical_axis(self, p.axis, len(x))
        rows, k = count(x, 0, self.axis), count(x, self.axis)
        if count(labels) != rows:
            raise self.bottom_error(1, f"holds {count(labels)} labels for {rows} items",
                                    "give one label per item")
        self.m, self.iteration = _MARGINS[p.type], p.iteration
        self.base, self.gamma, self.power, self.lambda_min = (
            np.float32(p.base), np.float32(p.gamma), np.float32(p.power),
            np.float32(p.lambda_min))
        self.add_blob("weight", (p.num_output, k), p.weight_filler)
        self.labels = LabelRange(self, p.num_output, None)
        out = (*x[:self.axis], p.num_output)
        return [out] + [(1,)] * (len(self.spec.top) - 1)

    def _lambda(self) -> float:
        self.iteration += 1
        lam = self.base * np.power(np.float32(1) + self.gamma * np.float32(self.iteration),
                                   -self.power, dtype=np.float32)
        return float(max(np.float32(lam), self.lambda_min))

    def forward(self, x: torch.Tensor, labels: torch.Tensor):
        lam = self._lambda()
        with torch.no_grad():  # the fork normalises the blob itself, every forward
            self.weight.div_(self.weight.norm(dim=1, keepdim=True))
        flat = x.reshape(count(x.shape, 0, self.axis), -1)
        label = labels.detach().reshape(-1).long()
        self.labels.observe(label, None)
        top = _MarginProduct.apply(flat, self.weight, label.clamp(0, self.weight.shape[0] - 1),
                                   self.m, lam)
        top = top.reshape(*x.shape[:self.axis], -1)
        if len(self.top_shapes) == 2:
            return top, torch.full((1,), lam, dtype=x.dtype, device=x.device)
        return top


@register("LabelSpecificAdd")
class LabelSpecificAdd(Layer):
    """AM-Softmax's margin (module docstring): bottoms scores (N, ...) and labels (N,); tops
    the scores and, optionally, the bias used (1,)."""

    bottoms = (2, 2)
    tops = (1, 2)
    capturable = False  # an annealed bias follows a host-side count of forwards

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        scores, labels = bottom_shapes
        require_batch_axis(self, scores)
        if count(labels) != scores[0]:
            raise self.bottom_error(1, f"holds {count(labels)} labels for {scores[0]} items",
                                    "give one label per item")
        p: LabelSpecificAddParameter = self.param()
        self.p, self.bias = p, np.float32(p.bias)
        self.anneal, self.iteration = is_set(p, "bias_base"), p.iteration
        self.labels = LabelRange(self, count(scores, 1), None)
        return [scores] + [(1,)] * (len(self.spec.top) - 1)

    def _current_bias(self) -> np.float32:
        if self.anneal:
            p = self.p
            f32 = np.float32
            bias = f32(p.bias_base) + np.power(f32(1) + f32(p.bias_gamma) * f32(self.iteration),
                                               f32(p.bias_power), dtype=np.float32) - f32(1)
            self.bias = min(max(f32(bias), f32(p.bias_min)), f32(p.bias_max))
            self.iteration += 1
        return self.bias

    def forward(self, scores: torch.Tensor, labels: torch.Tensor):
        out = scores
        if self.phase == "TRAIN":
            bias = float(self._current_bias())
            flat = scores.reshape(scores.shape[0], -1)
            label = labels.detach().reshape(-1).long()
            self.labels.observe(label, None)
            rows = torch.arange(flat.shape[0], device=flat.device)
            label = label.clamp(0, flat.shape[1] - 1)
            picked = flat[rows, label]
            shift = torch.where(picked.detach() > -bias, bias, 0.0).to(flat.dtype)
            # the gradient passes unchanged: the shift is a constant
            out = flat.index_put((rows, label), picked + shift).reshape(scores.shape)
        if len(self.top_shapes) == 2:
            return out, torch.full((1,), float(self.bias), dtype=scores.dtype,
                                   device=scores.device)
        return out


class _CenterLoss(torch.autograd.Function):
    """sum |x - c_y|^2 / (2 M) with caffe-face's gradients (module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, centers: torch.Tensor,
                label: torch.Tensor) -> torch.Tensor:
        diff = x - centers[label]
        ctx.save_for_backward(diff, label)
        ctx.classes = centers.shape[0]
        return (diff * diff).sum() / x.shape[0] / 2

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        diff, label = ctx.saved_tensors
        grad_x = diff * (grad / diff.shape[0])
        sums = torch.zeros(ctx.classes, diff.shape[1], dtype=diff.dtype, device=diff.device)
        sums.index_add_(0, label, -diff)
        counts = torch.bincount(label, minlength=ctx.classes).to(diff.dtype)
        return grad_x, sums / (counts + 1).unsqueeze(1), None


@register("CenterLoss")
class CenterLoss(Layer):
    """caffe-face's center loss (module docstring): bottoms features (M, ...) and labels
    (M,); a scalar loss."""

    bottoms = (2, 2)
    is_loss = True

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        x, labels = bottom_shapes
        require_batch_axis(self, x)
        p: CenterLossParameter = self.param()
        self.axis = canonical_axis(self, p.axis, len(x))
        if count(labels) != x[0] or any(d != 1 for d in labels[1:]):
            raise self.bottom_error(1, f"has shape {list(labels)}; expected {x[0]} labels "
                                       "(N, or N x 1 x 1 x 1)")
        self.add_blob("centers", (p.num_output, count(x, self.axis)), p.center_filler)
        self.labels = LabelRange(self, p.num_output, None)
        return [()]

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        label = labels.detach().reshape(-1).long()
        self.labels.observe(label, None)
        label = label.clamp(0, self.centers.shape[0] - 1)
        return _CenterLoss.apply(x.reshape(x.shape[0], -1), self.centers, label)
