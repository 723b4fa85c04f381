"""SPP and Im2col: values against plain references, float64 gradcheck, errors."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from layer_helpers import build, gradcheck, rand

from caffe_py.errors import NetError
from caffe_py.layers.spatial import level_geometry


def spp(height: int, pool: str = "MAX") -> str:
    return (f"name: s\ntype: SPP\nbottom: x\ntop: y\n"
            f"spp_param: {{pyramid_height: {height}, pool: {pool}}}\n")


def np_pool_level(x: np.ndarray, level: int, method: str) -> np.ndarray:
    """Level ``level`` of the pyramid by loops: 2^level bins per axis, Caffe's windows."""
    n, c, h, w = x.shape
    (kh, ph), (kw, pw) = level_geometry(level, h), level_geometry(level, w)
    bins = 2 ** level
    out = np.zeros((n, c, bins, bins))
    for i in range(bins):
        for j in range(bins):
            r0, c0 = i * kh - ph, j * kw - pw
            r1, c1 = min(r0 + kh, h + ph), min(c0 + kw, w + pw)  # AVE divides by this window
            window = x[:, :, max(r0, 0):min(r1, h), max(c0, 0):min(c1, w)]
            if method == "MAX":
                out[:, :, i, j] = window.max(axis=(2, 3))
            else:
                out[:, :, i, j] = window.sum(axis=(2, 3)) / ((r1 - r0) * (c1 - c0))
    return out


def test_level_geometry_is_caffes():
    assert level_geometry(0, 7) == (7, 0)
    assert level_geometry(2, 7) == (2, 1)   # 4 bins of 2 over 7: one padded row each side
    assert level_geometry(2, 9) == (3, 2)   # 4 bins of 3 over 9: remainder 3, pad (3+1)/2


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_spp_levels_flattened_and_concatenated(pool):
    layer = build(spp(3, pool), [(2, 3, 7, 9)])
    assert layer.top_shapes == [(2, 3 * (1 + 4 + 16))]
    x = rand(2, 3, 7, 9)
    want = np.concatenate([np_pool_level(x.numpy(), i, pool).reshape(2, -1)
                           for i in range(3)], axis=1)
    np.testing.assert_allclose(layer(x).numpy(), want, rtol=1e-12)
    assert gradcheck(layer, rand(1, 2, 6, 6, seed=2)) if pool == "AVE" else True


def test_spp_one_level_keeps_the_pooled_4d_top_and_other_sizes_work():
    layer = build(spp(1), [(2, 3, 5, 5)])
    assert layer.top_shapes == [(2, 3, 1, 1)]
    x = rand(1, 3, 6, 4)  # another input size: the windows follow it, as Caffe's Reshape
    np.testing.assert_allclose(layer(x).numpy()[:, :, 0, 0], x.numpy().max(axis=(2, 3)))
    two = build(spp(2, "AVE"), [(1, 2, 4, 4)])
    np.testing.assert_allclose(two(rand(1, 2, 6, 6, seed=3)).shape, (1, 2 * 5))


def test_spp_needs_a_height_and_4_axes():
    with pytest.raises(NetError, match="spp_param.pyramid_height is not set"):
        build("name: s\ntype: SPP\nbottom: x\ntop: y\n", [(1, 1, 4, 4)])
    with pytest.raises(NetError, match="expected 4 axes"):
        build(spp(2), [(1, 4, 4)])
    with pytest.raises(NetError) as err:
        build(spp(3), [(1, 1, 5, 6)])
    assert str(err.value) == (
        "<string>:1: layer[0]: layer 's' (SPP): pyramid level 2 of a 5 x 6 input needs 2 x 2 "
        "windows padded by 2 x 1, and Caffe's pooling takes a pad smaller than the window; "
        "use a larger input or a smaller pyramid_height")


