"""ROIPooling, PSROIPooling and SmoothL1Loss: ROIPooling against a plain reference written from
caffe-fast-rcnn's CPU forward, PSROIPooling's gradient, the three forks' SmoothL1 forms, and
the errors. tests/golden/forks holds them against the forks' own kernels."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from layer_helpers import build, gradcheck, rand

from caffe_py.errors import DataError, NetError

F32 = np.float32


def roi_pool_reference(x: np.ndarray, rois: np.ndarray, ph: int, pw: int,
                       scale: float) -> np.ndarray:
    """roi_pooling_layer.cpp's Forward_cpu, loop for loop."""
    _, c, h, w = x.shape
    out = np.zeros((len(rois), c, ph, pw), F32)
    for n, roi in enumerate(rois):
        b = int(roi[0])
        x1, y1, x2, y2 = (int(math.copysign(math.floor(abs(float(F32(v * F32(scale)))) + 0.5),
                                            float(v))) for v in roi[1:])
        rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        bh, bw = F32(rh) / F32(ph), F32(rw) / F32(pw)
        for i in range(ph):
            for j in range(pw):
                hs = min(max(int(math.floor(F32(i) * bh)) + y1, 0), h)
                he = min(max(int(math.ceil(F32(i + 1) * bh)) + y1, 0), h)
                ws = min(max(int(math.floor(F32(j) * bw)) + x1, 0), w)
                we = min(max(int(math.ceil(F32(j + 1) * bw)) + x1, 0), w)
                if he > hs and we > ws:
                    out[n, :, i, j] = x[b, :, hs:he, ws:we].reshape(c, -1).max(1)
    return out


ROIS = torch.tensor([[0, 4.0, 3.0, 30.0, 25.0], [1, 0.0, 0.0, 55.0, 47.0],
                     [1, 40.0, 30.0, 70.0, 60.0], [0, 20.0, 20.0, 10.0, 12.0]])


@pytest.mark.parametrize(("ph", "pw", "scale"), [(3, 3, 0.25), (2, 5, 0.5), (7, 7, 0.125)])
def test_roi_pooling_matches_the_forks_cpu_forward(ph, pw, scale):
    layer = build(f"name: r\ntype: ROIPooling\nbottom: [x, rois]\ntop: y\nroi_pooling_param: "
                  f"{{pooled_h: {ph}, pooled_w: {pw}, spatial_scale: {scale}}}",
                  [(2, 3, 12, 14), (4, 5)])
    x = rand(2, 3, 12, 14, dtype=torch.float32)
    np.testing.assert_array_equal(layer(x, ROIS).numpy(),
                                  roi_pool_reference(x.numpy(), ROIS.numpy(), ph, pw, scale))


def test_roi_pooling_refuses_a_region_of_another_image():
    layer = build("name: r\ntype: ROIPooling\nbottom: [x, rois]\ntop: y\nroi_pooling_param: "
                  "{pooled_h: 2, pooled_w: 2}", [(1, 3, 8, 8), (1, 5)])
    with pytest.raises(DataError, match="layer 'r' \\(ROIPooling\\): a region names image 1 of "
                                        "a batch of 1"):
        layer(torch.zeros(1, 3, 8, 8), torch.tensor([[1, 0, 0, 4, 4.0]]))
    with pytest.raises(NetError, match="regions are rows of 5 values"):
        build("name: r\ntype: ROIPooling\nbottom: [x, rois]\ntop: y\nroi_pooling_param: "
              "{pooled_h: 2, pooled_w: 2}", [(1, 3, 8, 8), (1, 4)])


