"""BatchNorm, Scale and Bias against plain numpy references of Caffe's formulas."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from layer_helpers import build

from caffe_py.errors import NetError, SpecError


def bn_spec(extra: str = "") -> str:
    return f"""
layer:
  - name: bn
    type: BatchNorm
    bottom: x
    top: x
{extra}"""


# --- BatchNorm ----------------------------------------------------------------------------

def np_batch_norm_step(x: np.ndarray, sums: dict, maf: float, eps: float) -> np.ndarray:
    """Caffe's TRAIN forward written out per channel, updating ``sums`` like the blobs."""
    xc = np.moveaxis(x, 1, 0).reshape(x.shape[1], -1)  # (C, m)
    m = xc.shape[1]
    mean = xc.mean(axis=1)
    var = ((xc - mean[:, None]) ** 2).mean(axis=1)
    y = (xc - mean[:, None]) / np.sqrt(var[:, None] + eps)
    sums["count"] = sums["count"] * maf + 1
    sums["mean"] = sums["mean"] * maf + mean
    sums["var"] = sums["var"] * maf + var * m / (m - 1)
    shape = (x.shape[1], x.shape[0]) + x.shape[2:]
    return np.moveaxis(y.reshape(shape), 0, 1)


def np_global_norm(x: np.ndarray, sums: dict, eps: float) -> np.ndarray:
    scale = 0.0 if sums["count"] == 0 else 1.0 / sums["count"]
    view = (1, -1) + (1,) * (x.ndim - 2)
    mean = (sums["mean"] * scale).reshape(view)
    var = (sums["var"] * scale).reshape(view)
    return (x - mean) / np.sqrt(var + eps)


