"""Layer family: losses and Accuracy, as Caffe 1.0 computes them (the margin losses are in
margin_loss.py).

Normalization (LossParameter): the summed loss is divided by max(1, n) where n is the count of
positions whose label is not ``ignore_label`` (VALID), all positions (FULL), the outer count
(BATCH_SIZE) or 1 (NONE). ``normalize: true|false`` is the legacy spelling of VALID|BATCH_SIZE
and is used only when ``normalization`` is not written. SoftmaxWithLoss defaults to VALID;
SigmoidCrossEntropyLoss defaults to BATCH_SIZE, as Caffe 1.0 keeps its old behaviour there
(sigmoid_cross_entropy_loss_layer.cpp: "normalization_ = BATCH_SIZE" when neither is set).

Labels are class indices stored in any dtype (Data layers give floats); like Caffe they are
truncated to integers. A label outside [0, C) that is not ignored is a DataError: raised at once
on the CPU; on a GPU the running minimum and maximum of the labels are kept on the device (no
host sync, so also inside a CUDA graph) and the solver reports a bad one within a few
iterations (:class:`LabelRange`). Out-of-range labels are clamped, so a kernel never reads out
of bounds. ``options['check_labels'] = False`` turns the check off.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DataError
from ..io.formats.blobproto import read_blob_file
from ..kernels import build, functions
from ..spec.layer_params.loss import AccuracyParameter, LossParameter
from ..spec.schema import is_set, message_at
from .base import DeviceCheck, Layer, Shape, canonical_axis, count
from .registry import register

# Caffe clamps the probability at FLT_MIN before the log: the loss of one position is at most
# -log(FLT_MIN) ~ 87.34.
_MAX_NLL = -math.log(float(np.finfo(np.float32).tiny))


def normalization_mode(p: LossParameter, default: str) -> str:
    """The normalization Caffe uses: ``normalization`` if written, else legacy ``normalize``."""
    if is_set(p, "normalization"):
        return p.normalization
    if p.normalize is not None:
        return "VALID" if p.normalize else "BATCH_SIZE"
    return default


def normalizer(mode: str, outer: int, inner: int, valid: torch.Tensor | None,
               pre_fixed: float = 1.0) -> torch.Tensor | float:
    """max(1, n) for the mode; VALID counts ``valid`` (all positions when nothing is ignored);
    PRE_FIXED (R-FCN's fork) is ``pre_fixed``, loss_param.pre_fixed_normalizer."""
    if mode == "VALID" and valid is not None:
        return valid.sum().clamp(min=1)
    n = {"FULL": outer * inner, "VALID": outer * inner, "BATCH_SIZE": outer, "NONE": 1,
         "PRE_FIXED": pre_fixed}[mode]
    return float(max(1, n))


class LabelRange:
    """The labels a loss or Accuracy layer sees, checked against [0, classes).

    On the CPU, reading them costs nothing: :meth:`observe` raises at once. On a GPU it keeps
    [min, max] of the non-ignored labels on the device (three small kernels, no host sync) in a
    :class:`~caffe_py.layers.base.DeviceCheck` that the solver reads every few iterations.
    """

    def __init__(self, layer: Layer, classes: int, param_key: str | None):
        """``param_key``: the block whose ignore_label the fix names (None: the layer has
        none)."""
        self.layer, self.classes, self.param_key = layer, classes, param_key
        self.enabled = layer.ctx.options.get("check_labels", True)
        self.seen: torch.Tensor | None = None
        if self.enabled and layer.ctx.device.type == "cuda":
            big = torch.iinfo(torch.int64).max
            self.seen = torch.tensor([big, -big], dtype=torch.int64, device=layer.ctx.device)
            layer.device_checks.append(DeviceCheck(self.seen, self.problem))

    def observe(self, labels: torch.Tensor, valid: torch.Tensor | None) -> None:
        """Check (CPU) or record (GPU) integer ``labels``; ``valid`` masks ignored ones."""
        if not self.enabled:
            return
        if self.seen is None or not labels.is_cuda:
            bad = (labels < 0) | (labels >= self.classes)
            if valid is not None:
                bad &= valid
            if bool(bad.any()):
                raise DataError(self.message(int(labels[bad].flatten()[0])))
            return
        kept = labels if valid is None else torch.where(valid, labels, 0)  # 0 is in range
        lo, hi = torch.aminmax(kept)
        self.seen[0].clamp_(max=lo)
        self.seen[1].clamp_(min=hi)

    def problem(self, seen: torch.Tensor) -> str | None:
        lo, hi = (int(v) for v in seen.tolist())
        value = lo if lo < 0 else hi if hi >= self.classes else None
        return None if value is None else self.message(value)

    def message(self, value: int) -> str:
        return message_at(
            self.layer.spec, f"label {value} is outside [0, {self.classes}) ({self.classes} "
                             "classes)",
            f"check the data's labels, or set {self.param_key}.ignore_label: {value} to skip "
            "them" if self.param_key else "check the data's labels", named=True)


def require_batch_axis(layer: Layer, shape: Shape) -> None:
    if len(shape) == 0:
        raise layer.bottom_error(0, "is a scalar; a loss needs a batch axis")


def label_count_error(layer: Layer, bottom_shapes: list[Shape], axis: int) -> Exception:
    scores, labels = bottom_shapes
    want = list(scores[:axis]) + list(scores[axis + 1:])
    return layer.bottom_error(
        1, f"has shape {list(labels)} ({count(labels)} labels) but bottom "
           f"'{layer.spec.bottom[0]}' of shape {list(scores)} needs {count(want)}, one per "
           f"position outside the class axis {axis}", f"give the labels the shape {want}")


def split_class_axis(layer: Layer, bottom_shapes: list[Shape], axis: int) -> tuple[int, int]:
    """Canonical class axis of bottom 0, checking one label per position outside it."""
    scores, labels = bottom_shapes
    axis = canonical_axis(layer, axis, len(scores))
    if count(scores, 0, axis) * count(scores, axis + 1) != count(labels):
        raise label_count_error(layer, bottom_shapes, axis)
    return axis, scores[axis]


def as_positions(scores: torch.Tensor, labels: torch.Tensor,
                 axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """scores (outer, C, inner) and integer labels (outer, 1, inner) from the live tensors."""
    outer = math.prod(scores.shape[:axis])
    scores = scores.reshape(outer, scores.shape[axis], -1)
    return scores, labels.reshape(outer, 1, scores.shape[2]).long()


@register("SoftmaxWithLoss")
class SoftmaxWithLoss(Layer):
    """Multinomial logistic loss of the softmax over ``axis``: -log(max(p_label, FLT_MIN)).

    Bottoms: scores (... x C x ...) and labels (one per position outside the class axis, e.g.
    N or N x H x W for N x C x H x W scores). Tops: the loss (a scalar) and, optionally, the
    probabilities, which pass no gradient back (Caffe's backward reads the loss top alone).
    The gradient is Caffe's (p - onehot) / normalizer, also where the FLT_MIN clamp is
    active.
    """

    bottoms = (2, 2)
    tops = (1, 2)
    is_loss = True

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p: LossParameter = self.param("loss_param")
        self.axis, self.classes = split_class_axis(
            self, bottom_shapes, self.param("softmax_param").axis)
        self.ignore_label = p.ignore_label
        self.mode = normalization_mode(p, "VALID")
        self.pre_fixed = p.pre_fixed_normalizer
        self.labels = LabelRange(self, self.classes, "loss_param")
        # decided here, not in a forward: torch.compile would break its graph on the build
        self._weights: torch.Tensor | None = None
        if p.weight_by_label_freqs:  # SegNet's fork
            if len(p.class_weighting) != self.classes:
                raise self.fail(f"loss_param.class_weighting has {len(p.class_weighting)} "
                                f"values for {self.classes} classes (weight_by_label_freqs)",
                                "give one weight per class")
            self._weights = torch.tensor(p.class_weighting, device=self.ctx.device)
        self._fused = bool(self.ctx.device.type == "cuda" and self._weights is None
                           and self.ctx.options.get("fused_loss", True) and build.available())
        self._count_valid = self.mode == "VALID" and self.ignore_label is not None
        self._held: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, float]] = {}
        return [()] + [bottom_shapes[0]] * (len(self.spec.top) - 1)

    def fused(self, scores: torch.Tensor) -> bool:
        """Whether this forward takes the fused CUDA kernels (:meth:`_fused_forward`): a CUDA
        net whose kernels build, one position per item (scores N x C), and not turned off
        by the net option ``fused_loss: false``. Under torch.compile the PyTorch path is
        traced instead (the compiler fuses it; an extension call would break its graph)."""
        return (self._fused and scores.dim() == self.axis + 1 == 2 and scores.is_cuda
                and not torch.compiler.is_compiling())

    def forward(self, scores: torch.Tensor, labels: torch.Tensor):
        if self.fused(scores):
            return self._fused_forward(scores, labels)
        scores3, lab = as_positions(scores, labels.detach(), self.axis)
        valid = None if self.ignore_label is None else lab != self.ignore_label
        self.labels.observe(lab, valid)
        target = lab.clamp(0, self.classes - 1).squeeze(1)   # (outer, inner)
        if valid is not None:
            target = torch.where(valid.squeeze(1), target, -1)   # nll_loss's ignore_index
        if scores3.shape[2] == 1:   # (outer, C): the plain kernels
            scores3, target = scores3.squeeze(2), target.squeeze(1)
        norm = normalizer(self.mode, lab.shape[0], lab.shape[2], valid, self.pre_fixed)
        every = None if valid is not None else lab.shape[0] * lab.shape[2]
        weight = (None if self._weights is None else
                  self._weights.to(scores3.dtype)[target.clamp(min=0)])
        loss, logp = _CaffeSoftmaxLoss.apply(scores3, target, norm, every, weight)
        if len(self.top_shapes) == 2:  # Caffe's backward reads only the loss top's diff
            return loss, logp.detach().exp().reshape(scores.shape)
        return loss

    def _fused_forward(self, scores: torch.Tensor, labels: torch.Tensor):
        """Scores (N, C) on CUDA: the loss, the label check and the probabilities in one
        kernel, the gradient in one (kernels.functions.softmax_loss); the same numbers as
        :class:`_CaffeSoftmaxLoss` (tests/kernels/test_softmax_loss_gpu.py)."""
        x = scores if scores.dtype == torch.float32 else scores.float()
        label = labels if labels.dim() == 1 else labels.reshape(-1)
        if label.dtype != torch.int64:
            label = label.long()
        if label.requires_grad:  # labels pass no gradient (Caffe's backward skips them)
            label = label.detach()
        work, done, divisor = self._workspace(x)
        # labels.seen: the device check's [min, max] (None when the check is off)
        loss, prob = functions.softmax_loss(x.contiguous(), label.contiguous(),
                                            self.labels.seen, work, done, self.ignore_label,
                                            divisor, self._count_valid)
        if len(self.top_shapes) == 2:
            return loss, prob.reshape(scores.shape)
        return loss

    def _workspace(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """For scores ``x`` (N, C) on a GPU: the fused forward's per-row sums (2N floats), its
        block counter (kept at zero by the kernel) and the host divisor, made once per batch
        size and device (a launch-bound step pays for every call made per forward)."""
        key = (x.shape[0], x.get_device())
        held = self._held.get(key)
        if held is None:
            n, device = x.shape[0], x.device
            divisor = 1.0 if self._count_valid else float(
                normalizer(self.mode, n, 1, None, self.pre_fixed))
            held = self._held[key] = (torch.empty(2 * n, device=device),
                                      torch.zeros(1, dtype=torch.int32, device=device),
                                      divisor)
        return held


class _CaffeSoftmaxLoss(torch.autograd.Function):
    """sum(min(-log p_target, -log FLT_MIN)) / norm over (outer, C[, inner]) scores, with
    Caffe's gradient (p - onehot) * (top diff / norm), also where the floor holds, computed in
    Caffe's order (its printed losses match digit for digit); target -1 is ignored (no loss,
    no gradient). Three kernels forward and three or four backward where ``norm`` is 1 or
    ``every`` (the count of every position when none is ignored): a launch-bound eager step
    pays for each one."""

    @staticmethod
    def forward(ctx: Any, scores: torch.Tensor, target: torch.Tensor,
                norm: torch.Tensor | float, every: int | None,
                weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        logp = F.log_softmax(scores, dim=1)
        nll = F.nll_loss(logp, target, reduction="none", ignore_index=-1).clamp_(max=_MAX_NLL)
        if weight is not None:  # SegNet's class weighting: each position times its class's
            nll = nll * weight
        loss = nll.mean() if isinstance(norm, float) and norm == every else nll.sum() / norm
        ctx.weight = weight
        ctx.save_for_backward(logp, target)
        ctx.norm, ctx.ignores = norm, every is None
        ctx.mark_non_differentiable(logp)
        ctx.set_materialize_grads(False)   # no zeros for logp's unused gradient
        return loss, logp

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None,
                 _unused: Any) -> tuple[Any, None, None, None, None]:
        if grad is None:
            return None, None, None, None, None
        logp, target = ctx.saved_tensors
        dx = logp.exp()
        if not ctx.ignores:
            dx.scatter_(1, target.unsqueeze(1), -1.0, reduce="add")
        else:
            index = target.clamp(min=0).unsqueeze(1)
            kept = (target >= 0).unsqueeze(1).to(dx.dtype)
            dx.scatter_add_(1, index, -kept)
            dx.mul_(kept)
        if ctx.weight is not None:
            dx.mul_(ctx.weight.unsqueeze(1))
        scale = grad if isinstance(ctx.norm, float) and ctx.norm == 1.0 else grad / ctx.norm
        return dx.mul_(scale), None, None, None, None


@register("EuclideanLoss")
class EuclideanLoss(Layer):
    """sum((a - b)^2) / (2 N), N = bottom 0's first axis; both bottoms get gradients.

    ``loss_param`` is accepted (Caffe lets any layer carry one) but this loss, like Caffe's,
    does not normalise by it.
    """

    bottoms = (2, 2)
    is_loss = True

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        a, b = bottom_shapes
        require_batch_axis(self, a)
        if not b or a[0] != b[0] or count(a, 1) != count(b, 1):
            raise self.bottom_error(
                1, f"has shape {list(b)} but bottom '{self.spec.bottom[0]}' has shape "
                   f"{list(a)}", "both bottoms need the same first axis and count per item")
        return [()]

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(a, b.reshape(a.shape), reduction="sum") / (2 * a.shape[0])


@register("SigmoidCrossEntropyLoss")
class SigmoidCrossEntropyLoss(Layer):
    """Cross-entropy of sigmoid(x) against targets in [0, 1], in the stable form
    max(x, 0) - x t + log(1 + exp(-|x|)); targets equal to ``ignore_label`` add nothing.
    Normalization defaults to BATCH_SIZE (Caffe 1.0); the targets get no gradient."""

    bottoms = (2, 2)
    is_loss = True

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        x, t = bottom_shapes
        require_batch_axis(self, x)
        if count(x) != count(t):
            raise self.bottom_error(
                1, f"has shape {list(t)} ({count(t)} targets) but bottom "
                   f"'{self.spec.bottom[0]}' has shape {list(x)} ({count(x)} values)",
                "give one target per input value")
        p: LossParameter = self.param()
        self.ignore_label = p.ignore_label
        self.mode = normalization_mode(p, "BATCH_SIZE")
        self.pre_fixed = p.pre_fixed_normalizer
        return [()]

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        target = target.detach().reshape(x.shape).to(x.dtype)
        outer, inner = x.shape[0], x[0].numel()
        if self.ignore_label is None:
            total = F.binary_cross_entropy_with_logits(x, target, reduction="sum")
            return total / normalizer(self.mode, outer, inner, None, self.pre_fixed)
        valid = target.long() != self.ignore_label  # Caffe compares int(target)
        per_value = F.binary_cross_entropy_with_logits(x, target * valid, reduction="none")
        return (per_value * valid).sum() / normalizer(self.mode, outer, inner, valid,
                                                      self.pre_fixed)


@register("Accuracy")
class Accuracy(Layer):
    """Fraction of non-ignored positions whose label ranks in the top k; optional second top:
    the accuracy per class (C; 0 for a class with no positions).

    As in Caffe 1.0 (accuracy_layer.cpp), every other class whose score is at least the
    label's counts as better, so a tie goes against the label; the position is a hit when
    fewer than k classes are better. No gradient flows.
    """

    bottoms = (2, 2)
    tops = (1, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p: AccuracyParameter = self.param()
        self.axis, self.classes = split_class_axis(self, bottom_shapes, p.axis)
        if p.top_k > self.classes:
            raise self.fail(f"top_k {p.top_k} exceeds the {self.classes} classes of bottom "
                            f"'{self.spec.bottom[0]}'",
                            f"use accuracy_param.top_k <= {self.classes}")
        self.top_k = p.top_k
        self.ignore_label = p.ignore_label
        self.labels = LabelRange(self, self.classes, "accuracy_param")
        return [()] + [(self.classes,)] * (len(self.spec.top) - 1)

    @torch.no_grad()
    def forward(self, scores: torch.Tensor, labels: torch.Tensor):
        s3, lab = as_positions(scores, labels, self.axis)  # (outer, C, inner), (outer, 1, inner)
        valid = (torch.ones_like(lab, dtype=torch.bool) if self.ignore_label is None
                 else lab != self.ignore_label)
        self.labels.observe(lab, None if self.ignore_label is None else valid)
        lab = lab.clamp(0, self.classes - 1)
        label_score = s3.gather(1, lab)
        better = (s3 >= label_score).sum(dim=1, keepdim=True) - 1  # the label itself is >=
        hit = (better < self.top_k) & valid
        n = valid.sum()
        accuracy = (hit.sum() / n.clamp(min=1)).to(scores.dtype)
        if len(self.top_shapes) == 1:
            return accuracy
        per_class_n = torch.zeros(self.classes, dtype=scores.dtype, device=scores.device)
        per_class_n.index_add_(0, lab.flatten(), valid.flatten().to(scores.dtype))
        per_class_hit = torch.zeros_like(per_class_n)
        per_class_hit.index_add_(0, lab.flatten(), hit.flatten().to(scores.dtype))
        return accuracy, per_class_hit / per_class_n.clamp(min=1)


# Caffe's kLOG_THRESHOLD (loss_layer.hpp): probabilities are floored here before the log.
LOG_THRESHOLD = float(np.float32(1e-20))


@register("MultinomialLogisticLoss")
class MultinomialLogisticLoss(Layer):
    """-(1/N) sum_n log(max(p[n, label_n], 1e-20)) over probabilities p (N x ..., each item's
    values flattened). Caffe's gradient -1 / (N max(p, 1e-20)) at the label holds below the
    floor too; the labels get none."""

    bottoms = (2, 2)
    is_loss = True

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        probs, labels = bottom_shapes
        require_batch_axis(self, probs)
        if not labels or labels[0] != probs[0] or count(labels) != probs[0]:
            raise self.bottom_error(1, f"has shape {list(labels)} but bottom "
                                       f"'{self.spec.bottom[0]}' {list(probs)} needs one label "
                                       f"per item: N x 1 x 1 x 1 with N = {probs[0]}")
        self.classes = count(probs, 1)
        self.labels = LabelRange(self, self.classes, None)
        return [()]

    def forward(self, probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        flat = probs.reshape(probs.shape[0], -1)  # (N, dim)
        lab = labels.detach().reshape(-1, 1).long()
        self.labels.observe(lab, None)
        p = flat.gather(1, lab.clamp(0, self.classes - 1))
        floored = p + (p.clamp(min=LOG_THRESHOLD) - p).detach()  # the floor's value, p's path
        return -torch.log(floored).sum() / probs.shape[0]


@register("InfogainLoss")
class InfogainLoss(Layer):
    """-sum_l H[label, l] log(max(p_l, 1e-20)) per position, p the softmax over ``axis``,
    normalised as loss_param says (VALID by default; ``normalize`` is refused, as Caffe does).
    H (C x C) comes from infogain_loss_param.source (a .binaryproto) or a third bottom, which
    gets no gradient. Caffe's gradient p sum_l H[label, l] - H[label, :] also holds below the
    floor. Optional second top: the probabilities, which pass no gradient back (Caffe's
    backward reads the loss top alone)."""

    bottoms = (2, 3)
    tops = (1, 2)
    is_loss = True

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p, loss = self.param(), self.param("loss_param")
        self.axis, self.classes = split_class_axis(self, bottom_shapes[:2], p.axis)
        if loss.normalize is not None:
            raise self.fail("loss_param.normalize is deprecated and InfogainLoss refuses it "
                            "(as Caffe)", "use loss_param.normalization")
        self.ignore_label = loss.ignore_label
        self.mode = normalization_mode(loss, "VALID")
        self.pre_fixed = loss.pre_fixed_normalizer
        c2 = self.classes * self.classes
        if len(bottom_shapes) == 3:
            if count(bottom_shapes[2]) != c2:
                raise self.bottom_error(2, f"(the infogain matrix) has shape "
                                           f"{list(bottom_shapes[2])}; it must hold "
                                           f"{self.classes} x {self.classes} values")
            self.infogain = None
        else:
            matrix = self._read_matrix(p.source, c2).to(self.ctx.device)
            self.register_buffer("infogain", matrix, persistent=False)
        self.labels = LabelRange(self, self.classes, "loss_param")
        # decided here, not in a forward: torch.compile would break its graph on the build
        self._fused = bool(self.ctx.device.type == "cuda"
                           and self.ctx.options.get("fused_loss", True) and build.available())
        self._count_valid = self.mode == "VALID" and self.ignore_label is not None
        self._held: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, float]] = {}
        return [()] + [bottom_shapes[0]] * (len(self.spec.top) - 1)

    def _read_matrix(self, source: str, c2: int) -> torch.Tensor:
        if not source:
            raise self.fail("infogain_loss_param.source is not set and there is no third "
                            "bottom", "name the .binaryproto of the C x C matrix H, or give "
                                      "H as a third bottom")
        try:
            values = read_blob_file(source).array()
        except DataError as exc:
            raise self.fail(f"infogain_loss_param.source: {exc}") from None
        if values.size != c2:
            raise self.fail(f"infogain_loss_param.source {source} holds {values.size} values "
                            f"(shape {list(values.shape)}); {self.classes} classes need "
                            f"{self.classes} x {self.classes}")
        return torch.from_numpy(values.reshape(self.classes, self.classes).copy())

    def forward(self, scores: torch.Tensor, labels: torch.Tensor,
                matrix: torch.Tensor | None = None):
        source = matrix.detach() if matrix is not None else self.infogain
        if source is None:  # setup loads the file when there is no third bottom
            raise self.fail("has no infogain matrix", "give infogain_loss_param.source or a "
                            "third bottom")
        h = source.reshape(self.classes, self.classes).to(scores.dtype)
        logp = F.log_softmax(scores, dim=self.axis)
        logp3, lab = as_positions(logp, labels.detach(), self.axis)  # (outer, C, inner)
        valid = None if self.ignore_label is None else lab != self.ignore_label
        self.labels.observe(lab, valid)
        floor = math.log(LOG_THRESHOLD)
        logp3 = logp3 - (logp3 - logp3.clamp(min=floor)).detach()  # floored value, full grad
        rows = h[lab.clamp(0, self.classes - 1).squeeze(1)].transpose(1, 2)  # (outer, C, inner)
        per_position = -(rows * logp3).sum(1, keepdim=True)  # (outer, 1, inner)
        if valid is not None:
            per_position = per_position * valid
        loss = per_position.sum() / normalizer(self.mode, lab.shape[0], lab.shape[2], valid,
                                               self.pre_fixed)
        return (loss, logp.detach().exp()) if len(self.top_shapes) == 2 else loss
