"""InnerProduct, Flatten, Reshape, Concat, Slice, Split, Eltwise, Silence, Softmax, Dropout."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from layer_helpers import build, gradcheck, rand

from caffe_py.errors import NetError, SpecError
from caffe_py.layers.common import linear_fp32


def layer_yaml(kind: str, bottoms="data", tops="out", param: str = "") -> str:
    text = f"name: l\ntype: {kind}\nbottom: {bottoms}\ntop: {tops}\n"
    return text + (param + "\n" if param else "")


def error_of(text: str, shapes) -> str:
    with pytest.raises(NetError) as err:
        build(text, shapes)
    return str(err.value)


PREFIX = "<string>:1: layer[0]: layer 'l'"
FILLERS = "weight_filler: {type: gaussian}, bias_filler: {type: gaussian}"


# --- InnerProduct ---------------------------------------------------------------------------
def ip_yaml(param: str) -> str:
    return layer_yaml("InnerProduct", param=f"inner_product_param: {{{param}, {FILLERS}}}")


def test_inner_product_flattens_from_axis_one():
    layer = build(ip_yaml("num_output: 4"), [(2, 3, 2, 2)])
    assert layer.blob_names == ["weight", "bias"]
    assert tuple(layer.weight.shape) == (4, 12) and layer.top_shapes == [(2, 4)]
    x = rand(3, 3, 2, 2).float()  # another batch size than the build one
    w, b = layer.weight.detach().double().numpy(), layer.bias.detach().double().numpy()
    want = x.double().numpy().reshape(3, 12) @ w.T + b
    np.testing.assert_allclose(layer(x).detach().numpy(), want, rtol=1e-5, atol=1e-6)


def test_inner_product_axis_two_keeps_leading_axes():
    layer = build(ip_yaml("num_output: 5, axis: 2"), [(2, 3, 4, 2)])
    assert layer.top_shapes == [(2, 3, 5)] and tuple(layer.weight.shape) == (5, 8)
    x = rand(2, 3, 4, 2).float()
    want = x.reshape(6, 8).double().numpy() @ layer.weight.detach().double().numpy().T
    want = want + layer.bias.detach().double().numpy()
    np.testing.assert_allclose(layer(x).detach().numpy().reshape(6, 5), want, rtol=1e-5,
                               atol=1e-6)


def test_inner_product_transpose_stores_k_by_n():
    layer = build(ip_yaml("num_output: 3, transpose: true, bias_term: false"), [(2, 4)])
    assert layer.blob_names == ["weight"] and tuple(layer.weight.shape) == (4, 3)
    x = rand(2, 4).float()
    want = x.double().numpy() @ layer.weight.detach().double().numpy()
    np.testing.assert_allclose(layer(x).detach().numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("param", ["num_output: 3", "num_output: 3, transpose: true"])
def test_inner_product_gradients(param):
    assert gradcheck(build(ip_yaml(param), [(2, 2, 2)]), rand(2, 2, 2))


@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_fp32_is_the_product_then_the_bias(with_bias):
    """A GPU's float32 InnerProduct path (Caffe's two steps) against float64, and its
    gradients against F.linear's."""
    x, w, b = rand(6, 5, seed=1), rand(3, 5, seed=2), rand(3, seed=3)
    bias = b if with_bias else None
    want = x @ w.T + (b if with_bias else 0)
    np.testing.assert_allclose(linear_fp32(x.float(), w.float(), bias if bias is None
                                           else bias.float()).numpy(), want.numpy(),
                               rtol=1e-6, atol=1e-6)
    leaves = [t.clone().requires_grad_(True) for t in (x, w, b)]
    ours = linear_fp32(leaves[0], leaves[1], leaves[2] if with_bias else None)
    ours.backward(torch.arange(18.0, dtype=torch.float64).reshape(6, 3))
    theirs = [t.clone().requires_grad_(True) for t in (x, w, b)]
    torch.nn.functional.linear(theirs[0], theirs[1], theirs[2] if with_bias else None).backward(
        torch.arange(18.0, dtype=torch.float64).reshape(6, 3))
    for a, t in zip(leaves, theirs, strict=True):
        if t.grad is None:
            assert a.grad is None
        else:
            torch.testing.assert_close(a.grad, t.grad, rtol=1e-12, atol=1e-12)


def test_inner_product_needs_num_output():
    assert error_of(layer_yaml("InnerProduct"), [(2, 3)]) == (
        f"{PREFIX} (InnerProduct): num_output is not set; set inner_product_param.num_output")