def test_batch_norm_with_eps_0_trains_as_caffes_does():
    """Caffe takes eps 0; PyTorch's batch_norm refuses it in training (a traceback before)."""
    rng = np.random.default_rng(1)
    layer = build(bn_spec("    batch_norm_param: {eps: 0}\n"), [(4, 3, 5, 6)], "TRAIN").double()
    sums = {"mean": np.zeros(3), "var": np.zeros(3), "count": 0.0}
    for _ in range(2):
        x = rng.normal(loc=1, scale=2, size=(4, 3, 5, 6))
        y = layer(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(y, np_batch_norm_step(x, sums, 0.999, 0.0), rtol=1e-10,
                                   atol=1e-10)
        np.testing.assert_allclose(layer.var_sum.numpy(), sums["var"], rtol=1e-12)
        np.testing.assert_allclose(layer.mean_sum.numpy(), sums["mean"], rtol=1e-12)


def test_batch_norm_blobs_in_caffe_order_are_state_not_parameters():
    layer = build(bn_spec(), [(4, 3, 5, 5)])
    assert layer.blob_names == ["mean_sum", "var_sum", "count"]
    assert [tuple(b.shape) for b in layer.blobs()] == [(3,), (3,), (1,)]
    assert list(layer.parameters()) == []
    assert all(float(b.abs().sum()) == 0 for b in layer.blobs())


def test_batch_norm_train_steps_then_shared_test_net_uses_running_sums():
    rng = np.random.default_rng(0)
    maf, eps = 0.9, 1e-3
    extra = f"    batch_norm_param: {{moving_average_fraction: {maf}, eps: {eps}}}\n"
    train = build(bn_spec(extra), [(4, 3, 5, 6)], "TRAIN").double()
    test = build(bn_spec(extra), [(4, 3, 5, 6)], "TEST").double()
    for name in train.blob_names:  # share the tensors as a TEST net does
        setattr(test, name, getattr(train, name))
    sums = {"mean": np.zeros(3), "var": np.zeros(3), "count": 0.0}
    for step in range(4):
        x = rng.normal(loc=step, scale=1 + step, size=(4, 3, 5, 6))
        y = train(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(y, np_batch_norm_step(x, sums, maf, eps), rtol=1e-10,
                                   atol=1e-10)
        np.testing.assert_allclose(train.mean_sum.numpy(), sums["mean"], rtol=1e-12)
        np.testing.assert_allclose(train.var_sum.numpy(), sums["var"], rtol=1e-12)
        np.testing.assert_allclose(train.count.numpy(), [sums["count"]], rtol=1e-12)
    assert sums["count"] == pytest.approx(1 + 0.9 + 0.81 + 0.729)
    x = rng.normal(size=(2, 3, 5, 6))
    y = test(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, np_global_norm(x, sums, eps), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(test.count.numpy(), [sums["count"]])  # TEST does not update


def test_batch_norm_default_eps_and_fraction_on_2d_input():
    rng = np.random.default_rng(1)
    layer = build(bn_spec(), [(8, 4)]).double()
    x = rng.normal(size=(8, 4))
    sums = {"mean": np.zeros(4), "var": np.zeros(4), "count": 0.0}
    y = layer(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(y, np_batch_norm_step(x, sums, 0.999, 1e-5), rtol=1e-9)
    np.testing.assert_allclose(layer.var_sum.numpy(), sums["var"], rtol=1e-12)


def test_batch_norm_global_stats_with_no_statistics_divides_by_sqrt_eps():
    layer = build(bn_spec(), [(2, 3, 2, 2)], "TEST")
    x = torch.arange(24, dtype=torch.float32).view(2, 3, 2, 2)
    torch.testing.assert_close(layer(x), x / np.sqrt(1e-5))


def test_batch_norm_explicit_global_stats_in_train_uses_stored_sums():
    extra = "    batch_norm_param: {use_global_stats: true}\n"
    layer = build(bn_spec(extra), [(2, 2)], "TRAIN").double()
    layer.mean_sum.copy_(torch.tensor([2.0, 4.0]))
    layer.var_sum.copy_(torch.tensor([8.0, 2.0]))
    layer.count.fill_(2.0)
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    want = (x - torch.tensor([1.0, 2.0])) / torch.sqrt(torch.tensor([4.0, 1.0]) + 1e-5)
    torch.testing.assert_close(layer(x), want)
    assert float(layer.count) == 2.0


def test_batch_norm_batch_stats_in_test_when_asked_also_update():
    extra = "    batch_norm_param: {use_global_stats: false}\n"
    layer = build(bn_spec(extra), [(3, 2)], "TEST").double()
    x = torch.tensor([[1.0, 0.0], [2.0, 0.0], [6.0, 3.0]], dtype=torch.float64)
    y = layer(x)
    torch.testing.assert_close(y.mean(0), torch.zeros(2, dtype=torch.float64))
    torch.testing.assert_close(layer.mean_sum, torch.tensor([3.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(layer.var_sum, torch.tensor([7.0, 3.0], dtype=torch.float64))


def test_batch_norm_one_value_per_channel_gives_zero_and_no_variance():
    layer = build(bn_spec(), [(1, 3)])
    y = layer(torch.tensor([[1.0, -2.0, 5.0]]))
    torch.testing.assert_close(y, torch.zeros(1, 3))
    torch.testing.assert_close(layer.mean_sum, torch.tensor([1.0, -2.0, 5.0]))
    torch.testing.assert_close(layer.var_sum, torch.zeros(3))
    assert float(layer.count) == 1.0


def test_batch_norm_one_axis_blob_is_one_channel():
    layer = build(bn_spec(), [(4,)]).double()
    x = torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64)
    want = (x - 3.0) / torch.sqrt(torch.tensor(3.5 + 1e-5, dtype=torch.float64))
    torch.testing.assert_close(layer(x), want)
    torch.testing.assert_close(layer.var_sum, torch.tensor([14.0 / 3], dtype=torch.float64))


@pytest.mark.parametrize("phase", ["TRAIN", "TEST"])
def test_batch_norm_gradcheck(phase):
    layer = build(bn_spec(), [(3, 2, 2, 2)], phase).double()
    layer.mean_sum.copy_(torch.tensor([0.5, -1.0]))
    layer.var_sum.copy_(torch.tensor([2.0, 0.5]))
    layer.count.fill_(1.5)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 2, 2, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    # TRAIN calls update the sums, but the TRAIN output depends only on the batch
    assert torch.autograd.gradcheck(layer, (x,))
    assert (float(layer.count) == 1.5) == (phase == "TEST")


def test_batch_norm_errors_name_layer_and_blob():
    with pytest.raises(NetError) as err:
        build(bn_spec().replace("bottom: x", "bottom: [x, y]"), [(2, 3), (2, 3)])
    assert str(err.value) == ("<string>:3: layer[0]: layer 'bn' (BatchNorm): takes exactly 1 "
                              "bottom(s), got 2")
    with pytest.raises(NetError) as err:
        build(bn_spec(), [()])
    assert str(err.value) == ("<string>:3: layer[0]: layer 'bn' (BatchNorm): bottom 'x' "
                              "(index 0) is a scalar; BatchNorm needs at least a batch axis")
    with pytest.raises(SpecError) as err:
        build(bn_spec("    batch_norm_param: {moving_avg_fraction: 0.9}\n"), [(2, 3)])
    assert "did you mean 'moving_average_fraction'?" in str(err.value)


# --- Scale and Bias -----------------------------------------------------------------------

def layer_spec(kind: str, bottoms: str, param: str = "") -> str:
    key = "scale_param" if kind == "Scale" else "bias_param"
    block = f"    {key}: {{{param}}}\n" if param else ""
    return f"""
layer:
  - name: op
    type: {kind}
    bottom: [{bottoms}]
    top: y
{block}"""


def broadcast(operand: np.ndarray, axis: int, ndim: int) -> np.ndarray:
    return operand.reshape((1,) * axis + operand.shape + (1,) * (ndim - axis - operand.ndim))


SHAPE = (2, 3, 4, 5)


@pytest.mark.parametrize("param,axis,operand", [
    ("", 1, (3,)),
    ("axis: 1, num_axes: 2", 1, (3, 4)),
    ("axis: 2, num_axes: -1", 2, (4, 5)),
    ("axis: -1", 3, (5,)),
    ("axis: 0, num_axes: 0", 0, ()),
    ("axis: 0, num_axes: 4", 0, SHAPE),
])
def test_scale_learned_blob_shapes_and_forward(param, axis, operand):
    layer = build(layer_spec("Scale", "x", param), [SHAPE])
    assert layer.blob_names == ["scale"]
    assert tuple(layer.scale.shape) == operand
    torch.testing.assert_close(layer.scale.detach(), torch.ones(operand))  # Caffe default 1
    rng = np.random.default_rng(2)
    x = rng.normal(size=SHAPE)
    s = rng.normal(size=operand)
    layer = layer.double()
    with torch.no_grad():
        layer.scale.copy_(torch.from_numpy(s))
    y = layer(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(y, x * broadcast(s, axis, 4), rtol=1e-12)


def test_scale_with_bias_term_blob_order_fillers_and_forward():
    param = ("bias_term: true, filler: {type: constant, value: 2.0}, "
             "bias_filler: {type: constant, value: 0.5}")
    layer = build(layer_spec("Scale", "x", param), [SHAPE])
    assert layer.blob_names == ["scale", "bias"]
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(layer(x), x * 2.0 + 0.5)
    bare = build(layer_spec("Scale", "x", "bias_term: true"), [SHAPE])
    torch.testing.assert_close(bare.bias.detach(), torch.zeros(3))  # no filler -> zeros


def test_scale_two_bottoms_scale_is_second_bottom_bias_learned():
    layer = build(layer_spec("Scale", "x, s", "axis: 1, bias_term: true, "
                                              "bias_filler: {type: constant, value: 1.0}"),
                  [SHAPE, (3, 4)])
    assert layer.blob_names == ["bias"]
    assert tuple(layer.bias.shape) == (3, 4)
    rng = np.random.default_rng(4)
    x, s = rng.normal(size=SHAPE), rng.normal(size=(3, 4))
    y = layer.double()(torch.from_numpy(x), torch.from_numpy(s)).detach().numpy()
    np.testing.assert_allclose(y, x * broadcast(s, 1, 4) + 1.0, rtol=1e-12)


def test_scale_two_bottoms_axis_zero_and_scalar():
    rng = np.random.default_rng(5)
    x, s = rng.normal(size=SHAPE), rng.normal(size=(2, 3))
    layer = build(layer_spec("Scale", "x, s", "axis: 0"), [SHAPE, (2, 3)])
    y = layer(torch.from_numpy(x), torch.from_numpy(s)).numpy()
    np.testing.assert_allclose(y, x * broadcast(s, 0, 4), rtol=1e-12)
    scalar = build(layer_spec("Scale", "x, s"), [SHAPE, ()])
    y = scalar(torch.from_numpy(x), torch.tensor(3.0, dtype=torch.float64)).numpy()
    np.testing.assert_allclose(y, x * 3.0, rtol=1e-12)


def test_scale_gradcheck_both_bottoms_and_blobs():
    layer = build(layer_spec("Scale", "x, s", "axis: 1, bias_term: true, "
                                              "bias_filler: {type: gaussian}"),
                  [(2, 3, 2), (3,)]).double()
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    s = torch.randn(3, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x, s))
    layer(x, s).sum().backward()
    torch.testing.assert_close(layer.bias.grad, torch.full((3,), 4.0, dtype=torch.float64))


def test_scale_learned_gradcheck():
    layer = build(layer_spec("Scale", "x", "axis: 1, num_axes: 2, filler: {type: gaussian}"),
                  [(2, 3, 2)]).double()
    x = torch.randn(2, 3, 2, generator=torch.Generator().manual_seed(7), dtype=torch.float64,
                    requires_grad=True)
    scale = layer.scale.detach().clone().requires_grad_()
    call = lambda x, s: torch.func.functional_call(layer, {"scale": s}, (x,))
    assert torch.autograd.gradcheck(call, (x, scale))
    torch.testing.assert_close(layer(x), x * layer.scale)


@pytest.mark.parametrize("kind", ["Scale", "Bias"])
def test_operand_shape_errors(kind):
    with pytest.raises(NetError) as err:
        build(layer_spec(kind, "x", "axis: 2, num_axes: 3"), [SHAPE])
    assert str(err.value) == (f"<string>:3: layer[0]: layer 'op' ({kind}): axis 2 with "
                              "num_axes 3 extends past bottom 'x' of shape [2, 3, 4, 5]; use "
                              "num_axes <= 2 or -1")
    with pytest.raises(NetError) as err:
        build(layer_spec(kind, "x, s", "axis: 1"), [SHAPE, (3, 5)])
    assert str(err.value) == (f"<string>:3: layer[0]: layer 'op' ({kind}): bottom 's' "
                              "(index 1) has shape [3, 5] but bottom 'x' has [3, 4] at axes "
                              "1..2 (shape [2, 3, 4, 5]); give bottom 1 the shape [3, 4] or "
                              "change axis")
    with pytest.raises(NetError) as err:
        build(layer_spec(kind, "x, s", "axis: 3"), [SHAPE, (5, 1)])
    assert str(err.value) == (f"<string>:3: layer[0]: layer 'op' ({kind}): bottom 's' "
                              "(index 1) has 2 axes, which from axis 3 extend past bottom 'x' "
                              "of shape [2, 3, 4, 5]; use an axis <= 2")
    with pytest.raises(NetError) as err:
        build(layer_spec(kind, "x", "axis: 4"), [SHAPE])
    assert str(err.value) == (f"<string>:3: layer[0]: layer 'op' ({kind}): axis 4 is out of "
                              "range for a blob with 4 axes")
    with pytest.raises(NetError) as err:
        build(layer_spec(kind, "x, s, t"), [SHAPE, (3,), (3,)])
    assert str(err.value) == (f"<string>:3: layer[0]: layer 'op' ({kind}): takes 1 to 2 "
                              "bottom(s), got 3")


def test_bias_learned_and_two_bottom_forms():
    layer = build(layer_spec("Bias", "x", "axis: 1, num_axes: 2, "
                                          "filler: {type: constant, value: 0.25}"), [SHAPE])
    assert layer.blob_names == ["bias"]
    assert tuple(layer.bias.shape) == (3, 4)
    rng = np.random.default_rng(8)
    x, b = rng.normal(size=SHAPE), rng.normal(size=(3, 4))
    torch.testing.assert_close(layer(torch.ones(SHAPE)), torch.full(SHAPE, 1.25))
    default = build(layer_spec("Bias", "x"), [SHAPE])
    torch.testing.assert_close(default.bias.detach(), torch.zeros(3))  # no filler -> zeros
    layer = layer.double()
    with torch.no_grad():
        layer.bias.copy_(torch.from_numpy(b))
    y = layer(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(y, x + broadcast(b, 1, 4), rtol=1e-12)
    two = build(layer_spec("Bias", "x, b", "axis: -2"), [SHAPE, (4, 5)])
    assert two.blob_names == []
    b2 = rng.normal(size=(4, 5))
    y = two(torch.from_numpy(x), torch.from_numpy(b2)).numpy()
    np.testing.assert_allclose(y, x + broadcast(b2, 2, 4), rtol=1e-12)


def test_bias_gradcheck():
    layer = build(layer_spec("Bias", "x, b", "axis: 0"), [(2, 3), (2,)]).double()
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer, (x, b))


# --- precision ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,param", [("Scale", "bias_term: true, filler: {type: constant, "
                                                  "value: 1.5}, bias_filler: {type: constant, "
                                                  "value: 0.25}"),
                                        ("Bias", "filler: {type: constant, value: 0.25}")])
def test_scale_and_bias_keep_bfloat16_and_give_float32_blob_gradients(kind, param):
    layer = build(layer_spec(kind, "x", param), [SHAPE])
    x = torch.full(SHAPE, 2.0, dtype=torch.bfloat16)
    y = layer(x)
    assert y.dtype == torch.bfloat16
    expected = 3.25 if kind == "Scale" else 2.25
    assert torch.equal(y, torch.full(SHAPE, expected, dtype=torch.bfloat16))
    y.float().sum().backward()
    per_channel = SHAPE[0] * SHAPE[2] * SHAPE[3]
    assert layer.bias.grad.dtype == torch.float32
    torch.testing.assert_close(layer.bias.grad, torch.full((3,), float(per_channel)))
    if kind == "Scale":
        torch.testing.assert_close(layer.scale.grad, torch.full((3,), 2.0 * per_channel))
    # a wider activation still promotes exactly as before: float64 in, float64 out
    wide = layer(torch.full(SHAPE, 2.0, dtype=torch.float64))
    assert wide.dtype == torch.float64 and wide[0, 0, 0, 0].item() == expected


def test_batch_norm_keeps_bfloat16_and_float32_running_sums():
    layer = build(bn_spec(), [(4, 3, 5, 5)])
    x = torch.randn(4, 3, 5, 5, generator=torch.Generator().manual_seed(5))
    y = layer(x.to(torch.bfloat16))
    assert y.dtype == torch.bfloat16 and layer.mean_sum.dtype == torch.float32
    mean = x.to(torch.bfloat16).float().mean(dim=(0, 2, 3))
    torch.testing.assert_close(layer.mean_sum, mean, rtol=1e-2, atol=1e-2)
    assert layer.count.item() == 1.0


# --- MVN ----------------------------------------------------------------------------------

def np_mvn(x: np.ndarray, variance: bool, across: bool, eps: float) -> np.ndarray:
    """Caffe's MVN forward: per item (and channel unless ``across``), biased variance."""
    x4 = x.reshape(*x.shape, *([1] * (4 - x.ndim)))
    rows = x4.reshape(x4.shape[0] if across else x4.shape[0] * x4.shape[1], -1)
    centred = rows - rows.mean(axis=1, keepdims=True)
    if variance:
        centred = centred / (np.sqrt((centred ** 2).mean(axis=1, keepdims=True)) + eps)
    return centred.reshape(x4.shape)


def np_mvn_caffe_backward(y: np.ndarray, dy: np.ndarray, std: np.ndarray) -> np.ndarray:
    """mvn_layer.cpp Backward_cpu: (dy - mean(dy) - y mean(y dy)) / (std + eps)."""
    return (dy - dy.mean(1, keepdims=True) - y * (y * dy).mean(1, keepdims=True)) / std


@pytest.mark.parametrize(("block", "variance", "across"), [
    ("", True, False), ("mvn_param: {across_channels: true}", True, True),
    ("mvn_param: {normalize_variance: false}", False, False),
])
def test_mvn_forward_and_gradcheck(block, variance, across):
    layer = build(f"name: m\ntype: MVN\nbottom: x\ntop: y\n{block}\n", [(2, 3, 4, 5)])
    x = torch.from_numpy(np.random.default_rng(0).normal(size=(2, 3, 4, 5)))
    np.testing.assert_allclose(layer(x).numpy(), np_mvn(x.numpy(), variance, across, 1e-9),
                               rtol=1e-10, atol=1e-12)
    small = torch.from_numpy(np.random.default_rng(1).normal(size=(2, 2, 2, 3)))
    assert torch.autograd.gradcheck(layer.double(), (small.requires_grad_(),))


def test_mvn_backward_is_caffes_with_eps_in_the_std():
    layer = build("name: m\ntype: MVN\nbottom: x\ntop: y\n"
                  "mvn_param: {eps: 0.5, across_channels: true}\n", [(3, 8)])
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.normal(size=(3, 8))).requires_grad_()
    dy = rng.normal(size=(3, 8, 1, 1))
    y = layer(x)
    assert y.shape == (3, 8, 1, 1)  # Caffe's top is N x C x H x W
    y.backward(torch.from_numpy(dy))
    rows = x.detach().numpy()
    std = np.sqrt(((rows - rows.mean(1, keepdims=True)) ** 2).mean(1, keepdims=True)) + 0.5
    want = np_mvn_caffe_backward(y.detach().numpy().reshape(3, 8), dy.reshape(3, 8), std)
    np.testing.assert_allclose(x.grad.numpy(), want, rtol=1e-12)


def test_mvn_refuses_more_than_4_axes():
    with pytest.raises(NetError, match=r"has shape \[1, 2, 3, 4, 5\]; MVN takes 1 to 4 axes"):
        build("name: m\ntype: MVN\nbottom: x\ntop: y\n", [(1, 2, 3, 4, 5)])
