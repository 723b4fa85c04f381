"""Crop, Tile, Reduction, ArgMax, Embed, Filter, BatchReindex, Parameter: values against numpy,
float64 gradcheck, and the errors naming the layer."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from layer_helpers import build, gradcheck, rand

from caffe_py.errors import DataError, NetError


def layer(kind: str, block: str = "", bottoms: str = "x", tops: str = "y") -> str:
    return f"name: u\ntype: {kind}\nbottom: [{bottoms}]\ntop: [{tops}]\n{block}\n"


def test_crop_offsets_per_axis_and_gradient():
    crop = build(layer("Crop", "crop_param: {offset: [1, 2]}", "x, ref"),
                 [(2, 3, 6, 7), (1, 1, 4, 4)])
    assert crop.top_shapes == [(2, 3, 4, 4)]
    x = rand(2, 3, 6, 7)
    y = crop(x, torch.zeros(1, 1, 4, 4))
    np.testing.assert_array_equal(y.numpy(), x.numpy()[:, :, 1:5, 2:6])
    assert gradcheck(crop, rand(2, 3, 6, 7, seed=1), torch.zeros(1, 1, 4, 4))


def test_crop_one_offset_for_all_axes_and_errors():
    crop = build(layer("Crop", "crop_param: {axis: 1, offset: 1}", "x, ref"),
                 [(2, 4, 5, 5), (9, 2, 3, 3)])
    assert crop.top_shapes == [(2, 2, 3, 3)]
    x = rand(2, 4, 5, 5)
    np.testing.assert_array_equal(crop(x, torch.zeros(9, 2, 3, 3)).numpy(),
                                  x.numpy()[:, 1:3, 1:4, 1:4])
    with pytest.raises(NetError) as err:
        build(layer("Crop", "crop_param: {offset: 3}", "x, ref"), [(1, 1, 5, 5), (1, 1, 3, 3)])
    assert str(err.value) == (
        "<string>:1: layer[0]: layer 'u' (Crop): the crop of axis 2 is out of bounds: size 3 "
        "at offset 3 in 5 (bottom 'x' [1, 1, 5, 5]); use a smaller offset or a larger input")
    with pytest.raises(NetError, match="3 offsets for the 2 axes cropped from axis 2"):
        build(layer("Crop", "crop_param: {offset: [1, 1, 1]}", "x, ref"),
              [(1, 1, 5, 5), (1, 1, 3, 3)])


@pytest.mark.parametrize(("axis", "tiles"), [(1, 3), (0, 2), (-1, 4)])
def test_tile_repeats_the_block_from_axis(axis, tiles):
    tile = build(layer("Tile", f"tile_param: {{axis: {axis}, tiles: {tiles}}}"), [(2, 3, 2)])
    x = rand(2, 3, 2)
    want = np.concatenate([x.numpy()] * tiles, axis=axis)
    assert tile.top_shapes == [want.shape]
    np.testing.assert_array_equal(tile(x).numpy(), want)
    assert gradcheck(tile, rand(2, 3, 2, seed=2))


def test_tile_needs_tiles():
    with pytest.raises(NetError, match="tile_param.tiles is not set"):
        build(layer("Tile"), [(2, 3)])


@pytest.mark.parametrize(("op", "axis", "coeff", "ref"), [
    ("SUM", 0, 1.0, lambda f: f.sum(-1)),
    ("ASUM", 1, 1.0, lambda f: np.abs(f).sum(-1)),
    ("SUMSQ", 2, 0.5, lambda f: 0.5 * (f * f).sum(-1)),
    ("MEAN", -1, 2.0, lambda f: 2.0 * f.mean(-1)),
])
def test_reduction_operations_over_the_tail(op, axis, coeff, ref):
    red = build(layer("Reduction", f"reduction_param: {{operation: {op}, axis: {axis}, "
                                   f"coeff: {coeff}}}"), [(2, 3, 4)])
    canonical = axis % 3
    assert red.top_shapes == [(2, 3, 4)[:canonical]]
    x = rand(2, 3, 4)
    want = ref(x.numpy().reshape(*x.shape[:canonical], -1))
    np.testing.assert_allclose(red(x).numpy(), want, rtol=1e-12)
    assert gradcheck(red, rand(2, 3, 4, seed=3))


def test_reduction_asum_gradient_at_zero_is_zero():
    red = build(layer("Reduction", "reduction_param: {operation: ASUM}"), [(3,)])
    x = torch.tensor([0.0, -2.0, 3.0], requires_grad=True)
    red(x).backward()
    assert x.grad.tolist() == [0.0, -1.0, 1.0]


def np_argmax(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Caffe's partial sort of (value, index) pairs, descending: ties to the higher index."""
    idx, val = [], []
    for row in rows:
        ranked = sorted(((v, i) for i, v in enumerate(row)), reverse=True)[:k]
        idx.append([i for _, i in ranked])
        val.append([v for v, _ in ranked])
    return np.array(idx, float), np.array(val)