def test_inner_product_axis_out_of_range():
    assert error_of(ip_yaml("num_output: 2, axis: 3"), [(2, 3)]) == (
        f"{PREFIX} (InnerProduct): axis 3 is out of range for a blob with 2 axes")


# --- Flatten --------------------------------------------------------------------------------
@pytest.mark.parametrize("param,want", [
    ("", (2, 60)),
    ("flatten_param: {axis: 2}", (2, 3, 20)),
    ("flatten_param: {axis: 1, end_axis: 2}", (2, 12, 5)),
    ("flatten_param: {axis: 0, end_axis: -2}", (24, 5)),
])
def test_flatten_shapes_and_values(param, want):
    layer = build(layer_yaml("Flatten", param=param), [(2, 3, 4, 5)])
    x = rand(2, 3, 4, 5)
    assert layer.top_shapes == [want]
    torch.testing.assert_close(layer(x), x.reshape(want), rtol=0, atol=0)


def test_flatten_end_before_start_fails():
    text = layer_yaml("Flatten", param="flatten_param: {axis: 2, end_axis: 1}")
    assert error_of(text, [(2, 3, 4)]) == (
        f"{PREFIX} (Flatten): end_axis 1 comes before axis 2 for a blob with 3 axes; "
        "set end_axis >= axis")


# --- Reshape --------------------------------------------------------------------------------
def reshape_yaml(param: str) -> str:
    return layer_yaml("Reshape", param=f"reshape_param: {param}")


@pytest.mark.parametrize("param,bottom,want", [
    ("{shape: {dim: [0, -1]}}", (2, 3, 4, 5), (2, 60)),
    ("{shape: {dim: [0, 0, 2, -1]}}", (2, 3, 4, 5), (2, 3, 2, 10)),
    ("{shape: {dim: [-1, 4]}}", (2, 3, 4), (6, 4)),
    ("{shape: {dim: [1]}, axis: 0, num_axes: 0}", (2, 3), (1, 2, 3)),
    ("{shape: {dim: [1]}, axis: -1, num_axes: 0}", (2, 3), (2, 3, 1)),
    ("{shape: {dim: [3, 2]}, axis: 1, num_axes: 1}", (4, 6, 5), (4, 3, 2, 5)),
    ("{shape: {dim: [-1]}, axis: 1}", (4, 6, 5), (4, 30)),
])
def test_reshape_shapes(param, bottom, want):
    layer = build(reshape_yaml(param), [bottom])
    x = rand(*bottom)
    assert layer.top_shapes == [want]
    torch.testing.assert_close(layer(x), x.reshape(want), rtol=0, atol=0)


def test_reshape_recomputes_for_another_batch_size():
    layer = build(reshape_yaml("{shape: {dim: [0, -1]}}"), [(2, 3, 4)])
    assert tuple(layer(torch.zeros(5, 3, 4)).shape) == (5, 12)


def test_reshape_cannot_infer():
    assert error_of(reshape_yaml("{shape: {dim: [4, -1]}}"), [(2, 3, 5)]) == (
        f"{PREFIX} (Reshape): cannot infer the -1 in shape [4, -1]: bottom 'data' [2, 3, 5] "
        "has 30 elements, not a multiple of 4; fix the other dims of shape")


def test_reshape_count_mismatch():
    assert error_of(reshape_yaml("{shape: {dim: [4, 4]}}"), [(2, 3, 5)]) == (
        f"{PREFIX} (Reshape): shape [4, 4] has 16 elements but bottom 'data' [2, 3, 5] has 30; "
        "make the counts match, or use -1 for one dim")


def test_reshape_zero_without_bottom_axis():
    assert error_of(reshape_yaml("{shape: {dim: [0, 0, 0]}, axis: 1}"), [(2, 6)]) == (
        f"{PREFIX} (Reshape): shape dim 1 is 0 but there is no bottom axis 2 to copy within the "
        "replaced axes; write the size instead of 0")


def test_reshape_two_minus_ones_is_a_spec_error():
    with pytest.raises(SpecError) as err:
        build(reshape_yaml("{shape: {dim: [-1, -1]}}"), [(2, 6)])
    assert str(err.value) == ("<string>:5: layer[0].reshape_param.shape: shape [-1, -1] has more "
                              "than one -1; at most one dim may be inferred")


# --- Concat ---------------------------------------------------------------------------------
def test_concat_along_channels_and_gradient():
    layer = build(layer_yaml("Concat", bottoms="[a, b, c]"), [(2, 1, 3), (2, 2, 3), (2, 3, 3)])
    assert layer.top_shapes == [(2, 6, 3)]
    xs = [rand(2, k, 3, seed=k) for k in (1, 2, 3)]
    torch.testing.assert_close(layer(*xs), torch.cat(xs, 1), rtol=0, atol=0)
    assert gradcheck(layer, *xs)


