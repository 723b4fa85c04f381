"""The face-recognition forks' layers (MarginInnerProduct, LabelSpecificAdd, CenterLoss)
against loop references written from the forks' sources (forward and the forks' own backward),
and float64 gradchecks where the fork's backward is the exact derivative. No fork of these is
built here."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from layer_helpers import build, gradcheck, rand

from caffe_py.errors import DataError


def sphereface_loops(x: np.ndarray, w: np.ndarray, label: np.ndarray, m: int, lam: float,
                     top_diff: np.ndarray) -> tuple[np.ndarray, ...]:
    """caffe-sphereface's margin_inner_product_layer.cpp: the (already normalised) weights,
    the top, and the backward's x and weight gradients, one element at a time."""
    mm, k = x.shape
    n = w.shape[0]
    top = x @ w.T
    gx, gw = np.zeros_like(x), top_diff.T @ x
    for i in range(mm):
        norm = np.sqrt(x[i] @ x[i])
        j = int(label[i])
        c = (x[i] @ w[j]) / norm
        s0 = np.sign(c)
        if m == 2:
            psi, cw, cx = 2 * s0 * c ** 2 - 1, 4 * s0 * c, 2 * s0 * c ** 2 + 1
        elif m == 3:
            s1 = np.sign(abs(c) - 0.5)
            s2 = s0 * (1 + s1) - 2
            psi, cw, cx = s1 * (4 * c ** 3 - 3 * c) + s2, s1 * (12 * c ** 2 - 3), \
                8 * s1 * c ** 3 - s2
        else:
            s3 = s0 * np.sign(2 * c ** 2 - 1)
            s4 = 2 * s0 + s3 - 3
            psi = s3 * (8 * c ** 4 - 8 * c ** 2 + 1) + s4
            cw, cx = s3 * (32 * c ** 3 - 16 * c), s3 * (24 * c ** 4 - 8 * c ** 2 - 1) - s4
        cx = cx / -norm
        length = np.sqrt(cw * cw + cx * cx)
        for q in range(n):
            d = top_diff[i, q] / (1 + lam)
            if q != j:
                gx[i] += d * w[q]
            else:
                gx[i] += d * (cw / length) * w[q] + d * (cx / length) * x[i]
        gx[i] += lam / (1 + lam) * top_diff[i] @ w
        top[i, j] = norm * psi
    top = (top + lam * (x @ w.T)) / (1 + lam)
    return top, gx, gw


@pytest.mark.parametrize("kind,m", [("DOUBLE", 2), ("TRIPLE", 3), ("QUADRUPLE", 4)])
def test_margin_inner_product_matches_sphereface(kind, m):
    text = (f"name: fc\ntype: MarginInnerProduct\nbottom: [x, label]\ntop: [fc, lambda]\n"
            f"margin_inner_product_param: {{num_output: 5, type: {kind}, base: 1000, "
            f"gamma: 0.12, power: 1, lambda_min: 5, iteration: 3, "
            f"weight_filler: {{type: xavier}}}}\n")
    layer = build(text, [(4, 6), (4,)]).double()
    x = rand(4, 6, seed=1).requires_grad_()
    label = torch.tensor([0.0, 3.0, 4.0, 3.0])
    top, lam = layer(x, label)
    want_lam = max(np.float32(1000) * np.float32(1 + 0.12 * 4) ** np.float32(-1), 5)
    assert float(lam) == pytest.approx(float(want_lam), rel=1e-6)  # iteration 3 + 1 forward
    w = layer.weight.detach().numpy()
    np.testing.assert_allclose(np.linalg.norm(w, axis=1), 1.0, rtol=1e-12)  # normalised
    grad = rand(4, 5, seed=2)
    want_top, want_gx, want_gw = sphereface_loops(x.detach().numpy(), w, label.numpy(), m,
                                                  float(lam), grad.numpy())
    np.testing.assert_allclose(top.detach().numpy(), want_top, rtol=1e-10, atol=1e-12)
    top.backward(grad)
    np.testing.assert_allclose(x.grad.numpy(), want_gx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer.weight.grad.numpy(), want_gw, rtol=1e-10, atol=1e-12)