def test_argmax_flattened_with_values_and_ties():
    x = torch.tensor(np.random.default_rng(0).integers(0, 3, (4, 2, 3)).astype(np.float32))
    am = build(layer("ArgMax", "argmax_param: {top_k: 2, out_max_val: true}"), [(4, 2, 3)])
    assert am.top_shapes == [(4, 2, 2)]
    idx, val = np_argmax(x.numpy().reshape(4, -1), 2)
    y = am(x).numpy()
    np.testing.assert_array_equal(y[:, 0], idx)
    np.testing.assert_array_equal(y[:, 1], val)
    plain = build(layer("ArgMax"), [(4, 2, 3, 1)])
    assert plain.top_shapes == [(4, 1, 1, 1)]
    np.testing.assert_array_equal(plain(x.reshape(4, 2, 3, 1)).numpy().ravel(), idx[:, 0])


def test_argmax_along_an_axis():
    x = rand(2, 5, 3, dtype=torch.float32)
    idx = build(layer("ArgMax", "argmax_param: {axis: 1, top_k: 2}"), [(2, 5, 3)])
    val = build(layer("ArgMax", "argmax_param: {axis: 1, top_k: 2, out_max_val: true}"),
                [(2, 5, 3)])
    assert idx.top_shapes == val.top_shapes == [(2, 2, 3)]
    order = np.argsort(-x.numpy(), axis=1, kind="stable")[:, :2]
    np.testing.assert_array_equal(idx(x).numpy(), order)
    np.testing.assert_array_equal(val(x).numpy(), np.take_along_axis(x.numpy(), order, 1))
    with pytest.raises(NetError, match="top_k 6 exceeds the 5 of axis 1"):
        build(layer("ArgMax", "argmax_param: {axis: 1, top_k: 6}"), [(2, 5, 3)])


def test_embed_rows_bias_and_accumulated_gradient():
    emb = build(layer("Embed", "embed_param: {num_output: 3, input_dim: 4, weight_filler: "
                               "{type: gaussian}, bias_filler: {type: gaussian}}", "ids"),
                [(2, 3)])
    assert emb.blob_names == ["weight", "bias"] and emb.weight.shape == (4, 3)
    assert emb.top_shapes == [(2, 3, 3)]
    ids = torch.tensor([[0.0, 3.0, 3.0], [1.0, 2.9, 0.0]])  # 2.9 truncates to 2
    y = emb(ids)
    w, b = emb.weight.detach().numpy(), emb.bias.detach().numpy()
    np.testing.assert_allclose(y.detach().numpy(), w[[[0, 3, 3], [1, 2, 0]]] + b, rtol=1e-6)
    y.sum().backward()
    np.testing.assert_array_equal(emb.weight.grad.numpy()[:, 0], [2, 1, 1, 2])
    np.testing.assert_array_equal(emb.bias.grad.numpy(), [6, 6, 6])
    with pytest.raises(DataError) as err:
        emb(torch.tensor([[0.0, 4.0, 1.0], [0.0, 0.0, 0.0]]))
    assert str(err.value) == ("<string>:1: layer[0]: layer 'u' (Embed): id 4 is outside [0, 4); "
                              "check bottom 'ids'")


def test_filter_selects_items_and_routes_gradients():
    f = build(layer("Filter", "", "a, b, sel", "ya, yb"), [(4, 3), (4, 2, 2), (4, 1)])
    assert f.top_shapes == [(4, 3), (4, 2, 2)]  # Caffe's first reshape keeps every item
    a, b = rand(4, 3).requires_grad_(), rand(4, 2, 2, seed=1)
    ya, yb = f(a, b, torch.tensor([[1.0], [0.0], [2.0], [0.0]]))
    np.testing.assert_array_equal(ya.detach().numpy(), a.detach().numpy()[[0, 2]])
    np.testing.assert_array_equal(yb.numpy(), b.numpy()[[0, 2]])
    ya.sum().backward()
    assert a.grad[:, 0].tolist() == [1.0, 0.0, 1.0, 0.0]
    with pytest.raises(NetError, match=r"\(the selector\) has shape \[4, 2\]"):
        build(layer("Filter", "", "a, sel", "ya"), [(4, 3), (4, 2)])


def test_batch_reindex_gathers_and_sums_gradients():
    br = build(layer("BatchReindex", "", "x, idx"), [(3, 2), (5,)])
    assert br.top_shapes == [(5, 2)]
    x = rand(3, 2)
    index = torch.tensor([2.0, 0.0, 2.0, 2.0, 1.0])
    np.testing.assert_array_equal(br(x, index).numpy(), x.numpy()[[2, 0, 2, 2, 1]])
    x64 = rand(3, 2, seed=4).requires_grad_()
    assert torch.autograd.gradcheck(lambda v: br.double()(v, index), (x64,))
    with pytest.raises(DataError, match="index 3 is outside"):
        br(x, torch.tensor([3.0]))


def test_parameter_top_is_its_learnable_blob():
    par = build("name: p\ntype: Parameter\ntop: w\nparameter_param: {shape: {dim: [2, 3]}}\n",
                [])
    assert par.top_shapes == [(2, 3)] and par.blob_names == ["blob"]
    w = par()
    assert w is par.blob and w.abs().sum() == 0
    (w * 2).sum().backward()
    assert par.blob.grad.tolist() == [[2.0] * 3] * 2
