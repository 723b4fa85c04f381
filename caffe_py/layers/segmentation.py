"""Layer family: the segmentation forks' computing layers, each with its fork's semantics.

- ``BN``: two layers under one name. SegNet's (alexgkendall/caffe-segnet, also ENet's and
  DeconvNet's): blobs scale and shift (1, C, 1, 1); ``bn_mode: LEARN`` normalises by the
  batch's own statistics in every phase (variance E[x^2] - E[x]^2, eps 1e-9), ``INFERENCE``
  is scale * x + shift (SegNet folds the statistics into those two). PSPNet's (hszhao/PSPNet,
  from yjxiong's TSN Caffe): blobs slope, bias, running mean, running variance (1, C, 1, 1);
  TRAIN normalises by the batch (biased variance) and moves the running statistics by
  ``momentum``, TEST and ``frozen`` normalise by the running ones (TEST's backward is still
  the fork's batch form). The bn_param fields
  written decide which, else the number of ``param`` entries (2 or 4); neither is an error.
- ``Upsample``: SegNet's max-unpooling (bottoms: the values and the pooling layer's mask;
  each value goes to the position the mask names, the rest is 0) or, with one bottom, the
  YOLOv3 ports' nearest-neighbour ``scale``.
- ``Interp``: PSPNet's (DeepLab v2's) bilinear resizing with the corners aligned, its
  sampling positions computed in float32 as the fork computes them.
- ``SegAccuracy``: PSPNet's (DeepLab v2's) confusion-matrix metrics.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import DataError
from ..spec.layer_params.segmentation import (
    PSPNET,
    SEGNET,
    BNParameter,
    InterpParameter,
    SegAccuracyParameter,
    UpsampleParameter,
)
from ..spec.schema import is_set
from .base import Layer, Shape
from .registry import register

_SEGNET_EPS = 1e-9  # caffe-segnet's bn_layer.cpp var_eps_


def _nchw(shape: Shape) -> tuple[int, int, int, int]:
    """Caffe's legacy num/channels/height/width of a blob of 2 to 4 axes."""
    padded = tuple(shape) + (1,) * (4 - len(shape))
    return padded[0], padded[1], padded[2], padded[3]


