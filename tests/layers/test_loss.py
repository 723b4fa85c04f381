"""Loss layers and Accuracy against explicit-loop references of Caffe 1.0's code."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from layer_helpers import build

from caffe_py.errors import DataError, NetError

FLT_MIN = float(np.finfo(np.float32).tiny)


def spec(kind: str, params: str = "", tops: str = "loss", bottoms: str = "score, label") -> str:
    return f"""
layer:
  - name: l
    type: {kind}
    bottom: [{bottoms}]
    top: [{tops}]
{params}"""


# --- SoftmaxWithLoss ----------------------------------------------------------------------

def np_softmax_loss(scores: np.ndarray, labels: np.ndarray, axis: int, mode: str,
                    ignore: int | None) -> float:
    """Caffe's Forward_cpu: loop over (outer, inner) positions."""
    outer = int(np.prod(scores.shape[:axis]))
    classes = scores.shape[axis]
    s = scores.reshape(outer, classes, -1)
    inner = s.shape[2]
    lab = labels.reshape(outer, inner)
    loss, valid = 0.0, 0
    for i in range(outer):
        for j in range(inner):
            label = int(lab[i, j])
            if ignore is not None and label == ignore:
                continue
            z = s[i, :, j] - s[i, :, j].max()
            p = np.exp(z) / np.exp(z).sum()
            loss -= math.log(max(p[label], FLT_MIN))
            valid += 1
    n = {"FULL": outer * inner, "VALID": valid if ignore is not None else outer * inner,
         "BATCH_SIZE": outer, "NONE": 1}[mode]
    return loss / max(1.0, n)


@pytest.mark.parametrize("mode", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
@pytest.mark.parametrize("ignore", [None, 2])
def test_softmax_loss_normalizations_with_spatial_labels(mode, ignore):
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(3, 4, 2, 5)) * 3
    labels = rng.integers(0, 4, size=(3, 2, 5)).astype(np.float32)
    block = f"    loss_param: {{normalization: {mode}"
    block += f", ignore_label: {ignore}}}\n" if ignore is not None else "}\n"
    layer = build(spec("SoftmaxWithLoss", block), [scores.shape, labels.shape])
    assert layer.is_loss
    loss = layer(torch.from_numpy(scores), torch.from_numpy(labels))
    assert loss.shape == ()
    assert float(loss) == pytest.approx(np_softmax_loss(scores, labels, 1, mode, ignore),
                                        rel=1e-12)


def test_pre_fixed_normalizer_of_r_fcn_divides_the_loss():
    rng = np.random.default_rng(2)
    scores = rng.normal(size=(3, 4))
    labels = np.array([0, 3, 1], dtype=np.float32)
    block = "    loss_param: {normalization: PRE_FIXED, pre_fixed_normalizer: 128}\n"
    layer = build(spec("SoftmaxWithLoss", block), [scores.shape, labels.shape])
    loss = layer(torch.from_numpy(scores), torch.from_numpy(labels))
    assert float(loss) == pytest.approx(np_softmax_loss(scores, labels, 1, "NONE", None) / 128,
                                        rel=1e-12)


@pytest.mark.parametrize("legacy,mode", [("true", "VALID"), ("false", "BATCH_SIZE")])
def test_softmax_loss_legacy_normalize_flag(legacy, mode):
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(4, 3, 2))
    labels = np.array([[0, 1], [2, 1], [1, 1], [0, 0]], dtype=np.float32)
    block = f"    loss_param: {{normalize: {legacy}, ignore_label: 1}}\n"
    layer = build(spec("SoftmaxWithLoss", block), [scores.shape, (4, 1, 2)])
    loss = layer(torch.from_numpy(scores), torch.from_numpy(labels.reshape(4, 1, 2)))
    assert float(loss) == pytest.approx(np_softmax_loss(scores, labels, 1, mode, 1), rel=1e-12)
    # an explicit normalization wins over the legacy flag
    block = f"    loss_param: {{normalize: {legacy}, normalization: NONE}}\n"
    layer = build(spec("SoftmaxWithLoss", block), [scores.shape, (4, 2)])
    loss = layer(torch.from_numpy(scores), torch.from_numpy(labels))
    assert float(loss) == pytest.approx(np_softmax_loss(scores, labels, 1, "NONE", None))


