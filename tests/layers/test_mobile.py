"""The mobile and attention nets' fork layers (ConvolutionDepthwise, ShuffleChannel, Axpy)
against loop references written from the forks' sources, and float64 gradchecks. No fork of
these is built here (tests/golden/forks holds the ones that are)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from layer_helpers import build, gradcheck, rand

from caffe_py.errors import NetError


def depthwise_loops(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride, pad,
                    dilation) -> np.ndarray:
    """conv_dw_layer.cpp's Forward_cpu."""
    n, c, h, wd = x.shape
    kh, kw = w.shape[2:]
    oh = (h + 2 * pad[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    ow = (wd + 2 * pad[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    top = np.zeros((n, c, oh, ow))
    for i in range(n):
        for k in range(c):
            for y in range(oh):
                for z in range(ow):
                    value = 0.0
                    for a in range(kh):
                        for e in range(kw):
                            hi = -pad[0] + y * stride[0] + a * dilation[0]
                            wi = -pad[1] + z * stride[1] + e * dilation[1]
                            if 0 <= hi < h and 0 <= wi < wd:
                                value += w[k, 0, a, e] * x[i, k, hi, wi]
                    top[i, k, y, z] = value + (b[k] if b is not None else 0.0)
    return top


@pytest.mark.parametrize("param,stride,pad,dilation", [
    ("{num_output: 99, kernel_size: 3, stride: 2, pad: 1}", (2, 2), (1, 1), (1, 1)),
    ("{kernel_h: 3, kernel_w: 2, stride_h: 1, stride_w: 2, pad_h: 1, pad_w: 0, "
     "bias_term: false}", (1, 2), (1, 0), (1, 1)),
    ("{kernel_size: [3, 2], stride: [2, 1], pad: [2, 1], dilation: 2}", (2, 1), (2, 1), (2, 2)),
])
def test_convolution_depthwise_matches_the_forks_loops(param, stride, pad, dilation):
    fillers = "weight_filler: {type: gaussian}, bias_filler: {type: gaussian}"
    layer = build(f"name: dw\ntype: ConvolutionDepthwise\nbottom: x\ntop: y\n"
                  f"convolution_param: {param.rstrip('}')}, {fillers}}}\n", [(2, 3, 6, 7)])
    layer = layer.double()
    x = rand(2, 3, 6, 7, seed=1)
    bias = layer.bias.detach().numpy() if layer.bias_term else None
    want = depthwise_loops(x.numpy(), layer.weight.detach().numpy(), bias, stride, pad, dilation)
    assert layer.top_shapes == [want.shape]  # 3 channels whatever num_output says
    np.testing.assert_allclose(layer(x).detach().numpy(), want, rtol=1e-10, atol=1e-12)
    assert gradcheck(layer, x)


def test_shuffle_channel_interleaves_the_groups():
    layer = build("name: s\ntype: ShuffleChannel\nbottom: x\ntop: y\n"
                  "shuffle_channel_param: {group: 3}\n", [(2, 6, 2, 2)]).double()
    x = rand(2, 6, 2, 2, seed=2)
    y = layer(x)
    # Resize_cpu: input channel i * (C / g) + j -> output channel j * g + i
    for i in range(3):
        for j in range(2):
            assert torch.equal(y[:, j * 3 + i], x[:, i * 2 + j])
    assert gradcheck(layer, x)
    with pytest.raises(NetError, match="has 6 channels, not a multiple of "
                                       "shuffle_channel_param.group 4"):
        build("name: s\ntype: ShuffleChannel\nbottom: x\ntop: y\n"
              "shuffle_channel_param: {group: 4}\n", [(2, 6, 2, 2)])


@pytest.mark.parametrize("scale_shape", [(2, 3, 1, 1), (2, 3)])
def test_axpy_is_a_times_x_plus_y(scale_shape):
    layer = build("name: a\ntype: Axpy\nbottom: [a, x, y]\ntop: z\n",
                  [scale_shape, (2, 3, 4, 5), (2, 3, 4, 5)])
    a, x, y = rand(*scale_shape, seed=3), rand(2, 3, 4, 5, seed=4), rand(2, 3, 4, 5, seed=5)
    want = a.reshape(2, 3, 1, 1).numpy() * x.numpy() + y.numpy()
    np.testing.assert_allclose(layer(a, x, y).numpy(), want, rtol=1e-12)
    assert gradcheck(layer, a, x, y)
    with pytest.raises(NetError, match=r"\(the scale\) has shape \[2, 3, 2, 1\]"):
        build("name: a\ntype: Axpy\nbottom: [a, x, y]\ntop: z\n",
              [(2, 3, 2, 1), (2, 3, 4, 5), (2, 3, 4, 5)])