# --- BN -------------------------------------------------------------------------------------
@register("BN")
class BN(Layer):
    """SegNet's or PSPNet's BN (module docstring); ``self.variant`` says which."""

    tops = (1, 3)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        (shape,) = bottom_shapes
        self.require_axes(0, shape, (2, 3, 4))
        p: BNParameter = self.param()
        self.variant = p.variant() or self._variant_from_params()
        c = _nchw(shape)[1]
        if self.variant == "SegNet":
            self.learn = (p.bn_mode or "LEARN") == "LEARN"
            self.add_blob("scale", (1, c, 1, 1), p.scale_filler)
            self.add_blob("shift", (1, c, 1, 1), p.shift_filler)
            # the fork's top is (num, channels, height, width), 4 axes whatever the bottom's
            tops: list[Shape] = [_nchw(shape)]
            return tops + [(1, c, 1, 1)] * (len(self.spec.top) - 1)
        if len(self.spec.top) > 1:
            raise self.fail(f"{PSPNET} has one top, got {len(self.spec.top)}",
                            "remove the extra tops (SegNet's BN writes the batch statistics "
                            "there)")
        self.frozen = bool(p.frozen)
        self.momentum = 0.9 if p.momentum is None else p.momentum
        self.eps = 1e-5 if p.eps is None else p.eps
        # frozen: the fork forces lr_mult 0 on all four blobs; else on the statistics only
        self.add_blob("slope", (1, c, 1, 1), p.slope_filler, learnable=not self.frozen)
        self.add_blob("bias", (1, c, 1, 1), p.bias_filler, learnable=not self.frozen)
        self.add_blob("running_mean", (1, c, 1, 1), learnable=False)
        self.add_blob("running_var", (1, c, 1, 1), learnable=False)
        if self.frozen:
            with torch.no_grad():
                self.running_var.fill_(1.0)
        return [shape]

    def _variant_from_params(self) -> str:
        n = len(self.spec.param)
        if n in (2, 4):
            return "SegNet" if n == 2 else "PSPNet"
        raise self.fail(f"bn_param gives no field of either BN: {SEGNET} (bn_mode, "
                        f"scale_filler, shift_filler; 2 blobs) or {PSPNET} (slope_filler, "
                        "bias_filler, momentum, eps, frozen; 4 blobs), and the layer has "
                        f"{n} param entries",
                        "write bn_param { bn_mode: LEARN } for SegNet's, or bn_param "
                        "{ frozen: false } for PSPNet's")

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        shape = x.shape
        x4 = x.reshape(_nchw(tuple(shape)))
        if self.variant == "SegNet":
            out = self._segnet(x4)
            return out if len(out) > 1 else out[0]
        return self._pspnet(x4).reshape(shape)

    def _segnet(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not self.learn:
            return (x * self.scale + self.shift,)
        # the fork's order: means over H x W, then over N; var = E[x^2] - E[x]^2
        mean = x.mean(dim=(2, 3), keepdim=True).mean(dim=0, keepdim=True)
        var = (x * x).mean(dim=(2, 3), keepdim=True).mean(dim=0, keepdim=True) - mean * mean
        y = (x - mean) / torch.sqrt(var + _SEGNET_EPS) * self.scale + self.shift
        stats = (mean.detach(), var.detach())[:len(self.top_shapes) - 1]
        return (y, *stats)

    def _pspnet(self, x: torch.Tensor) -> torch.Tensor:
        if self.frozen:
            mean, var = self.running_mean, self.running_var
        elif self.phase == "TEST":  # the running statistics, the batch form's backward
            return _PSPNetTestBN.apply(x, self.slope, self.bias, self.running_mean,
                                       self.running_var, self.eps)
        else:
            mean = x.mean(dim=(2, 3), keepdim=True).mean(dim=0, keepdim=True)
            var = (x - mean).square().mean(dim=(2, 3), keepdim=True).mean(dim=0, keepdim=True)
            self._move_statistics(mean, var)
        return (x - mean) * (var + self.eps).pow(-0.5) * self.slope + self.bias

    @torch.no_grad()
    def _move_statistics(self, mean: torch.Tensor, var: torch.Tensor) -> None:
        # caffe_cpu_axpby(1 - momentum, batch, momentum, running)
        for running, batch in ((self.running_mean, mean), (self.running_var, var)):
            running.mul_(self.momentum).add_(batch.to(running.dtype), alpha=1 - self.momentum)


class _PSPNetTestBN(torch.autograd.Function):
    """PSPNet's BN in TEST, not frozen: the forward normalises by the running statistics, the
    backward is still the batch-statistics form (bn_layer.cpp's Backward_cpu reads the
    x_norm and 1 / std this forward saved): dx = (g - x_norm mean(g x_norm) - mean(g)) / std,
    g = dy slope, the means over N, H and W."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, slope: torch.Tensor, bias: torch.Tensor,
                mean: torch.Tensor, var: torch.Tensor, eps: float) -> torch.Tensor:
        inv_std = (var + eps).pow(-0.5)
        x_norm = (x - mean) * inv_std
        ctx.save_for_backward(x_norm, slope, inv_std)
        return x_norm * slope + bias

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x_norm, slope, inv_std = ctx.saved_tensors
        dims = (0, 2, 3)
        count = grad.numel() // grad.shape[1]
        g = grad * slope
        dx = (g - x_norm * (g * x_norm).sum(dims, keepdim=True) / count
              - g.sum(dims, keepdim=True) / count) * inv_std
        return (dx, (grad * x_norm).sum(dims, keepdim=True), grad.sum(dims, keepdim=True),
                None, None, None)


# --- Upsample -------------------------------------------------------------------------------
class _MaxUnpool(torch.autograd.Function):
    """SegNet's Upsample on (N, C, h*w) values and mask -> (N, C, size): each value is written
    at the position its mask names (a position named twice keeps the later value, as the
    fork's loop does); the gradient of value i is the output gradient at its position, as the
    fork's backward reads it (even for the value a later one overwrote)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
        order = torch.arange(x.shape[2], device=x.device).expand_as(index)
        winner = torch.full((*x.shape[:2], size), -1, dtype=torch.int64, device=x.device)
        winner.scatter_reduce_(2, index, order, reduce="amax")
        out = x.gather(2, winner.clamp(min=0))
        out = torch.where(winner >= 0, out, torch.zeros((), dtype=x.dtype, device=x.device))
        ctx.save_for_backward(index)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (index,) = ctx.saved_tensors
        return grad.gather(2, index), None, None


_SEGNET_UPSAMPLE = ("scale_h", "scale_w", "pad_out_h", "pad_out_w", "upsample_h", "upsample_w")


@register("Upsample")
class Upsample(Layer):
    """SegNet's max-unpooling (two bottoms) or the YOLOv3 ports' nearest-neighbour upsampling
    (one bottom), as the module docstring says."""

    bottoms = (1, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p: UpsampleParameter = self.param()
        self.require_axes(0, bottom_shapes[0], 4)
        n, c, h, w = bottom_shapes[0]
        if len(bottom_shapes) == 1:
            return [self._nearest_setup(p, n, c, h, w)]
        self.mode = "unpool"
        if tuple(bottom_shapes[1]) != tuple(bottom_shapes[0]):
            raise self.bottom_error(1, f"(the pooling mask) has shape {list(bottom_shapes[1])} "
                                       f"but the values have {list(bottom_shapes[0])}",
                                    "give the mask top of the Pooling layer that made them")
        self.out_h, self.out_w = self._unpool_size(p, h, w)
        return [(n, c, self.out_h, self.out_w)]

    def _nearest_setup(self, p: UpsampleParameter, n: int, c: int, h: int, w: int) -> Shape:
        segnet = [k for k in _SEGNET_UPSAMPLE if is_set(p, k)]
        if segnet or p.scale is None:
            what = (f"{segnet[0]} is a field of SegNet's max-unpooling Upsample" if segnet else
                    "upsample_param gives no scale")
            raise self.fail(
                f"has one bottom, which makes it the YOLOv3 ports' nearest-neighbour Upsample "
                f"(upsample_param {{scale}}), but {what}, which takes the pooling mask as a "
                "second bottom (alexgkendall/caffe-segnet)",
                "give the Pooling layer's mask top as the second bottom (SegNet's), or only "
                "upsample_param { scale: S } (nearest-neighbour)")
        self.mode, self.scale = "nearest", p.scale
        return (n, c, h * p.scale, w * p.scale)

    def _unpool_size(self, p: UpsampleParameter, h: int, w: int) -> tuple[int, int]:
        if p.upsample_h is not None or p.upsample_w is not None:
            if p.upsample_h is None or p.upsample_w is None:
                raise self.fail("upsample_h and upsample_w go together", "set both")
            if p.upsample_h < 2 or p.upsample_w < 2:
                raise self.fail(f"upsample_h {p.upsample_h} and upsample_w {p.upsample_w} "
                                "must be > 1 (the fork's check)", "give the pooling input's size")
            return p.upsample_h, p.upsample_w
        if (p.scale_h is None) != (p.scale_w is None) or (p.scale_h and p.scale is not None):
            raise self.fail("SegNet's Upsample takes upsample_h and upsample_w, else scale, "
                            "or scale_h and scale_w", "give one of those")
        sh, sw = ((p.scale_h, p.scale_w) if p.scale_h and p.scale_w
                  else (p.scale or 2, p.scale or 2))
        if sh < 2 or sw < 2:
            raise self.fail(f"scale {sh} x {sw} must be > 1 (the fork's check)")
        for pad, s, axis in ((p.pad_out_h, sh, "h"), (p.pad_out_w, sw, "w")):
            if pad and s != 2:
                raise self.fail(f"pad_out_{axis} needs scale_{axis} 2 (the fork's check: the "
                                "output size is ill-defined otherwise)",
                                "give upsample_h and upsample_w instead")
        return h * sh - int(p.pad_out_h), w * sw - int(p.pad_out_w)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if self.mode == "nearest":
            return x.repeat_interleave(self.scale, dim=2).repeat_interleave(self.scale, dim=3)
        assert mask is not None
        n, c = x.shape[:2]
        size = self.out_h * self.out_w
        index = mask.detach().reshape(n, c, -1).long()  # the fork's static_cast<int>
        if not index.is_cuda:
            top = int(index.max()) if index.numel() else 0
            if top >= size or (index.numel() and int(index.min()) < 0):
                raise DataError(f"layer '{self.name}' (Upsample): the mask names position {top} "
                                f"of an output of {self.out_h} x {self.out_w}; the scale "
                                "settings must match the pooling layer's input size")
        else:
            index = index.clamp(0, size - 1)
        out = _MaxUnpool.apply(x.reshape(n, c, -1), index, size)
        return out.reshape(n, c, self.out_h, self.out_w)


# --- Interp ---------------------------------------------------------------------------------
def interp_axis(size_in: int, size_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each output position of one axis: the input position (int64), its step to the next
    (0 at the last input position) and the weight of the next (float32), as
    caffe_cpu_interp2 computes them (the ratio and positions in float32)."""
    ratio = (np.float32(size_in - 1) / np.float32(size_out - 1) if size_out > 1
             else np.float32(0.0))
    real = ratio * np.arange(size_out, dtype=np.float32)  # float32 products
    first = real.astype(np.int64)                         # C's truncation (real >= 0)
    step = (first < size_in - 1).astype(np.int64)
    weight = (real - first.astype(np.float32)).astype(np.float32)
    return first, step, weight


@register("Interp")
class Interp(Layer):
    """PSPNet's Interp: (N, C, H, W) -> (N, C, h, w), bilinear with the corners aligned over
    the input cropped by pad_beg / pad_end (<= 0)."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        (shape,) = bottom_shapes
        self.require_axes(0, shape, 4)
        p: InterpParameter = self.param()
        n, c, h, w = shape
        self.begin = -p.pad_beg
        h_eff, w_eff = h + p.pad_beg + p.pad_end, w + p.pad_beg + p.pad_end
        if h_eff <= 0 or w_eff <= 0:
            raise self.fail(f"pad_beg {p.pad_beg} and pad_end {p.pad_end} crop the {h} x {w} "
                            "input to nothing", "crop less")
        out_h, out_w = self._out_size(p, h_eff, w_eff)
        if out_h <= 0 or out_w <= 0:
            raise self.fail(f"the output size {out_h} x {out_w} is not positive",
                            "give a positive height and width")
        self.eff = (h_eff, w_eff)
        # before the per-axis tables (as long as the output's sides): a zoom_factor of 1e9 built
        # them for minutes, then ran out of memory
        self.check_fits(f"top '{self.spec.top[0]}'", (n, c, out_h, out_w))
        rows, cols = interp_axis(h_eff, out_h), interp_axis(w_eff, out_w)
        dev = self.ctx.device
        for name, (first, step, weight) in (("row", rows), ("col", cols)):
            self.register_buffer(f"_{name}0", torch.from_numpy(first + self.begin).to(dev),
                                 persistent=False)
            self.register_buffer(f"_{name}1",
                                 torch.from_numpy(first + step + self.begin).to(dev),
                                 persistent=False)
            self.register_buffer(f"_{name}w", torch.from_numpy(weight).to(dev),
                                 persistent=False)
        return [(n, c, out_h, out_w)]

    def _out_size(self, p: InterpParameter, h: int, w: int) -> tuple[int, int]:
        """The fork's order: shrink alone, zoom alone, height and width, shrink then zoom."""
        shrink, zoom = is_set(p, "shrink_factor"), is_set(p, "zoom_factor")
        if shrink and not zoom:
            return (h - 1) // p.shrink_factor + 1, (w - 1) // p.shrink_factor + 1
        if zoom and not shrink:
            return h + (h - 1) * (p.zoom_factor - 1), w + (w - 1) * (p.zoom_factor - 1)
        if is_set(p, "height") and is_set(p, "width"):
            return p.height, p.width
        if shrink and zoom:
            h, w = (h - 1) // p.shrink_factor + 1, (w - 1) // p.shrink_factor + 1
            return h + (h - 1) * (p.zoom_factor - 1), w + (w - 1) * (p.zoom_factor - 1)
        raise self.fail("interp_param gives no output size",
                        "give zoom_factor, shrink_factor, or height and width")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out_h, out_w = self.top_shapes[0][2:]
        if self.eff == (out_h, out_w):  # the fork copies the (cropped) input
            b = self.begin
            return x[:, :, b:b + out_h, b:b + out_w]
        dtype = x.dtype
        top, bottom = x.index_select(2, self._row0), x.index_select(2, self._row1)
        wr = self._roww.to(dtype).view(1, 1, -1, 1)
        wc = self._colw.to(dtype).view(1, 1, 1, -1)
        c0, c1 = self._col0, self._col1
        # h0 * (w0 * p00 + w1 * p01) + h1 * (w0 * p10 + w1 * p11), in the fork's order
        upper = (1 - wc) * top.index_select(3, c0) + wc * top.index_select(3, c1)
        lower = (1 - wc) * bottom.index_select(3, c0) + wc * bottom.index_select(3, c1)
        return (1 - wr) * upper + wr * lower


# --- SegAccuracy ----------------------------------------------------------------------------
@register("SegAccuracy")
class SegAccuracy(Layer):
    """Bottoms scores (N, C, H, W) and labels (N, 1, H, W); top (1, 1, 1, 3): pixel accuracy,
    mean class accuracy (over the classes present) and mean IoU (a class absent from both the
    labels and the predictions counts 1), from the confusion matrix of the argmax (the highest
    class index of a tie, as the fork's sort) against the labels not ignored. With ``reset:
    false`` the matrix keeps counting over every forward. An optional second top (caffe-py's)
    holds each class's IoU (C,)."""

    bottoms = (2, 2)
    tops = (1, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        scores, labels = bottom_shapes
        self.require_axes(0, scores, 4)
        n, c, h, w = scores
        if tuple(labels) != (n, 1, h, w):
            raise self.bottom_error(1, f"(the labels) has shape {list(labels)}; expected "
                                       f"{[n, 1, h, w]} (one channel, the scores' size)")
        p: SegAccuracyParameter = self.param()
        self.classes, self.reset = c, p.reset
        dev = self.ctx.device
        self.register_buffer("_ignored", torch.tensor(sorted(set(p.ignore_label)),
                                                      dtype=torch.int64, device=dev),
                             persistent=False)
        self.register_buffer("confusion", torch.zeros(c, c, dtype=torch.int64, device=dev),
                             persistent=False)
        return [(1, 1, 1, 3)] + [(c,)] * (len(self.spec.top) - 1)

    def forward(self, scores: torch.Tensor, labels: torch.Tensor):
        c = self.classes
        # the last maximum: argmax over the classes in reverse order
        pred = (c - 1) - scores.detach().flip(1).argmax(dim=1).reshape(-1)
        label = labels.detach().reshape(-1).long()    # the fork's static_cast<int>
        kept = ~torch.isin(label, self._ignored)
        bad = kept & ((label < 0) | (label >= c))
        if not label.is_cuda and bool(bad.any()):
            value = int(label[bad][0])
            raise DataError(f"layer '{self.name}' (SegAccuracy): label {value} is outside "
                            f"[0, {c}) and not an ignore_label; fix the label images or add "
                            "the label to seg_accuracy_param.ignore_label") from None
        kept &= ~bad
        counts = torch.bincount(label[kept] * c + pred[kept], minlength=c * c).view(c, c)
        with torch.no_grad():
            if self.reset:
                self.confusion.zero_()
            self.confusion.add_(counts)
        metrics, iou = confusion_metrics(self.confusion)
        top = metrics.to(scores.dtype).view(1, 1, 1, 3)
        return (top, iou.to(scores.dtype)) if len(self.top_shapes) == 2 else top


def confusion_metrics(matrix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[accuracy, mean recall over present classes, mean IoU] and the per-class IoU of a
    confusion matrix (rows: labels, columns: predictions), in float64 as the fork's
    ConfusionMatrix."""
    m = matrix.double()
    diag, rows, cols = m.diagonal(), m.sum(1), m.sum(0)
    total = m.sum()
    accuracy = torch.where(total > 0, diag.sum() / total.clamp(min=1), torch.zeros_like(total))
    present = rows > 0
    recall = torch.where(present, diag / rows.clamp(min=1), torch.zeros_like(diag))
    classes = present.sum()
    mean_recall = torch.where(classes > 0, recall.sum() / classes.clamp(min=1),
                              torch.zeros_like(total))
    union = rows + cols - diag
    iou = torch.where(diag == union, torch.ones_like(diag), diag / union.clamp(min=1))
    return torch.stack([accuracy, mean_recall, iou.mean()]), iou
