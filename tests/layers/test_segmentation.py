"""The segmentation forks' layers (BN, Upsample, Interp, SegAccuracy) against loop references
written from the forks' sources, float64 gradchecks, and the errors that tell two forks' layers
of one name apart. tests/golden/forks compares them with the genuine forks."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from layer_helpers import build, gradcheck, rand

from caffe_py.errors import DataError, NetError, SpecError


def bn(params: str, tops: str = "y", extra: str = "") -> str:
    return f"name: bn\ntype: BN\nbottom: x\ntop: [{tops}]\n{extra}bn_param: {params}\n"


SEGNET = "{scale_filler: {type: gaussian}, shift_filler: {type: gaussian}}"
PSPNET = "{slope_filler: {type: gaussian}, bias_filler: {type: gaussian}, momentum: 0.8}"


# --- BN -------------------------------------------------------------------------------------
def segnet_bn_loops(x: np.ndarray, scale: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """caffe-segnet's LEARN forward: E[x] and E[x^2] over H x W then N, var = E[x^2] - E[x]^2,
    y = (x - E[x]) / sqrt(var + 1e-9) * scale + shift."""
    n, c, h, w = x.shape
    y = np.empty_like(x)
    for k in range(c):
        mean = sum(x[i, k].mean() for i in range(n)) / n
        sq = sum((x[i, k] ** 2).mean() for i in range(n)) / n
        y[:, k] = (x[:, k] - mean) / np.sqrt(sq - mean ** 2 + 1e-9) * scale[k] + shift[k]
    return y


def test_segnet_bn_learn_uses_the_batch_statistics_in_both_phases():
    x = rand(3, 2, 4, 5, seed=1) * 2 + 1
    for phase in ("TRAIN", "TEST"):
        layer = build(bn(SEGNET, "y, mean, var"), [x.shape], phase=phase).double()
        y, mean, var = layer(x)
        want = segnet_bn_loops(x.numpy(), layer.scale.detach().numpy().ravel(),
                               layer.shift.detach().numpy().ravel())
        np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-10, atol=1e-12)
        assert mean.shape == var.shape == (1, 2, 1, 1)
        np.testing.assert_allclose(var.numpy().ravel(), x.numpy().var(axis=(0, 2, 3)),
                                   rtol=1e-10)
    assert layer.variant == "SegNet" and layer.blob_names == ["scale", "shift"]
    assert gradcheck(build(bn(SEGNET), [(2, 3, 2, 3)]), rand(2, 3, 2, 3, seed=2))


def test_segnet_bn_inference_is_scale_and_shift():
    layer = build(bn("{bn_mode: INFERENCE, scale_filler: {type: constant, value: 2}, "
                     "shift_filler: {type: constant, value: 0.5}}"), [(2, 3, 2, 2)]).double()
    x = rand(2, 3, 2, 2, seed=3)
    assert torch.allclose(layer(x), 2 * x + 0.5)
    assert gradcheck(layer, x)


def test_pspnet_bn_train_moves_the_running_statistics_and_test_reads_them():
    x = rand(3, 2, 4, 4, seed=4) * 3 + 2
    train = build(bn(PSPNET), [x.shape], phase="TRAIN").double()
    assert train.variant == "PSPNet"
    assert train.blob_names == ["slope", "bias", "running_mean", "running_var"]
    assert [n for n, _ in train.named_parameters()] == ["slope", "bias"]
    y = train(x)
    mean, var = x.mean(dim=(0, 2, 3)), x.var(dim=(0, 2, 3), unbiased=False)
    slope, bias = train.slope.detach().ravel(), train.bias.detach().ravel()
    want = ((x - mean.view(1, -1, 1, 1)) / torch.sqrt(var.view(1, -1, 1, 1) + 1e-5)
            * slope.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1))
    assert torch.allclose(y, want)
    assert torch.allclose(train.running_mean.ravel(), 0.2 * mean)  # 0.8 * 0 + 0.2 * batch
    assert torch.allclose(train.running_var.ravel(), 0.2 * var)
    test = build(bn(PSPNET), [x.shape], phase="TEST").double()
    test.load_state_dict(train.state_dict())
    rm, rv = train.running_mean, train.running_var
    assert torch.allclose(test(x), (x - rm) / torch.sqrt(rv + 1e-5) * train.slope + train.bias)
    assert gradcheck(build(bn(PSPNET), [(2, 2, 3, 3)]), rand(2, 2, 3, 3, seed=5))


def test_pspnet_bn_frozen_learns_nothing_and_starts_at_unit_variance():
    layer = build(bn("{frozen: true, slope_filler: {type: constant, value: 1}}"),
                  [(2, 2, 3, 3)])
    assert list(layer.named_parameters()) == []
    assert layer.running_var.ravel().tolist() == [1.0, 1.0]
    x = rand(2, 2, 3, 3, seed=6).float().requires_grad_()
    y = layer(x)
    assert torch.allclose(y, x / np.sqrt(1 + 1e-5))
    y.sum().backward()
    assert torch.allclose(x.grad, torch.full_like(x, 1 / np.sqrt(1 + 1e-5)))


def test_bn_fields_or_param_count_decide_the_fork_and_neither_is_an_error():
    assert build(bn("{}", extra="param: [{lr_mult: 1}, {lr_mult: 1}]\n"),
                 [(1, 2, 2, 2)]).variant == "SegNet"
    assert build(bn("{}", extra="param: [{}, {}, {lr_mult: 0}, {lr_mult: 0}]\n"),
                 [(1, 2, 2, 2)]).variant == "PSPNet"
    with pytest.raises(NetError) as err:
        build(bn("{}"), [(1, 2, 2, 2)])
    assert str(err.value) == (
        "<string>:1: layer[0]: layer 'bn' (BN): bn_param gives no field of either BN: "
        "SegNet/ENet's BN (alexgkendall/caffe-segnet) (bn_mode, scale_filler, shift_filler; 2 "
        "blobs) or PSPNet's BN (hszhao/PSPNet, also TSN's) (slope_filler, bias_filler, momentum, "
        "eps, frozen; 4 blobs), and the layer has 0 param entries; write bn_param { bn_mode: "
        "LEARN } for SegNet's, or bn_param { frozen: false } for PSPNet's")
    with pytest.raises(SpecError) as spec_err:
        build(bn("{bn_mode: LEARN, frozen: true}"), [(1, 2, 2, 2)])
    assert str(spec_err.value) == (
        "<string>:5: layer[0].bn_param.frozen: bn_param mixes SegNet/ENet's BN "
        "(alexgkendall/caffe-segnet) field bn_mode with PSPNet's BN (hszhao/PSPNet, also "
        "TSN's) field frozen; keep the fields of one of the two layers")


# --- Upsample -------------------------------------------------------------------------------
def unpool_loops(x: np.ndarray, mask: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """caffe-segnet's forward: top[mask[i]] = bottom[i], in order, per (n, c) plane."""
    n, c = x.shape[:2]
    top = np.zeros((n, c, out_h * out_w), x.dtype)
    for i in range(n):
        for k in range(c):
            for j, value in enumerate(x[i, k].ravel()):
                top[i, k, int(mask[i, k].ravel()[j])] = value
    return top.reshape(n, c, out_h, out_w)