def np_im2col(x: np.ndarray, k: tuple, s: tuple, p: tuple, d: tuple) -> np.ndarray:
    """Caffe's im2col_nd by loops: row (c, kernel offsets), column (output position)."""
    spatial = x.shape[2:]
    out = [(n + 2 * pp - (dd * (kk - 1) + 1)) // ss + 1
           for n, kk, ss, pp, dd in zip(spatial, k, s, p, d, strict=True)]
    cols = np.zeros((x.shape[0], x.shape[1] * math.prod(k), *out))
    for b in range(x.shape[0]):
        for c in range(x.shape[1]):
            for r, offset in enumerate(np.ndindex(*k)):
                for pos in np.ndindex(*out):
                    src = [o * ss - pp + kk * dd for o, ss, pp, kk, dd in
                           zip(pos, s, p, offset, d, strict=True)]
                    if all(0 <= v < n for v, n in zip(src, spatial, strict=True)):
                        cols[(b, c * math.prod(k) + r, *pos)] = x[(b, c, *src)]
    return cols


@pytest.mark.parametrize(("block", "shape", "geometry"), [
    ("kernel_size: 3, pad: 1", (2, 3, 5, 5), ((3, 3), (1, 1), (1, 1), (1, 1))),
    ("kernel_h: 2, kernel_w: 3, stride_h: 2, stride_w: 1, pad_h: 1, pad_w: 0", (1, 2, 5, 6),
     ((2, 3), (2, 1), (1, 0), (1, 1))),
    ("kernel_size: 2, dilation: 2", (1, 2, 5, 5), ((2, 2), (1, 1), (0, 0), (2, 2))),
    ("kernel_size: 3, stride: 2", (2, 3, 8), ((3,), (2,), (0,), (1,))),
    ("kernel_size: 2, pad: [0, 1, 0], dilation: [1, 1, 2]", (1, 2, 3, 4, 4),
     ((2, 2, 2), (1, 1, 1), (0, 1, 0), (1, 1, 2))),
])
def test_im2col_columns_in_caffes_order(block, shape, geometry):
    layer = build(f"name: c\ntype: Im2col\nbottom: x\ntop: y\nconvolution_param: {{{block}}}\n",
                  [shape])
    x = rand(*shape)
    want = np_im2col(x.numpy(), *geometry)
    assert layer.top_shapes == [want.shape]
    np.testing.assert_array_equal(layer(x).numpy(), want)
    assert gradcheck(layer, rand(*shape, seed=5))


def test_im2col_times_weights_is_convolution():
    layer = build("name: c\ntype: Im2col\nbottom: x\ntop: y\n"
                  "convolution_param: {kernel_size: 3, stride: 2, pad: 1}\n", [(2, 3, 7, 6)])
    x, w = rand(2, 3, 7, 6), rand(4, 3, 3, 3, seed=1)
    cols = layer(x)  # (N, C*9, oh, ow)
    y = torch.einsum("ok,nkhw->nohw", w.reshape(4, -1), cols)
    np.testing.assert_allclose(y.numpy(), F.conv2d(x, w, stride=2, padding=1).numpy(),
                               rtol=1e-10, atol=1e-12)


def test_im2col_channel_axis_2_and_kernel_error():
    layer = build("name: c\ntype: Im2col\nbottom: x\ntop: y\n"
                  "convolution_param: {kernel_size: 2, axis: 2}\n", [(2, 3, 4, 5, 5)])
    assert layer.top_shapes == [(2, 3, 16, 4, 4)]
    x = rand(2, 3, 4, 5, 5)
    np.testing.assert_array_equal(layer(x).numpy()[1, 2],
                                  np_im2col(x.numpy()[1, 2][None], (2, 2), (1, 1), (0, 0),
                                            (1, 1))[0])
    with pytest.raises(NetError, match="smaller than the"):
        build("name: c\ntype: Im2col\nbottom: x\ntop: y\nconvolution_param: {kernel_size: 5}\n",
              [(1, 1, 3, 3)])
