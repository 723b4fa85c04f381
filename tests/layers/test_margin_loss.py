"""ContrastiveLoss and HingeLoss against explicit loops of Caffe 1.0's code."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from layer_helpers import build

from caffe_py.errors import NetError


def spec(kind: str, block: str = "", bottoms: str = "a, b, sim") -> str:
    return f"name: l\ntype: {kind}\nbottom: [{bottoms}]\ntop: loss\n{block}\n"


def np_contrastive(a, b, sim, margin, legacy):
    """Forward_cpu and Backward_cpu (with its dist + 1e-4) of contrastive_loss_layer.cpp."""
    n = a.shape[0]
    loss, grad = 0.0, np.zeros_like(a)
    for i in range(n):
        diff = a[i] - b[i]
        d2 = float(diff @ diff)
        if int(sim[i]):
            loss += d2
            grad[i] = diff / n
        elif legacy:
            loss += max(margin - d2, 0.0)
            grad[i] = -diff / n if margin - d2 > 0 else 0.0
        else:
            d = math.sqrt(d2)
            loss += max(margin - d, 0.0) ** 2
            grad[i] = -(margin - d) / (d + 1e-4) * diff / n if margin - d > 0 else 0.0
    return loss / n / 2, grad


@pytest.mark.parametrize(("block", "margin", "legacy"), [
    ("", 1.0, False), ("contrastive_loss_param: {margin: 2, legacy_version: true}", 2.0, True),
    ("contrastive_loss_param: {margin: 2}", 2.0, False)])
def test_contrastive_loss_value_and_caffes_gradient(block, margin, legacy):
    rng = np.random.default_rng(0)
    a, b = rng.normal(scale=0.6, size=(8, 3)), rng.normal(scale=0.6, size=(8, 3))
    sim = np.array([1, 0, 0, 1, 0, 0, 1, 0], dtype=np.float64)
    layer = build(spec("ContrastiveLoss", block), [(8, 3, 1, 1), (8, 3, 1, 1), (8, 1, 1, 1)])
    ta = torch.from_numpy(a.reshape(8, 3, 1, 1)).requires_grad_()
    tb = torch.from_numpy(b.reshape(8, 3, 1, 1)).requires_grad_()
    loss = layer(ta, tb, torch.from_numpy(sim))
    want, grad = np_contrastive(a, b, sim, margin, legacy)
    assert loss.item() == pytest.approx(want, rel=1e-12)
    (3 * loss).backward()
    np.testing.assert_allclose(ta.grad.numpy().reshape(8, 3), 3 * grad, rtol=1e-12)
    np.testing.assert_allclose(tb.grad.numpy().reshape(8, 3), -3 * grad, rtol=1e-12)


def test_contrastive_loss_shape_errors():
    with pytest.raises(NetError, match=r"bottom 'a' \(index 0\) has shape \[4, 3, 2, 1\]"):
        build(spec("ContrastiveLoss"), [(4, 3, 2, 1), (4, 3, 2, 1), (4,)])
    with pytest.raises(NetError, match="expected one similarity flag per pair"):
        build(spec("ContrastiveLoss"), [(4, 3), (4, 3), (3,)])


def np_hinge(scores, labels, squared):
    n = scores.shape[0]
    t = scores.reshape(n, -1).copy()
    t[np.arange(n), labels.astype(int)] *= -1
    t = np.maximum(0, 1 + t)
    return ((t * t).sum() if squared else t.sum()) / n


@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_hinge_loss_value_and_gradcheck(norm):
    layer = build(spec("HingeLoss", f"hinge_loss_param: {{norm: {norm}}}", "s, label"),
                  [(4, 3, 2), (4,)])
    rng = np.random.default_rng(1)
    scores, labels = rng.normal(size=(4, 3, 2)), rng.integers(0, 6, 4).astype(np.float64)
    x = torch.from_numpy(scores).requires_grad_()
    assert layer(x, torch.from_numpy(labels)).item() == pytest.approx(
        np_hinge(scores, labels, norm == "L2"), rel=1e-12)
    assert torch.autograd.gradcheck(lambda v: layer.double()(v, torch.from_numpy(labels)), (x,))


def test_hinge_loss_label_out_of_range_is_a_data_error():
    from caffe_py.errors import DataError
    layer = build(spec("HingeLoss", "", "s, label"), [(2, 3), (2,)])
    with pytest.raises(DataError) as err:
        layer(torch.zeros(2, 3), torch.tensor([0.0, 3.0]))
    assert str(err.value) == ("<string>:1: layer[0]: layer 'l' (HingeLoss): label 3 is outside "
                              "[0, 3) (3 classes); check the data's labels")