def unpool_net(pool: str, upsample: str) -> str:
    return f"""
layer:
  - {{name: pool, type: Pooling, bottom: x, top: [p, mask], pooling_param: {pool}}}
  - {{name: up, type: Upsample, bottom: [p, mask], top: y, upsample_param: {upsample}}}
"""


@pytest.mark.parametrize("pool,upsample,shape,out", [
    ("{kernel_size: 2, stride: 2}", "{scale: 2}", (2, 3, 6, 8), (6, 8)),
    ("{kernel_size: 2, stride: 2}", "{scale: 2, upsample_h: 7, upsample_w: 9}", (1, 2, 7, 9),
     (7, 9)),
    ("{kernel_size: 2, stride: 2}", "{scale: 2, pad_out_h: true}", (1, 2, 7, 8), (7, 8)),
    ("{kernel_size: 3, stride: 2}", "{upsample_h: 7, upsample_w: 7}", (1, 2, 7, 7), (7, 7)),
])
def test_upsample_unpools_to_the_mask_positions(pool, upsample, shape, out):
    from caffe_py.net import Net
    from caffe_py.spec.net_spec import parse_net
    from caffe_py.spec.schema import Source
    from caffe_py.spec.yamlio import loads

    text = f"input: x\ninput_shape: {{dim: {list(shape)}}}\n" + unpool_net(pool, upsample)
    net = Net(parse_net(loads(text), Source()), "TRAIN")
    x = rand(*shape, seed=7).float().requires_grad_()
    pooled, mask = net.layers[1](x)
    up = net.layers[2]
    assert up.top_shapes == [(*shape[:2], *out)]
    y = up(pooled, mask)
    want = unpool_loops(pooled.detach().numpy(), mask.numpy(), *out)
    assert np.array_equal(y.detach().numpy(), want)
    grad = rand(*y.shape, seed=8).float()
    p = pooled.detach().requires_grad_()
    up(p, mask).backward(grad)
    # the fork's backward: each value's gradient is the top's at its mask position
    want_grad = grad.reshape(*shape[:2], -1).gather(2, mask.reshape(*shape[:2], -1).long())
    assert torch.equal(p.grad.reshape(*shape[:2], -1), want_grad)