def test_softmax_loss_axis_and_probability_top():
    rng = np.random.default_rng(2)
    scores = rng.normal(size=(2, 3, 5))  # classes on the last axis
    labels = rng.integers(0, 5, size=(2, 3)).astype(np.float64)
    layer = build(spec("SoftmaxWithLoss", "    softmax_param: {axis: -1}\n", "loss, prob"),
                  [scores.shape, labels.shape])
    assert layer.top_shapes == [(), (2, 3, 5)]
    loss, prob = layer(torch.from_numpy(scores), torch.from_numpy(labels))
    assert float(loss) == pytest.approx(np_softmax_loss(scores, labels, 2, "VALID", None))
    e = np.exp(scores - scores.max(axis=2, keepdims=True))
    np.testing.assert_allclose(prob.detach().numpy(), e / e.sum(axis=2, keepdims=True),
                               rtol=1e-12)


def test_softmax_loss_clamps_at_flt_min_with_caffe_gradient():
    layer = build(spec("SoftmaxWithLoss", "    loss_param: {normalization: NONE}\n"),
                  [(1, 3), (1,)])
    scores = torch.tensor([[0.0, 200.0, 0.0]], requires_grad=True)
    loss = layer(scores, torch.tensor([0.0]))
    assert loss.item() == pytest.approx(-math.log(FLT_MIN), rel=1e-6)
    loss.backward()
    # Caffe's backward is p - onehot whether or not the log was clamped
    torch.testing.assert_close(scores.grad, torch.tensor([[-1.0, 1.0, 0.0]]))


def test_softmax_loss_gradient_matches_caffe_and_gradcheck():
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 4, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[0, 3], [255, 1], [2, 255]], dtype=torch.float64)
    layer = build(spec("SoftmaxWithLoss", "    loss_param: {ignore_label: 255}\n"),
                  [(3, 4, 2), (3, 2)])
    assert torch.autograd.gradcheck(lambda s: layer(s, labels), (scores,))
    layer(scores, labels).backward()
    p = torch.softmax(scores.detach(), dim=1)
    want = p.clone()
    for i in range(3):
        for j in range(2):
            label = int(labels[i, j])
            if label == 255:
                want[i, :, j] = 0
            else:
                want[i, label, j] -= 1
    torch.testing.assert_close(scores.grad, want / 4)  # 4 valid positions


def test_softmax_loss_label_range_is_a_data_error():
    layer = build(spec("SoftmaxWithLoss", "    loss_param: {ignore_label: -1}\n"),
                  [(3, 4), (3,)])
    scores = torch.zeros(3, 4)
    float(layer(scores, torch.tensor([-1.0, 3.0, 0.0])))  # the ignored -1 is fine
    with pytest.raises(DataError) as err:
        layer(scores, torch.tensor([1.0, 7.0, 4.0]))
    assert str(err.value) == ("<string>:3: layer[0]: layer 'l' (SoftmaxWithLoss): label 7 is "
                              "outside [0, 4) (4 classes); check the data's labels, or set "
                              "loss_param.ignore_label: 7 to skip them")
    unchecked = build(spec("SoftmaxWithLoss"), [(3, 4), (3,)], check_labels=False)
    assert math.isfinite(float(unchecked(scores, torch.tensor([1.0, 7.0, -4.0]))))


def test_softmax_loss_shape_errors():
    with pytest.raises(NetError) as err:
        build(spec("SoftmaxWithLoss"), [(2, 4, 3, 3), (2, 3)])
    assert str(err.value) == (
        "<string>:3: layer[0]: layer 'l' (SoftmaxWithLoss): bottom 'label' (index 1) has shape "
        "[2, 3] (6 labels) but bottom 'score' of shape [2, 4, 3, 3] needs 18, one per position "
        "outside the class axis 1; give the labels the shape [2, 3, 3]")
    with pytest.raises(NetError) as err:
        build(spec("SoftmaxWithLoss", bottoms="score"), [(2, 4)])
    assert str(err.value) == ("<string>:3: layer[0]: layer 'l' (SoftmaxWithLoss): takes "
                              "exactly 2 bottom(s), got 1")
    with pytest.raises(NetError) as err:
        build(spec("SoftmaxWithLoss", "    softmax_param: {axis: 2}\n"), [(2, 4), (2,)])
    assert str(err.value) == ("<string>:3: layer[0]: layer 'l' (SoftmaxWithLoss): axis 2 is "
                              "out of range for a blob with 2 axes")


# --- EuclideanLoss ------------------------------------------------------------------------