@pytest.mark.parametrize("param,want", [("concat_param: {axis: -1}", (2, 3, 9)),
                                        ("concat_param: {concat_dim: 0}", (4, 3, 4))])
def test_concat_axis_forms(param, want):
    shapes = [(2, 3, 4), (2, 3, 5)] if want[-1] == 9 else [(1, 3, 4), (3, 3, 4)]
    layer = build(layer_yaml("Concat", bottoms="[a, b]", param=param), shapes)
    assert layer.top_shapes == [want]


def test_concat_mismatch_off_the_concat_axis():
    text = layer_yaml("Concat", bottoms="[a, b]")
    assert error_of(text, [(2, 3, 4), (2, 5, 6)]) == (
        f"{PREFIX} (Concat): bottom 'b' (index 1) has shape [2, 5, 6] but bottom 'a' has "
        "[2, 3, 4]: they differ at axis 2, not the concat axis 1; all inputs must match except "
        "at the concat axis")


def test_concat_axis_count_mismatch():
    assert error_of(layer_yaml("Concat", bottoms="[a, b]"), [(2, 3, 4), (2, 3)]) == (
        f"{PREFIX} (Concat): bottom 'b' (index 1) has 2 axes [2, 3] but bottom 'a' has 3 "
        "[2, 3, 4]; all inputs of Concat need the same number of axes")


def test_concat_axis_and_concat_dim_together():
    with pytest.raises(SpecError, match="axis and concat_dim are both set; keep only axis"):
        build(layer_yaml("Concat", bottoms="[a, b]", param="concat_param: {axis: 1, "
                                                           "concat_dim: 1}"), [(1, 1), (1, 1)])


# --- Slice ----------------------------------------------------------------------------------
def test_slice_at_points_and_gradient():
    layer = build(layer_yaml("Slice", tops="[a, b, c]",
                             param="slice_param: {slice_point: [1, 3]}"), [(2, 6, 2)])
    assert layer.top_shapes == [(2, 1, 2), (2, 2, 2), (2, 3, 2)]
    x = rand(2, 6, 2)
    a, b, c = layer(x)
    assert torch.equal(a, x[:, :1]) and torch.equal(b, x[:, 1:3]) and torch.equal(c, x[:, 3:])
    assert gradcheck(layer, x)


def test_slice_equal_parts_and_legacy_slice_dim():
    layer = build(layer_yaml("Slice", tops="[a, b]", param="slice_param: {slice_dim: 0}"),
                  [(4, 3)])
    assert layer.top_shapes == [(2, 3), (2, 3)]
    x = rand(4, 3)
    a, b = layer(x)
    assert torch.equal(a, x[:2]) and torch.equal(b, x[2:])


def test_slice_point_out_of_range():
    text = layer_yaml("Slice", tops="[a, b, c]", param="slice_param: {slice_point: [2, 7]}")
    assert error_of(text, [(2, 6)]) == (
        f"{PREFIX} (Slice): slice_point 7 is out of range for axis 1 of bottom 'data' (size 6); "
        "slice points increase strictly within 1..5")


def test_slice_points_not_increasing():
    text = layer_yaml("Slice", tops="[a, b, c]", param="slice_param: {slice_point: [3, 2]}")
    assert "slice_point 2 is out of range" in error_of(text, [(2, 6)])


def test_slice_point_count_must_match_tops():
    text = layer_yaml("Slice", tops="[a, b, c]", param="slice_param: {slice_point: [2]}")
    assert error_of(text, [(2, 6)]) == (
        f"{PREFIX} (Slice): 1 slice_point values for 3 tops; give one fewer slice_point than tops")


def test_slice_equal_parts_must_divide():
    text = layer_yaml("Slice", tops="[a, b, c, d]")
    assert error_of(text, [(2, 6)]) == (
        f"{PREFIX} (Slice): 4 tops do not evenly divide axis 1 of bottom 'data' (size 6); give "
        "slice_point, or a number of tops that divides the axis")


# --- Split ----------------------------------------------------------------------------------
def test_split_gradients_sum():
    layer = build(layer_yaml("Split", tops="[a, b, c]"), [(2, 3)])
    assert layer.top_shapes == [(2, 3)] * 3
    x = rand(2, 3).requires_grad_()
    a, b, c = layer(x)
    assert torch.equal(a, x) and torch.equal(c, x)
    (2 * a + 3 * b - c).sum().backward()
    torch.testing.assert_close(x.grad, torch.full((2, 3), 4.0, dtype=torch.float64))