def test_upsample_with_one_bottom_is_nearest_neighbour():
    layer = build("name: u\ntype: Upsample\nbottom: x\ntop: y\nupsample_param: {scale: 3}\n",
                  [(1, 2, 2, 3)]).double()
    x = rand(1, 2, 2, 3, seed=9)
    y = layer(x)
    assert y.shape == (1, 2, 6, 9)
    assert torch.equal(y[:, :, 4, 7], x[:, :, 1, 2])
    assert gradcheck(layer, x)


def test_upsample_errors_name_the_two_forks():
    with pytest.raises(NetError) as err:
        build("name: u\ntype: Upsample\nbottom: x\ntop: y\nupsample_param: {upsample_h: 4, "
              "upsample_w: 4}\n", [(1, 1, 2, 2)])
    assert str(err.value) == (
        "<string>:1: layer[0]: layer 'u' (Upsample): has one bottom, which makes it the YOLOv3 "
        "ports' nearest-neighbour Upsample (upsample_param {scale}), but upsample_h is a field of "
        "SegNet's max-unpooling Upsample, which takes the pooling mask as a second bottom "
        "(alexgkendall/caffe-segnet); give the Pooling layer's mask top as the second bottom "
        "(SegNet's), or only upsample_param { scale: S } (nearest-neighbour)")
    layer = build("name: u\ntype: Upsample\nbottom: [x, m]\ntop: y\nupsample_param: {}\n",
                  [(1, 1, 2, 2), (1, 1, 2, 2)])
    assert layer.top_shapes == [(1, 1, 4, 4)]  # SegNet's default scale 2
    with pytest.raises(DataError, match="the mask names position 16 of an output of 4 x 4"):
        layer(torch.ones(1, 1, 2, 2), torch.full((1, 1, 2, 2), 16.0))


# --- Interp ---------------------------------------------------------------------------------
def interp_loops(x: np.ndarray, out_h: int, out_w: int, begin: int = 0,
                 eff: tuple[int, int] | None = None) -> np.ndarray:
    """caffe_cpu_interp2 (non-packed) over one (H, W) plane per (n, c), float32 positions."""
    n, c, h, w = x.shape
    h1, w1 = eff or (h, w)
    y = np.zeros((n, c, out_h, out_w), x.dtype)
    rh = np.float32(h1 - 1) / np.float32(out_h - 1) if out_h > 1 else np.float32(0)
    rw = np.float32(w1 - 1) / np.float32(out_w - 1) if out_w > 1 else np.float32(0)
    for i in range(out_h):
        hr = np.float32(rh * np.float32(i))
        hi = int(hr)
        hp = 1 if hi < h1 - 1 else 0
        l1 = x.dtype.type(hr - np.float32(hi))
        for j in range(out_w):
            wr = np.float32(rw * np.float32(j))
            wi = int(wr)
            wp = 1 if wi < w1 - 1 else 0
            m1 = x.dtype.type(wr - np.float32(wi))
            a, b = begin + hi, begin + wi
            y[:, :, i, j] = ((1 - l1) * ((1 - m1) * x[:, :, a, b] + m1 * x[:, :, a, b + wp])
                             + l1 * ((1 - m1) * x[:, :, a + hp, b] + m1 * x[:, :, a + hp, b + wp]))
    return y