def test_psroi_pooling_averages_position_sensitive_maps_and_is_differentiable():
    layer = build("name: ps\ntype: PSROIPooling\nbottom: [x, rois]\ntop: y\n"
                  "psroi_pooling_param: {spatial_scale: 0.5, output_dim: 2, group_size: 2}",
                  [(1, 8, 6, 6), (1, 5)])
    x = rand(1, 8, 6, 6)
    y = layer.double()(x, torch.tensor([[0, 0, 0, 7, 7.0]], dtype=torch.float64))
    # the region covers the whole 4 x 4 corner; bin (i, j) of output k reads channel
    # (k * 2 + i) * 2 + j over its own 2 x 2 quarter
    for k in range(2):
        for i in range(2):
            for j in range(2):
                c = (k * 2 + i) * 2 + j
                expected = x[0, c, 2 * i:2 * i + 2, 2 * j:2 * j + 2].mean()
                assert float(y[0, k, i, j]) == pytest.approx(float(expected))
    rois = torch.tensor([[0, 1, 2, 9, 8.0]], dtype=torch.float64)
    assert gradcheck(_Fixed(layer, rois), rand(1, 8, 6, 6, seed=3))
    with pytest.raises(NetError, match="has 6 channels; output_dim 2 x group_size 2 x 2 needs 8"):
        build("name: ps\ntype: PSROIPooling\nbottom: [x, rois]\ntop: y\n"
              "psroi_pooling_param: {spatial_scale: 0.5, output_dim: 2, group_size: 2}",
              [(1, 6, 6, 6), (1, 5)])


class _Fixed(torch.nn.Module):
    """A layer with its second bottom fixed (gradcheck over the first only)."""

    def __init__(self, layer, second):
        super().__init__()
        self.layer, self.second = layer, second

    def forward(self, x):
        return self.layer(x, self.second)


def smooth_l1(block: str, shapes, tops: str = "loss"):
    bottoms = ", ".join(f"b{i}" for i in range(len(shapes)))
    return build(f"name: s\ntype: SmoothL1Loss\nbottom: [{bottoms}]\ntop: [{tops}]\n{block}",
                 shapes)


def test_smooth_l1_with_sigma_and_faster_rcnn_weights():
    a, b = rand(4, 6), rand(4, 6, seed=1)
    w_in, w_out = torch.rand(4, 6, dtype=torch.float64), torch.rand(4, 6, dtype=torch.float64)
    layer = smooth_l1("smooth_l1_loss_param: {sigma: 3}", [(4, 6)] * 4).double()
    d = (a - b) * w_in
    err = torch.where(d.abs() < 1 / 9, 0.5 * 9 * d * d, d.abs() - 0.5 / 9) * w_out
    assert float(layer(a, b, w_in, w_out)) == pytest.approx(float(err.sum() / 4))
    # four bottoms: the exact derivative
    assert torch.autograd.gradcheck(lambda x, y: layer(x, y, w_in, w_out),
                                    (a.requires_grad_(), b.requires_grad_()))


def test_smooth_l1_with_one_weight_takes_the_forks_gradient():
    a = torch.tensor([[2.0, 0.5, -3.0]], requires_grad=True)
    b = torch.zeros(1, 3)
    w = torch.tensor([[0.25, 2.0, 1.0]])
    layer = smooth_l1("", [(1, 3)] * 3)
    layer(a, b, w).backward()
    # d = w (a - b) = [0.5, 1, -3]: the SmoothL1 slope at d, not multiplied by w
    assert a.grad.tolist() == [[0.5, 1.0, -1.0]]


def test_smooth_l1_rfcn_normalization_and_per_instance_loss():
    layer = smooth_l1("loss_param: {normalization: VALID}", [(2, 3, 2, 2)] * 2,
                      tops="loss, each")
    a, b = rand(2, 3, 2, 2), rand(2, 3, 2, 2, seed=4)
    loss, each = layer.double()(a, b)
    d = (a - b).abs()
    err = torch.where(d < 1, 0.5 * d * d, d - 0.5)
    assert float(loss) == pytest.approx(float(err.sum() / 8))  # N x H x W
    np.testing.assert_allclose(each.detach().numpy(), err.sum(1, keepdim=True).numpy())


def test_smooth_l1_errors_name_the_forks():
    with pytest.raises(NetError, match="divides by N in SSD's and Faster R-CNN's Caffe but by "
                                       "N x H x W in R-FCN's"):
        smooth_l1("", [(2, 3, 2, 2)] * 2)
    with pytest.raises(NetError, match="loss_param \\(R-FCN's SmoothL1Loss\\) with four bottoms"):
        smooth_l1("loss_param: {normalization: VALID}", [(2, 4)] * 4)
    with pytest.raises(NetError, match="has shape \\[2, 5\\] but bottom 'b0' has \\[2, 4\\]"):
        smooth_l1("", [(2, 4), (2, 5)])