def test_split_takes_one_bottom():
    assert error_of(layer_yaml("Split", bottoms="[a, b]", tops="[c, d]"), [(1,), (1,)]) == (
        f"{PREFIX} (Split): takes exactly 1 bottom(s), got 2")


# --- Eltwise --------------------------------------------------------------------------------
def eltwise_yaml(param: str = "", bottoms: str = "[a, b, c]") -> str:
    return layer_yaml("Eltwise", bottoms=bottoms,
                      param=f"eltwise_param: {param}" if param else "")


def three(shape=(2, 3)):
    return [rand(*shape, seed=s) for s in (1, 2, 3)]


def test_eltwise_sum_is_default_and_coefficients_weigh():
    xs = three()
    layer = build(eltwise_yaml(), [(2, 3)] * 3)
    torch.testing.assert_close(layer(*xs), xs[0] + xs[1] + xs[2])
    layer = build(eltwise_yaml("{operation: SUM, coeff: [1, -2, 0.5]}"), [(2, 3)] * 3)
    torch.testing.assert_close(layer(*xs), xs[0] - 2 * xs[1] + 0.5 * xs[2])
    assert gradcheck(layer, *xs)


def test_eltwise_prod_and_gradient():
    xs = three()
    layer = build(eltwise_yaml("{operation: PROD, stable_prod_grad: false}"), [(2, 3)] * 3)
    torch.testing.assert_close(layer(*xs), xs[0] * xs[1] * xs[2])
    assert gradcheck(layer, *xs)


def test_eltwise_max_values_and_caffe_tie_rule():
    xs = three()
    layer = build(eltwise_yaml("{operation: MAX}"), [(2, 3)] * 3)
    torch.testing.assert_close(layer(*xs), torch.stack(xs).amax(0))
    assert gradcheck(layer, *xs)
    # Caffe: bottom 1 wins a tie with bottom 0; bottom 2 needs to be strictly greater.
    a = torch.tensor([1.0, 1.0, 3.0], requires_grad=True)
    b = torch.tensor([1.0, 0.0, 3.0], requires_grad=True)
    c = torch.tensor([0.0, 1.0, 3.0], requires_grad=True)
    layer(a, b, c).sum().backward()
    assert a.grad.tolist() == [0.0, 1.0, 0.0]
    assert b.grad.tolist() == [1.0, 0.0, 1.0]
    assert c.grad.tolist() == [0.0, 0.0, 0.0]


def test_eltwise_shape_mismatch_names_the_blob():
    assert error_of(eltwise_yaml(), [(2, 3), (2, 3), (3, 2)]) == (
        f"{PREFIX} (Eltwise): bottom 'c' (index 2) has shape [3, 2] but bottom 'a' (index 0) has "
        "[2, 3]; Eltwise needs all bottoms the same shape")


def test_eltwise_coefficient_count():
    assert error_of(eltwise_yaml("{coeff: [1, 2]}"), [(2,)] * 3) == (
        f"{PREFIX} (Eltwise): 2 coeff values for 3 bottoms; give one coefficient per bottom")


def test_eltwise_coefficients_only_for_sum():
    with pytest.raises(SpecError, match="coeff is given for operation PROD; coefficients apply "
                                        "to SUM only"):
        build(eltwise_yaml("{operation: PROD, coeff: [1, 2, 3]}"), [(2,)] * 3)


def test_eltwise_needs_two_bottoms():
    assert error_of(eltwise_yaml(bottoms="a"), [(2,)]) == (
        f"{PREFIX} (Eltwise): takes at least 2 bottom(s), got 1")


# --- Silence --------------------------------------------------------------------------------
def test_silence_takes_any_bottoms_and_gives_no_tops():
    layer = build("name: l\ntype: Silence\nbottom: [a, b]\n", [(2, 3), (4,)])
    assert layer.top_shapes == []
    assert layer(torch.zeros(2, 3), torch.zeros(4)) == ()


def test_silence_with_a_top_fails():
    assert error_of(layer_yaml("Silence"), [(2,)]) == (
        f"{PREFIX} (Silence): takes exactly 0 top(s), got 1")


# --- Softmax --------------------------------------------------------------------------------
@pytest.mark.parametrize("param,axis", [("", 1), ("softmax_param: {axis: -1}", 2),
                                        ("softmax_param: {axis: 0}", 0)])
def test_softmax_along_axis(param, axis):
    layer = build(layer_yaml("Softmax", param=param), [(2, 3, 4)])
    x = rand(2, 3, 4) * 5
    e = np.exp(x.numpy() - x.numpy().max(axis, keepdims=True))
    np.testing.assert_allclose(layer(x).numpy(), e / e.sum(axis, keepdims=True), rtol=1e-12)
    assert gradcheck(layer, x)


