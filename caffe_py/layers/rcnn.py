"""Layer family: the region layers of Fast/Faster R-CNN's and R-FCN's Caffe forks: ROIPooling,
PSROIPooling and SmoothL1Loss.

- ROIPooling (rbgirshick/caffe-fast-rcnn, roi_pooling_layer.cpp/.cu): each region
  [batch, x1, y1, x2, y2] (image pixels) is scaled by spatial_scale and rounded, cut into
  pooled_h x pooled_w bins (floor/ceil edges), each bin max-pooled; an empty bin gives 0. The
  gradient goes to the first maximum of each bin in row-major order, as the fork's argmax.
- PSROIPooling (daijifeng001/caffe-rfcn, psroi_pooling_layer.cu): bin (i, j) of output channel
  k averages input channel (k x group_size + i) x group_size + j over the bin.
- SmoothL1Loss: one type in three forks. SSD's and R-FCN's take an optional third bottom that
  multiplies the difference; Faster R-CNN's takes inside and outside weights (four bottoms)
  and ``sigma``. All three divide by the batch size N, except R-FCN's, which reads loss_param
  (VALID: N x H x W). The gradient is each fork's: with three bottoms it is the SmoothL1
  derivative at the weighted difference, not multiplied by the weight (SSD's and R-FCN's
  backward), with four it is the exact derivative (Faster R-CNN's).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..spec.schema import is_set
from .base import Layer, Shape, count
from .loss import normalization_mode
from .registry import register

F32 = np.float32


def _c_round(x: np.ndarray) -> np.ndarray:
    """C's round(): halves away from zero."""
    return np.where(x >= 0, np.floor(x + 0.5), -np.floor(-x + 0.5))


def _bin_index(starts: np.ndarray, ends: np.ndarray, size: int
               ) -> tuple[np.ndarray, np.ndarray]:
    """For bins [start, end) (clipped to [0, size)): the positions each bin covers, padded to
    the longest bin (P, L), and which of them are real (P, L)."""
    length = max(1, int((ends - starts).max(initial=0)))
    pos = starts[:, None] + np.arange(length)[None, :]
    return np.clip(pos, 0, max(size - 1, 0)), pos < ends[:, None]