@pytest.mark.parametrize("param,shape,out", [
    ("{zoom_factor: 8}", (1, 2, 5, 4), (33, 25)),
    ("{shrink_factor: 2}", (2, 1, 9, 8), (5, 4)),
    ("{height: 7, width: 3}", (1, 2, 4, 6), (7, 3)),
    ("{shrink_factor: 2, zoom_factor: 3}", (1, 1, 9, 9), (13, 13)),
    ("{height: 1, width: 5}", (1, 1, 3, 3), (1, 5)),
])
def test_interp_matches_the_forks_loops(param, shape, out):
    layer = build(f"name: i\ntype: Interp\nbottom: x\ntop: y\ninterp_param: {param}\n", [shape])
    assert layer.top_shapes == [(*shape[:2], *out)]
    x = rand(*shape, seed=10).float()
    np.testing.assert_allclose(layer(x).numpy(), interp_loops(x.numpy(), *out), rtol=1e-6,
                               atol=1e-6)
    assert gradcheck(layer, x.double())


def test_interp_crops_with_negative_padding():
    layer = build("name: i\ntype: Interp\nbottom: x\ntop: y\ninterp_param: "
                  "{zoom_factor: 2, pad_beg: -1, pad_end: -2}\n", [(1, 1, 7, 7)])
    assert layer.top_shapes == [(1, 1, 7, 7)]  # 4 x 4 effective, zoomed by 2
    x = rand(1, 1, 7, 7, seed=11).float()
    np.testing.assert_allclose(layer(x).numpy(), interp_loops(x.numpy(), 7, 7, 1, (4, 4)),
                               rtol=1e-6, atol=1e-6)
    same = build("name: i\ntype: Interp\nbottom: x\ntop: y\ninterp_param: "
                 "{height: 4, width: 4, pad_beg: -1, pad_end: -2}\n", [(1, 1, 7, 7)])
    assert torch.equal(same(x), x[:, :, 1:5, 1:5])