def test_softmax_axis_out_of_range():
    text = layer_yaml("Softmax", param="softmax_param: {axis: 3}")
    assert error_of(text, [(2, 3)]) == (
        f"{PREFIX} (Softmax): axis 3 is out of range for a blob with 2 axes")


# --- Dropout --------------------------------------------------------------------------------
def dropout_yaml(param: str = "") -> str:
    return layer_yaml("Dropout", param=f"dropout_param: {param}" if param else "")


def test_dropout_train_scales_kept_elements_and_seed_repeats_mask():
    layer = build(dropout_yaml("{dropout_ratio: 0.25}"), [(100, 100)])
    x = torch.rand(100, 100) + 1.0
    torch.manual_seed(3)
    y = layer(x)
    torch.manual_seed(3)
    assert torch.equal(layer(x), y)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept] / 0.75)
    assert kept.float().mean().item() == pytest.approx(0.75, abs=0.02)


def test_dropout_gradient_is_mask_over_keep_probability():
    layer = build(dropout_yaml(), [(50, 40)])
    x = torch.ones(50, 40, requires_grad=True)
    torch.manual_seed(0)
    y = layer(x)
    y.sum().backward()
    torch.testing.assert_close(x.grad, (y != 0).float() * 2.0)
    assert (y != 0).float().mean().item() == pytest.approx(0.5, abs=0.03)


def test_dropout_phase_is_fixed_at_build_not_by_module_mode():
    x = torch.rand(8, 8) + 1.0
    test_layer = build(dropout_yaml(), [(8, 8)], phase="TEST")
    test_layer.train()
    assert torch.equal(test_layer(x), x)
    train_layer = build(dropout_yaml(), [(8, 8)], phase="TRAIN")
    train_layer.eval()
    torch.manual_seed(0)
    assert bool((train_layer(x) == 0).any())


def test_dropout_without_train_scaling_scales_at_test():
    torch.manual_seed(1)
    train = build(dropout_yaml("{dropout_ratio: 0.5, scale_train: false}"), [(20, 20)])
    x = torch.rand(20, 20) + 1.0
    y = train(x)
    kept = y != 0
    torch.testing.assert_close(y[kept], x[kept])
    test = build(dropout_yaml("{dropout_ratio: 0.5, scale_train: false}"), [(20, 20)], "TEST")
    torch.testing.assert_close(test(x), x * 0.5)


def test_dropout_sample_weights_test_of_segnet_drops_in_test_too():
    torch.manual_seed(2)
    test = build(dropout_yaml("{dropout_ratio: 0.5, sample_weights_test: true}"), [(20, 20)],
                 "TEST")
    x = torch.rand(20, 20) + 1.0
    y = test(x)
    kept = y != 0
    assert 0 < int(kept.sum()) < 400
    torch.testing.assert_close(y[kept], x[kept] * 2)


def test_dropout_ratio_one_is_a_spec_error():
    with pytest.raises(SpecError) as err:
        build(dropout_yaml("{dropout_ratio: 1.0}"), [(2,)])
    assert str(err.value) == ("<string>:5: layer[0].dropout_param.dropout_ratio: dropout_ratio "
                              "1.0 drops everything; use a value in [0, 1)")


# --- precision ------------------------------------------------------------------------------

def test_eltwise_sum_coefficients_and_inner_product_keep_bfloat16_under_autocast():
    sum2 = build(layer_yaml("Eltwise", bottoms="[a, b]",
                            param="eltwise_param: {operation: SUM, coeff: [0.5, -2]}"),
                 [(2, 3), (2, 3)])
    a = torch.full((2, 3), 3.0, dtype=torch.bfloat16)
    b = torch.full((2, 3), 1.0, dtype=torch.bfloat16)
    out = sum2(a, b)
    assert out.dtype == torch.bfloat16 and torch.equal(out, torch.full_like(a, -0.5))
    ip = build(layer_yaml("InnerProduct", param="inner_product_param: {num_output: 4, "
                          "weight_filler: {type: constant, value: 0.5}, "
                          "bias_filler: {type: constant, value: 1}}"), [(2, 3)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = ip(torch.ones(2, 3))
    assert y.dtype == torch.bfloat16 and torch.equal(y, torch.full((2, 4), 2.5,
                                                                   dtype=torch.bfloat16))
    y.float().sum().backward()
    assert ip.weight.grad.dtype == torch.float32 and ip.bias.grad.tolist() == [2.0] * 4