def test_margin_inner_product_single_is_a_normalised_inner_product():
    layer = build("name: fc\ntype: MarginInnerProduct\nbottom: [x, label]\ntop: fc\n"
                  "margin_inner_product_param: {num_output: 3, weight_filler: {type: gaussian}}\n",
                  [(2, 4), (2,)]).double()
    x = rand(2, 4, seed=3)
    top = layer(x, torch.tensor([1.0, 2.0]))
    w = layer.weight.detach()
    assert torch.allclose(w.norm(dim=1), torch.ones(3, dtype=torch.float64))
    assert torch.allclose(top, x @ w.t())
    with pytest.raises(DataError):
        layer(x, torch.tensor([1.0, 3.0]))


def test_label_specific_add_subtracts_the_margin_in_train_only():
    text = ("name: am\ntype: LabelSpecificAdd\nbottom: [s, label]\ntop: [out, bias]\n"
            "label_specific_add_param: {bias: -0.35}\n")
    scores = torch.tensor([[0.9, 0.1, 0.2], [0.3, 0.2, 0.1], [0.0, 0.5, 0.36]],
                          dtype=torch.float64, requires_grad=True)
    label = torch.tensor([0.0, 0.0, 2.0])
    train = build(text, [(3, 3), (3,)])
    out, bias = train(scores, label)
    # the label's score minus 0.35 where it is above 0.35 (row 1's 0.3 is not)
    want = scores.detach().clone()
    want[0, 0] -= 0.35
    want[2, 2] -= 0.35
    assert torch.allclose(out, want) and float(bias) == pytest.approx(-0.35)
    out.sum().backward()
    assert torch.equal(scores.grad, torch.ones_like(scores))
    test = build(text, [(3, 3), (3,)], phase="TEST")
    assert torch.equal(test(scores, label)[0], scores)
    assert gradcheck(train, scores.detach(), label + 0.5)  # labels truncate: away from kinks


def test_label_specific_add_anneals_its_bias():
    layer = build("name: am\ntype: LabelSpecificAdd\nbottom: [s, label]\ntop: [out, bias]\n"
                  "label_specific_add_param: {iteration: 0, bias_base: 0, bias_gamma: -5e-05, "
                  "bias_power: 1, bias_min: -0.4, bias_max: 0}\n", [(2, 2), (2,)])
    biases = [float(layer(torch.ones(2, 2), torch.zeros(2))[1]) for _ in range(3)]
    assert biases == pytest.approx([0.0, -5e-05, -1e-04], abs=1e-7)  # float32, as the fork


def center_loss_loops(x: np.ndarray, centers: np.ndarray, label: np.ndarray,
                      loss_weight: float) -> tuple[float, np.ndarray, np.ndarray]:
    """caffe-face's center_loss_layer.cpp: loss, x's gradient, the centers' gradient."""
    m = x.shape[0]
    diff = x - centers[label.astype(int)]
    loss = (diff ** 2).sum() / m / 2
    gc = np.zeros_like(centers)
    for n in range(centers.shape[0]):
        total, seen = np.zeros(centers.shape[1]), 0
        for i in range(m):
            if int(label[i]) == n:
                seen += 1
                total -= diff[i]
        gc[n] += total / (seen + 1)
    return loss, diff * loss_weight / m, gc


def test_center_loss_gives_caffe_faces_gradients():
    layer = build("name: c\ntype: CenterLoss\nbottom: [x, label]\ntop: loss\n"
                  "center_loss_param: {num_output: 4, center_filler: {type: gaussian}}\n",
                  [(5, 3), (5,)]).double()
    assert layer.is_loss
    x = rand(5, 3, seed=4).requires_grad_()
    label = torch.tensor([0.0, 2.0, 2.0, 1.0, 2.0])
    loss = layer(x, label)
    want, gx, gc = center_loss_loops(x.detach().numpy(), layer.centers.detach().numpy(),
                                     label.numpy(), 0.5)
    assert loss.item() == pytest.approx(want, rel=1e-12)
    (0.5 * loss).backward()  # a loss weight scales x's gradient, not the centers'
    np.testing.assert_allclose(x.grad.numpy(), gx, rtol=1e-12)
    np.testing.assert_allclose(layer.centers.grad.numpy(), gc, rtol=1e-12)