def test_euclidean_loss_value_and_gradients_of_both_bottoms():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(4, 3, 2)), rng.normal(size=(4, 6))
    layer = build(spec("EuclideanLoss", bottoms="a, b"), [a.shape, b.shape])
    assert layer.is_loss
    ta = torch.from_numpy(a).requires_grad_()
    tb = torch.from_numpy(b).requires_grad_()
    loss = layer(ta, tb)
    assert loss.item() == pytest.approx(((a.reshape(4, 6) - b) ** 2).sum() / 8, rel=1e-12)
    loss.backward()
    np.testing.assert_allclose(ta.grad.numpy(), (a - b.reshape(a.shape)) / 4, rtol=1e-12)
    np.testing.assert_allclose(tb.grad.numpy(), (b - a.reshape(b.shape)) / 4, rtol=1e-12)
    assert torch.autograd.gradcheck(layer, (ta, tb))


def test_euclidean_loss_shape_error():
    with pytest.raises(NetError) as err:
        build(spec("EuclideanLoss", bottoms="a, b"), [(4, 3), (4, 2)])
    assert str(err.value) == ("<string>:3: layer[0]: layer 'l' (EuclideanLoss): bottom 'b' "
                              "(index 1) has shape [4, 2] but bottom 'a' has shape [4, 3]; both "
                              "bottoms need the same first axis and count per item")


# --- SigmoidCrossEntropyLoss --------------------------------------------------------------

def np_sigmoid_ce(x: np.ndarray, t: np.ndarray, mode: str, ignore: int | None) -> float:
    """Caffe 1.0's loop: loss -= x (t - (x >= 0)) - log(1 + exp(x - 2 x (x >= 0)))."""
    loss, valid = 0.0, 0
    for xi, ti in zip(x.flatten(), t.flatten(), strict=True):
        if ignore is not None and int(ti) == ignore:
            continue
        pos = float(xi >= 0)
        loss -= xi * (ti - pos) - math.log(1 + math.exp(xi - 2 * xi * pos))
        valid += 1
    n = {"FULL": x.size, "VALID": valid, "BATCH_SIZE": x.shape[0], "NONE": 1}[mode]
    return loss / max(1.0, n)


@pytest.mark.parametrize("block,mode,ignore", [
    ("", "BATCH_SIZE", None),  # Caffe 1.0's default for this layer
    ("    loss_param: {normalization: FULL}\n", "FULL", None),
    ("    loss_param: {normalization: VALID, ignore_label: -1}\n", "VALID", -1),
    ("    loss_param: {normalize: true}\n", "VALID", None),
    ("    loss_param: {normalization: NONE, ignore_label: -1}\n", "NONE", -1),
])
def test_sigmoid_cross_entropy_normalizations(block, mode, ignore):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3, 2, 4)) * 30  # large logits: the stable form matters
    t = rng.integers(0, 2, size=(3, 8)).astype(np.float64)
    t[0, :3] = -1
    t[2, 5] = 0.25
    layer = build(spec("SigmoidCrossEntropyLoss", block, bottoms="x, t"), [x.shape, t.shape])
    assert layer.is_loss
    loss = layer(torch.from_numpy(x), torch.from_numpy(t))
    want = np_sigmoid_ce(x, t.reshape(x.shape), mode, ignore)
    assert float(loss) == pytest.approx(want, rel=1e-12)


def test_sigmoid_cross_entropy_gradient_and_ignored_positions():
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([[1.0, 0.0, -1.0], [0.5, -1.0, 1.0]], dtype=torch.float64,
                     requires_grad=True)
    layer = build(spec("SigmoidCrossEntropyLoss", "    loss_param: {ignore_label: -1}\n",
                       bottoms="x, t"), [(2, 3), (2, 3)])
    assert torch.autograd.gradcheck(lambda x: layer(x, t), (x,))
    layer(x, t).backward()
    keep = (t != -1).double()
    torch.testing.assert_close(x.grad, (torch.sigmoid(x) - t).detach() * keep / 2)
    assert t.grad is None  # targets get no gradient, as in Caffe


def test_sigmoid_cross_entropy_count_error():
    with pytest.raises(NetError) as err:
        build(spec("SigmoidCrossEntropyLoss", bottoms="x, t"), [(2, 3), (2, 4)])
    assert str(err.value) == (
        "<string>:3: layer[0]: layer 'l' (SigmoidCrossEntropyLoss): bottom 't' (index 1) has "
        "shape [2, 4] (8 targets) but bottom 'x' has shape [2, 3] (6 values); give one target "
        "per input value")


# --- Accuracy -----------------------------------------------------------------------------