# --- SegAccuracy ----------------------------------------------------------------------------
def seg_accuracy_loops(scores: np.ndarray, labels: np.ndarray, ignore: set[int],
                       matrix: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The fork's Forward_cpu and ConfusionMatrix: (accuracy, mean recall, mean Jaccard)."""
    n, c, h, w = scores.shape
    m = np.zeros((c, c), np.int64) if matrix is None else matrix
    for i in range(n):
        for y in range(h):
            for x in range(w):
                pairs = sorted(((scores[i, k, y, x], k) for k in range(c)), reverse=True)
                label = int(labels[i, 0, y, x])
                if label in ignore:
                    continue
                m[label, pairs[0][1]] += 1
    total, diag = m.sum(), np.trace(m)
    recalls = [m[k, k] / m[k].sum() for k in range(c) if m[k].sum() > 0]
    ious = [1.0 if m[k, k] == m[k].sum() + m[:, k].sum() - m[k, k] else
            m[k, k] / (m[k].sum() + m[:, k].sum() - m[k, k]) for k in range(c)]
    return np.array([diag / total if total else 0, np.mean(recalls) if recalls else 0,
                     np.mean(ious)]), m


def test_seg_accuracy_matches_the_forks_confusion_matrix():
    rng = np.random.default_rng(12)
    scores = rng.integers(0, 3, size=(2, 4, 5, 6)).astype(np.float32)  # many ties
    labels = rng.integers(0, 4, size=(2, 1, 5, 6)).astype(np.float32)
    labels[0, 0, :2] = 255
    layer = build("name: s\ntype: SegAccuracy\nbottom: [x, l]\ntop: [a, iou]\n"
                  "seg_accuracy_param: {ignore_label: [255, 3]}\n", [scores.shape, labels.shape])
    top, iou = layer(torch.from_numpy(scores), torch.from_numpy(labels))
    want, m = seg_accuracy_loops(scores, labels, {255, 3})
    assert top.shape == (1, 1, 1, 3)
    np.testing.assert_allclose(top.numpy().ravel(), want, rtol=1e-6)
    union = m.sum(0) + m.sum(1) - np.diag(m)
    np.testing.assert_allclose(iou.numpy(), np.where(union == np.diag(m), 1.0,
                                                     np.diag(m) / np.maximum(union, 1)))
    empty = build("name: s\ntype: SegAccuracy\nbottom: [x, l]\ntop: [a, iou]\n",
                  [(1, 2, 1, 1), (1, 1, 1, 1)])
    _, iou = empty(torch.tensor([[[[1.0]], [[0.0]]]]), torch.zeros(1, 1, 1, 1))
    assert iou.tolist() == [1.0, 1.0]  # class 1: neither labelled nor predicted, 0 / 0 is 1


def test_seg_accuracy_without_reset_keeps_counting():
    rng = np.random.default_rng(13)
    layer = build("name: s\ntype: SegAccuracy\nbottom: [x, l]\ntop: a\n"
                  "seg_accuracy_param: {reset: false}\n", [(1, 3, 4, 4), (1, 1, 4, 4)])
    m = None
    for _ in range(3):
        scores = rng.normal(size=(1, 3, 4, 4)).astype(np.float32)
        labels = rng.integers(0, 3, size=(1, 1, 4, 4)).astype(np.float32)
        top = layer(torch.from_numpy(scores), torch.from_numpy(labels))
        want, m = seg_accuracy_loops(scores, labels, set(), m)
        np.testing.assert_allclose(top.numpy().ravel(), want, rtol=1e-6)
    with pytest.raises(DataError, match="label 7 is outside"):
        layer(torch.zeros(1, 3, 4, 4), torch.full((1, 1, 4, 4), 7.0))


# --- SegNet's class weighting ---------------------------------------------------------------
def test_segnet_class_weighting_weights_loss_and_gradient():
    rng = np.random.default_rng(14)
    scores = torch.from_numpy(rng.normal(size=(2, 3, 2, 2))).requires_grad_()
    labels = torch.from_numpy(rng.integers(0, 3, size=(2, 1, 2, 2)).astype(np.float64))
    labels[0, 0, 0, 0] = 3  # ignored
    layer = build("name: l\ntype: SoftmaxWithLoss\nbottom: [s, t]\ntop: loss\nloss_param: "
                  "{ignore_label: 3, weight_by_label_freqs: true, class_weighting: [0.5, 2, 4]}\n",
                  [scores.shape, labels.shape])
    loss = layer(scores, labels)
    logp = torch.log_softmax(scores.detach(), 1).numpy()
    w = np.array([0.5, 2, 4])
    total, count, grad = 0.0, 0, np.zeros(scores.shape)
    for i in range(2):
        for y in range(2):
            for x in range(2):
                k = int(labels[i, 0, y, x])
                if k == 3:
                    continue
                total -= w[k] * logp[i, k, y, x]
                count += 1
                g = np.exp(logp[i, :, y, x])
                g[k] -= 1
                grad[i, :, y, x] = w[k] * g
    assert loss.item() == pytest.approx(total / count, rel=1e-12)
    loss.backward()
    np.testing.assert_allclose(scores.grad.numpy(), grad / count, rtol=1e-12)
    with pytest.raises(NetError, match="class_weighting has 2 values for 3 classes"):
        build("name: l\ntype: SoftmaxWithLoss\nbottom: [s, t]\ntop: loss\nloss_param: "
              "{weight_by_label_freqs: true, class_weighting: [1, 2]}\n",
              [(2, 3, 2, 2), (2, 1, 2, 2)])


# --- MatWrite -------------------------------------------------------------------------------
def test_mat_write_saves_each_forward_as_matlab_sees_caffes_memory(tmp_path):
    from scipy.io import loadmat

    (tmp_path / "ids.txt").write_text("a.png x\nb.png y\n")
    layer = build(f"name: m\ntype: MatWrite\nbottom: [x, y]\nmat_write_param: "
                  f"{{prefix: '{tmp_path}/out/', source: '{tmp_path}/ids.txt', strip: 4}}\n",
                  [(2, 3, 4, 5), (2, 6)])
    x, y = rand(2, 3, 4, 5, seed=1).float(), rand(2, 6, seed=2).float()
    assert layer(x, y) == ()
    data = loadmat(str(tmp_path / "out" / "a_blob_0.mat"))["data"]
    assert data.shape == (5, 4, 3, 2)  # width, height, channels, num (column-major)
    np.testing.assert_array_equal(data, x.numpy().transpose(3, 2, 1, 0))
    assert loadmat(str(tmp_path / "out" / "a_blob_1.mat"))["data"].shape == (1, 1, 6, 2)
    layer(x, y)
    assert (tmp_path / "out" / "b_blob_0.mat").exists()
    with pytest.raises(DataError, match="forward 2 but"):
        layer(x, y)