def _gather_bins(plane: torch.Tensor, rows: tuple[np.ndarray, np.ndarray],
                 cols: tuple[np.ndarray, np.ndarray], width: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """plane (C, H x W) -> values (C, PH, PW, LH x LW) of every bin, row-major within a bin,
    and the mask of real positions (PH, PW, LH x LW)."""
    r, r_ok = rows
    c, c_ok = cols
    flat = r[:, None, :, None] * width + c[None, :, None, :]          # (PH, PW, LH, LW)
    ok = r_ok[:, None, :, None] & c_ok[None, :, None, :]
    ph, pw = flat.shape[:2]
    index = torch.from_numpy(flat.reshape(ph, pw, -1)).to(plane.device)
    return plane[:, index], torch.from_numpy(ok.reshape(ph, pw, -1)).to(plane.device)


def _check_rois(layer: Layer, shape: Shape) -> None:
    if count(shape, 1) != 5:
        raise layer.bottom_error(1, f"has shape {list(shape)}; regions are rows of 5 values "
                                    "[batch, x1, y1, x2, y2]")


def _batch_index(layer: Layer, value: float, batch: int) -> int:
    index = int(value)
    if not 0 <= index < batch:
        from ..errors import DataError
        from ..spec.schema import message_at

        raise DataError(message_at(layer.spec, f"a region names image {index} of a batch of "
                                               f"{batch}", "check the regions' first column",
                                   named=True))
    return index


@register("ROIPooling")
class ROIPooling(Layer):
    """Max pooling of each region of interest: bottoms features (N, C, H, W) and regions
    (R, 5); top (R, C, pooled_h, pooled_w)."""

    bottoms = (2, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        self.require_axes(0, bottom_shapes[0], 4)
        _check_rois(self, bottom_shapes[1])
        return [(bottom_shapes[1][0], bottom_shapes[0][1], p.pooled_h, p.pooled_w)]

    def bins(self, roi: np.ndarray, height: int, width: int
             ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """Row and column bins of one region, as the fork computes them in float."""
        p = self.param()
        scale = F32(p.spatial_scale)
        x1, y1, x2, y2 = (int(v) for v in _c_round((roi[1:5].astype(F32) * scale)
                                                   .astype(np.float64)))
        roi_h, roi_w = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        bin_h, bin_w = F32(roi_h) / F32(p.pooled_h), F32(roi_w) / F32(p.pooled_w)
        ph, pw = np.arange(p.pooled_h, dtype=F32), np.arange(p.pooled_w, dtype=F32)
        hs = np.floor(ph * bin_h).astype(np.int64) + y1
        he = np.ceil((ph + 1) * bin_h).astype(np.int64) + y1
        ws = np.floor(pw * bin_w).astype(np.int64) + x1
        we = np.ceil((pw + 1) * bin_w).astype(np.int64) + x1
        hs, he = np.clip(hs, 0, height), np.clip(he, 0, height)
        ws, we = np.clip(ws, 0, width), np.clip(we, 0, width)
        return _bin_index(hs, he, height), _bin_index(ws, we, width)

    def counted(self, roi: np.ndarray, argmax: np.ndarray, height: int, width: int
                ) -> np.ndarray:
        """Which bins' maxima the fork's backward kernel passes a gradient to: the maximum
        (h, w) must lie in the rounded region (so an inverted region, pooled as 1 x 1, gets
        none) and the bin among those the kernel reckons may hold (h, w)."""
        p = self.param()
        scale = F32(p.spatial_scale)
        x1, y1, x2, y2 = (int(v) for v in _c_round((roi[1:5].astype(F32) * scale)
                                                   .astype(np.float64)))
        ph_n, pw_n = p.pooled_h, p.pooled_w
        bin_h = F32(max(y2 - y1 + 1, 1)) / F32(ph_n)
        bin_w = F32(max(x2 - x1 + 1, 1)) / F32(pw_n)
        h, w = np.divmod(np.maximum(argmax, 0), width)
        inside = (argmax >= 0) & (w >= x1) & (w <= x2) & (h >= y1) & (h <= y2)
        ph0 = np.clip(np.floor((h - y1).astype(F32) / bin_h), 0, ph_n)
        ph1 = np.clip(np.ceil((h - y1 + 1).astype(F32) / bin_h), 0, ph_n)
        pw0 = np.clip(np.floor((w - x1).astype(F32) / bin_w), 0, pw_n)
        pw1 = np.clip(np.ceil((w - x1 + 1).astype(F32) / bin_w), 0, pw_n)
        ph = np.arange(ph_n)[None, :, None]
        pw = np.arange(pw_n)[None, None, :]
        return inside & (ph >= ph0) & (ph < ph1) & (pw >= pw0) & (pw < pw1)

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        return _ROIPool.apply(x, rois, self)


class _ROIPool(torch.autograd.Function):
    """ROIPooling's forward (max per bin, its row-major first argmax) and the fork's backward
    kernel (each maximum's gradient, where :meth:`ROIPooling.counted` says so)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, rois: torch.Tensor, layer: ROIPooling
                ) -> torch.Tensor:
        n, c, h, w = x.shape
        host = rois.detach().to("cpu", torch.float32).reshape(-1, 5).numpy()
        out, picks = [], []
        for roi in host:
            b = _batch_index(layer, roi[0], n)
            rows, cols = layer.bins(roi, h, w)
            values, ok = _gather_bins(x[b].reshape(c, h * w), rows, cols, w)
            best, where = values.masked_fill(~ok, float("-inf")).max(-1)     # (C, PH, PW)
            empty = ~ok.any(-1)
            out.append(best.masked_fill(empty, 0.0))
            flat = (torch.from_numpy(rows[0][:, None, :, None] * w + cols[0][None, :, None, :])
                    .reshape(ok.shape).to(x.device))
            index = torch.gather(flat.expand(c, -1, -1, -1), 3, where[..., None])[..., 0]
            index = index.masked_fill(empty, -1)
            keep = torch.from_numpy(layer.counted(roi, index.cpu().numpy(), h, w)).to(x.device)
            picks.append((b, index, keep))
        ctx.picks, ctx.shape = picks, x.shape
        if not out:
            return x.new_zeros(0, c, *layer.top_shapes[0][2:])
        return torch.stack(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        n, c, h, w = ctx.shape
        dx = grad.new_zeros(n, c, h * w)
        for r, (b, index, keep) in enumerate(ctx.picks):
            g = torch.where(keep, grad[r], torch.zeros_like(grad[r])).reshape(c, -1)
            dx[b].scatter_add_(1, index.clamp(min=0).reshape(c, -1), g)
        return dx.reshape(n, c, h, w), None, None


@register("PSROIPooling")
class PSROIPooling(Layer):
    """Position-sensitive average pooling (R-FCN): bottoms features (N, D x G x G, H, W) and
    regions (R, 5); top (R, D, G, G)."""

    bottoms = (2, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        self.require_axes(0, bottom_shapes[0], 4)
        _check_rois(self, bottom_shapes[1])
        g, d = p.group_size, p.output_dim
        if bottom_shapes[0][1] != d * g * g:
            raise self.bottom_error(0, f"has {bottom_shapes[0][1]} channels; output_dim {d} x "
                                       f"group_size {g} x {g} needs {d * g * g}",
                                    "make the score maps output_dim x group_size^2 channels")
        channel = (np.arange(d)[:, None, None] * g + np.arange(g)[None, :, None]) * g + \
            np.arange(g)[None, None, :]
        self.channel_index = torch.from_numpy(channel)   # (D, G, G)
        return [(bottom_shapes[1][0], d, g, g)]

    def bins(self, roi: np.ndarray, height: int, width: int
             ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        p = self.param()
        scale, g = F32(p.spatial_scale), p.group_size
        r = _c_round(roi[1:5].astype(np.float64))
        x1, y1 = F32(r[0]) * scale, F32(r[1]) * scale
        x2, y2 = F32(r[2] + 1.0) * scale, F32(r[3] + 1.0) * scale
        roi_w, roi_h = max(F32(x2 - x1), F32(0.1)), max(F32(y2 - y1), F32(0.1))
        bin_h, bin_w = F32(roi_h / F32(g)), F32(roi_w / F32(g))
        k = np.arange(g, dtype=F32)
        hs = np.floor(k * bin_h + y1).astype(np.int64)
        he = np.ceil((k + 1) * bin_h + y1).astype(np.int64)
        ws = np.floor(k * bin_w + x1).astype(np.int64)
        we = np.ceil((k + 1) * bin_w + x1).astype(np.int64)
        hs, he = np.clip(hs, 0, height), np.clip(he, 0, height)
        ws, we = np.clip(ws, 0, width), np.clip(we, 0, width)
        return _bin_index(hs, he, height), _bin_index(ws, we, width)

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        host = rois.detach().to("cpu", torch.float32).reshape(-1, 5).numpy()
        channels = self.channel_index.to(x.device)
        out = []
        for roi in host:
            b = _batch_index(self, roi[0], n)
            rows, cols = self.bins(roi, h, w)
            values, ok = _gather_bins(x[b].reshape(c, h * w), rows, cols, w)  # (C, G, G, L)
            g = channels.shape[1]
            picked = values[channels, torch.arange(g, device=x.device)[None, :, None],
                            torch.arange(g, device=x.device)[None, None, :]]   # (D, G, G, L)
            area = ok.sum(-1).to(x.dtype)                                      # (G, G)
            total = (picked * ok.to(x.dtype)).sum(-1)
            out.append(torch.where(area > 0, total / area.clamp(min=1), total.new_zeros(())))
        if not out:
            return x.new_zeros(0, *self.top_shapes[0][1:])
        return torch.stack(out)


@register("SmoothL1Loss")
class SmoothL1Loss(Layer):
    """sum(w_out x f(w_in x (a - b))) / normalizer, f the SmoothL1 of ``sigma`` (see the module
    docstring for which fork each form follows). Bottoms: a, b, and optionally w_in (SSD, R-FCN)
    or w_in and w_out (Faster R-CNN). Tops: the loss and, optionally, the per-instance loss
    (N, 1, H, W) of R-FCN's fork."""

    bottoms = (2, 4)
    tops = (1, 2)
    is_loss = True

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        a = bottom_shapes[0]
        for i, shape in enumerate(bottom_shapes[1:], start=1):
            if count(shape, 1) != count(a, 1) or (shape and a and shape[0] != a[0]):
                raise self.bottom_error(i, f"has shape {list(shape)} but bottom "
                                           f"'{self.spec.bottom[0]}' has {list(a)}",
                                        "give every bottom the same shape")
        lp = self.param("loss_param")
        self.rfcn = is_set(lp, "normalization") or lp.normalize is not None
        spatial = count(a, 2) if len(a) > 2 else 1
        if len(bottom_shapes) == 4 and self.rfcn:
            raise self.fail("loss_param (R-FCN's SmoothL1Loss) with four bottoms (Faster "
                            "R-CNN's inside and outside weights): no fork has both",
                            "drop loss_param, or give at most three bottoms")
        if not self.rfcn and len(bottom_shapes) < 4 and spatial > 1:
            raise self.fail(f"SmoothL1Loss over {list(a)} divides by N in SSD's and Faster "
                            "R-CNN's Caffe but by N x H x W in R-FCN's (its default "
                            "normalization VALID)", "say which: loss_param { normalization: "
                            "BATCH_SIZE } (SSD, Faster R-CNN) or VALID (R-FCN)")
        self.mode = normalization_mode(lp, "VALID") if self.rfcn else "BATCH_SIZE"
        self.sigma2 = float(F32(self.param().sigma) * F32(self.param().sigma))
        tops: list[Shape] = [()]
        if len(self.spec.top) == 2:
            tops.append((a[0], 1, *a[2:]) if len(a) > 2 else (a[0], 1))
        return tops

    def normalizer(self, shape: Shape) -> float:
        n = shape[0] if shape else 1
        inner = count(shape, 2) if len(shape) > 2 else 1
        value = {"FULL": n * inner, "VALID": n * inner, "BATCH_SIZE": n, "NONE": 1}[self.mode]
        return float(max(1, value))

    def forward(self, a: torch.Tensor, b: torch.Tensor, *weights: torch.Tensor):
        w_in = weights[0].detach() if weights else None
        w_out = weights[1].detach() if len(weights) == 2 else None
        norm = self.normalizer(tuple(a.shape))
        loss, errors = _SmoothL1.apply(a, b, w_in, w_out, self.sigma2, norm)
        if len(self.top_shapes) == 2:
            per = errors.reshape(a.shape[0], a.shape[1], -1).sum(1)
            return loss, per.reshape(a.shape[0], 1, *a.shape[2:])
        return loss


class _SmoothL1(torch.autograd.Function):
    """The forks' forward and backward (see SmoothL1Loss)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, w_in: torch.Tensor | None,
                w_out: torch.Tensor | None, sigma2: float, norm: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
        d = a - b
        if w_in is not None:
            d = d * w_in.reshape(d.shape)
        ad = d.abs()
        # the forks compare and compute in double: |x| < 1 / sigma^2
        small = ad.double() < 1.0 / sigma2
        err = torch.where(small, (0.5 * d.double() * d.double() * sigma2).to(d.dtype),
                          (ad.double() - 0.5 / sigma2).to(d.dtype))
        if w_out is not None:
            err = err * w_out.reshape(err.shape)
        ctx.save_for_backward(d, w_in, w_out)
        ctx.sigma2, ctx.norm = sigma2, norm
        ctx.mark_non_differentiable(err)
        return err.sum() / norm, err

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor | None, _unused: Any):
        if grad is None:
            return None, None, None, None, None, None
        d, w_in, w_out = ctx.saved_tensors
        small = d.abs().double() < 1.0 / ctx.sigma2
        slope = torch.where(small, d * ctx.sigma2, torch.sign(d))
        if w_out is not None:   # Faster R-CNN's: times the inside and outside weights
            slope = slope * w_in.reshape(d.shape) * w_out.reshape(d.shape)
        g = slope * (grad / ctx.norm)
        return g, -g, None, None, None, None