def np_accuracy(scores: np.ndarray, labels: np.ndarray, top_k: int,
                ignore: int | None) -> tuple[float, np.ndarray]:
    """Caffe 1.0's rule: a hit when fewer than k other classes score at least the label's."""
    classes = scores.shape[1]
    s = scores.reshape(scores.shape[0], classes, -1)
    lab = labels.reshape(s.shape[0], s.shape[2])
    hits, total = 0, 0
    per_hit, per_n = np.zeros(classes), np.zeros(classes)
    for i in range(s.shape[0]):
        for j in range(s.shape[2]):
            label = int(lab[i, j])
            if ignore is not None and label == ignore:
                continue
            at_least = sum(s[i, k, j] >= s[i, label, j] for k in range(classes) if k != label)
            hit = at_least < top_k
            hits += hit
            total += 1
            per_hit[label] += hit
            per_n[label] += 1
    per_class = np.divide(per_hit, per_n, out=np.zeros(classes), where=per_n > 0)
    return (hits / total if total else 0.0), per_class


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_accuracy_top_k_with_ties_spatial_and_per_class(top_k):
    rng = np.random.default_rng(7)
    scores = rng.integers(0, 3, size=(6, 5, 2, 2)).astype(np.float32)  # many ties
    labels = rng.integers(0, 5, size=(6, 1, 2, 2)).astype(np.float32)
    labels[0, 0, 0, 0] = 4
    block = f"    accuracy_param: {{top_k: {top_k}, ignore_label: 4}}\n"
    layer = build(spec("Accuracy", block, tops="acc, per_class"),
                  [scores.shape, labels.shape])
    assert not layer.is_loss
    assert layer.top_shapes == [(), (5,)]
    acc, per_class = layer(torch.from_numpy(scores), torch.from_numpy(labels))
    want, want_per_class = np_accuracy(scores, labels, top_k, 4)
    assert float(acc) == pytest.approx(want, rel=1e-6)
    np.testing.assert_allclose(per_class.numpy(), want_per_class, rtol=1e-6)
    assert want_per_class[4] == 0.0


def test_accuracy_tie_goes_against_the_label():
    # Caffe 1.0 (accuracy_layer.cpp) counts every other class scoring >= the label's as
    # better, whatever its index (rc3 sorted (score, class) pairs and let the higher win)
    layer = build(spec("Accuracy"), [(4, 3), (4,)])
    scores = torch.tensor([[1.0, 1.0, 0.0]] * 3 + [[0.0, 2.0, 2.0]])
    acc = layer(scores, torch.tensor([1.0, 0.0, 2.0, 2.0]))
    assert float(acc) == 0.0  # both tied labels lose; label 2 of row 2 is below both
    top2 = build(spec("Accuracy", "    accuracy_param: {top_k: 2}\n"), [(4, 3), (4,)])
    assert float(top2(scores, torch.tensor([1.0, 0.0, 2.0, 2.0]))) == 0.75


def test_accuracy_axis_no_gradient_and_all_ignored():
    layer = build(spec("Accuracy", "    accuracy_param: {axis: 2, ignore_label: 0}\n"),
                  [(2, 3, 4), (2, 3)])
    scores = torch.randn(2, 3, 4, requires_grad=True)
    acc = layer(scores, torch.zeros(2, 3))
    assert float(acc) == 0.0 and not acc.requires_grad
    labels = scores.detach().argmax(dim=2).float()
    labels[0, 0] = 0.0
    assert float(layer(scores, labels)) == 1.0


def test_accuracy_errors():
    with pytest.raises(NetError) as err:
        build(spec("Accuracy", "    accuracy_param: {top_k: 4}\n"), [(2, 3), (2,)])
    assert str(err.value) == ("<string>:3: layer[0]: layer 'l' (Accuracy): top_k 4 exceeds the "
                              "3 classes of bottom 'score'; use accuracy_param.top_k <= 3")
    layer = build(spec("Accuracy"), [(2, 3), (2,)])
    with pytest.raises(DataError) as err:
        layer(torch.zeros(2, 3), torch.tensor([-2.0, 1.0]))
    assert str(err.value) == ("<string>:3: layer[0]: layer 'l' (Accuracy): label -2 is outside "
                              "[0, 3) (3 classes); check the data's labels, or set "
                              "accuracy_param.ignore_label: -2 to skip them")


# --- MultinomialLogisticLoss and InfogainLoss ---------------------------------------------

LOG_THRESHOLD = float(np.float32(1e-20))


def test_multinomial_logistic_loss_value_floor_and_caffe_gradient():
    layer = build(spec("MultinomialLogisticLoss", bottoms="prob, label"), [(3, 4), (3,)])
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.0, 0.5, 0.5, 0.0], [0.25] * 4],
                         dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([3.0, 0.0, 1.0])
    loss = layer(probs, labels)
    want = -(math.log(0.4) + math.log(LOG_THRESHOLD) + math.log(0.25)) / 3
    assert loss.item() == pytest.approx(want, rel=1e-12)
    loss.backward()
    grad = np.zeros((3, 4))
    grad[[0, 1, 2], [3, 0, 1]] = [-1 / (3 * 0.4), -1 / (3 * LOG_THRESHOLD), -1 / (3 * 0.25)]
    np.testing.assert_allclose(probs.grad.numpy(), grad, rtol=1e-12)
    with pytest.raises(NetError, match="needs one label per item"):
        build(spec("MultinomialLogisticLoss", bottoms="prob, label"), [(3, 4), (3, 2)])


def np_infogain(scores, labels, h, mode, ignore):
    """infogain_loss_layer.cpp Forward_cpu with the class axis 1."""
    outer, classes = scores.shape[:2]
    s = scores.reshape(outer, classes, -1)
    lab = labels.reshape(outer, -1)
    loss, count = 0.0, 0
    for i in range(outer):
        for j in range(s.shape[2]):
            label = int(lab[i, j])
            if ignore is not None and label == ignore:
                continue
            p = np.exp(s[i, :, j] - s[i, :, j].max())
            p /= p.sum()
            loss -= sum(h[label, k] * math.log(max(p[k], LOG_THRESHOLD))
                        for k in range(classes))
            count += 1
    n = {"FULL": outer * s.shape[2], "VALID": count if ignore is not None else
         outer * s.shape[2], "BATCH_SIZE": outer, "NONE": 1}[mode]
    return loss / max(1, n)


@pytest.mark.parametrize(("mode", "ignore"), [("VALID", None), ("VALID", 1), ("FULL", 1),
                                              ("NONE", None)])
def test_infogain_loss_with_a_third_bottom(mode, ignore):
    block = f"    loss_param: {{normalization: {mode}" + (
        f", ignore_label: {ignore}}}\n" if ignore is not None else "}\n")
    layer = build(spec("InfogainLoss", block, bottoms="score, label, H"),
                  [(2, 3, 2, 2), (2, 2, 2), (3, 3)])
    rng = np.random.default_rng(4)
    scores, h = rng.normal(size=(2, 3, 2, 2)), rng.uniform(size=(3, 3))
    labels = rng.integers(0, 3, size=(2, 2, 2)).astype(np.float64)
    x = torch.from_numpy(scores).requires_grad_()
    loss = layer(x, torch.from_numpy(labels), torch.from_numpy(h))
    assert loss.item() == pytest.approx(np_infogain(scores, labels, h, mode, ignore), rel=1e-10)
    assert torch.autograd.gradcheck(
        lambda v: layer.double()(v, torch.from_numpy(labels), torch.from_numpy(h)), (x,))


def test_infogain_loss_reads_h_from_a_binaryproto(tmp_path):
    from caffe_py.io.formats.blobproto import blob_from_array, write_blob_file
    h = np.arange(16, dtype=np.float32).reshape(4, 4) / 10
    write_blob_file(tmp_path / "h.binaryproto", blob_from_array(h))
    block = f"    infogain_loss_param: {{source: {tmp_path / 'h.binaryproto'}}}\n"
    layer = build(spec("InfogainLoss", block, tops="loss, prob"), [(3, 4), (3,)])
    assert layer.blob_names == [] and layer.top_shapes == [(), (3, 4)]
    scores = np.random.default_rng(5).normal(size=(3, 4))
    labels = np.array([0.0, 3.0, 2.0])
    loss, prob = layer(torch.from_numpy(scores).float(), torch.from_numpy(labels))
    assert float(loss) == pytest.approx(np_infogain(scores, labels, h, "VALID", None),
                                        rel=1e-5)
    assert not prob.requires_grad  # Caffe's backward reads the loss top alone


def test_infogain_loss_errors(tmp_path):
    with pytest.raises(NetError, match="infogain_loss_param.source is not set and there is no "
                                       "third bottom"):
        build(spec("InfogainLoss"), [(3, 4), (3,)])
    with pytest.raises(NetError, match="infogain_loss_param.source: .*file not found"):
        build(spec("InfogainLoss", f"    infogain_loss_param: {{source: {tmp_path}/no}}\n"),
              [(3, 4), (3,)])
    with pytest.raises(NetError, match="loss_param.normalize is deprecated and InfogainLoss "
                                       "refuses it"):
        build(spec("InfogainLoss", "    loss_param: {normalize: true}\n",
                   bottoms="score, label, H"), [(3, 4), (3,), (4, 4)])
    with pytest.raises(NetError, match=r"\(the infogain matrix\) has shape \[3, 3\]"):
        build(spec("InfogainLoss", bottoms="score, label, H"), [(3, 4), (3,), (3, 3)])
