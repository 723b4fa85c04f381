"""Convolution, Deconvolution, Pooling and LRN against plain loop references."""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from layer_helpers import build, gradcheck, rand

from caffe_py.errors import NetError, SpecError
from caffe_py.layers import BuildContext, lookup

FLT_MAX = float(np.finfo(np.float32).max)


# --- references ------------------------------------------------------------------------------
def naive_conv(x, w, b, stride, pad, dilation, group):
    """Caffe's convolution as loops: x (N, C, H, W), w (O, C/g, kh, kw)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilation
    oh = (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1
    ow = (wd + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1
    out = np.zeros((n, o, oh, ow))
    og = o // group
    for b_ in range(n):
        for oc in range(o):
            g = oc // og
            for y in range(oh):
                for z in range(ow):
                    acc = 0.0 if b is None else b[oc]
                    for ci in range(cg):
                        for i in range(kh):
                            for j in range(kw):
                                hy, wz = y * sh - ph + i * dh, z * sw - pw + j * dw
                                if 0 <= hy < h and 0 <= wz < wd:
                                    acc += x[b_, g * cg + ci, hy, wz] * w[oc, ci, i, j]
                    out[b_, oc, y, z] = acc
    return out


def naive_deconv(x, w, b, stride, pad, dilation, group):
    """Caffe's deconvolution as scatter loops: x (N, C, H, W), w (C, O/g, kh, kw)."""
    n, c, h, wd = x.shape
    _, og, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, pad, dilation
    oh = sh * (h - 1) + dh * (kh - 1) + 1 - 2 * ph
    ow = sw * (wd - 1) + dw * (kw - 1) + 1 - 2 * pw
    out = np.zeros((n, og * group, oh, ow))
    cg = c // group
    for b_ in range(n):
        for ci in range(c):
            g = ci // cg
            for y in range(h):
                for z in range(wd):
                    for oc in range(og):
                        for i in range(kh):
                            for j in range(kw):
                                hy, wz = y * sh - ph + i * dh, z * sw - pw + j * dw
                                if 0 <= hy < oh and 0 <= wz < ow:
                                    out[b_, g * og + oc, hy, wz] += (x[b_, ci, y, z]
                                                                     * w[ci, oc, i, j])
    if b is not None:
        out += np.asarray(b)[None, :, None, None]
    return out


def caffe_pool(x, method, kernel, stride, pad, mask=False, ceil=True):
    """Caffe's pooling_layer.cpp Forward_cpu (and the GPU STOCHASTIC test formula) as loops."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (ph, pw) = kernel, stride, pad
    rnd = math.ceil if ceil else math.floor
    oh = int(rnd((h + 2 * ph - kh) / sh)) + 1
    ow = int(rnd((w + 2 * pw - kw) / sw)) + 1
    if ph or pw:
        oh -= (oh - 1) * sh >= h + ph
        ow -= (ow - 1) * sw >= w + pw
    out = np.zeros((n, c, oh, ow))
    idx = np.full((n, c, oh, ow), -1.0)
    for a in range(n):
        for ch in range(c):
            for y in range(oh):
                for z in range(ow):
                    hs, ws = y * sh - ph, z * sw - pw
                    he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
                    size = (he - hs) * (we - ws)
                    hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
                    win = x[a, ch, hs:he, ws:we]
                    if method == "MAX":
                        best = -FLT_MAX
                        for i in range(hs, he):
                            for j in range(ws, we):
                                if x[a, ch, i, j] > best:
                                    best, idx[a, ch, y, z] = x[a, ch, i, j], i * w + j
                        out[a, ch, y, z] = best
                    elif method == "AVE":
                        out[a, ch, y, z] = win.sum() / size if size > 0 else 0.0
                    else:
                        out[a, ch, y, z] = (win ** 2).sum() / (np.finfo(np.float32).tiny
                                                               + win.sum())
    return (out, idx) if mask else out


def lrn_across(x, n, alpha, beta, k):
    out = np.zeros_like(x)
    half = (n - 1) // 2
    for c in range(x.shape[1]):
        lo, hi = max(0, c - half), min(x.shape[1], c + half + 1)
        scale = k + alpha / n * (x[:, lo:hi] ** 2).sum(1)
        out[:, c] = x[:, c] * scale ** -beta
    return out


def lrn_within(x, n, alpha, beta):
    _, _, h, w = x.shape
    half = (n - 1) // 2
    out = np.zeros_like(x)
    for i in range(h):
        for j in range(w):
            win = x[:, :, max(0, i - half):i + half + 1, max(0, j - half):j + half + 1]
            mean = (win ** 2).sum((2, 3)) / (n * n)  # padding counts in the divisor
            out[:, :, i, j] = x[:, :, i, j] * (1 + alpha * mean) ** -beta
    return out


# --- Convolution ----------------------------------------------------------------------------
CONV_CASES = [
    # (convolution_param, input shape)
    ("{num_output: 4, kernel_size: 3}", (2, 2, 5, 6)),
    ("{num_output: 4, kernel_size: 3, stride: 2, pad: 1}", (2, 2, 7, 6)),
    ("{num_output: 4, kernel_size: 2, dilation: 2, pad: [1, 2], stride: [1, 2]}", (1, 2, 6, 7)),
    ("{num_output: 6, kernel_size: 3, group: 2, pad: 1}", (2, 4, 4, 5)),
    ("{num_output: 3, kernel_h: 3, kernel_w: 1, stride_h: 2, stride_w: 1, pad_h: 1, pad_w: 0}",
     (1, 3, 5, 4)),
    ("{num_output: 2, kernel_size: 1, bias_term: false}", (2, 3, 3, 3)),
]

FILLERS = "weight_filler: {type: gaussian, std: 1}, bias_filler: {type: uniform}"


def conv_yaml(param: str, kind: str = "Convolution") -> str:
    param = param.rstrip("}") + ", " + FILLERS + "}"
    return (f"name: conv\ntype: {kind}\nbottom: data\ntop: out\n"
            f"convolution_param: {param}\n")


@pytest.mark.parametrize("param,shape", CONV_CASES)
def test_convolution_matches_naive_loops(param, shape):
    layer = build(conv_yaml(param), [shape])
    x = rand(*shape).float()
    y = layer(x)
    b = layer.bias.detach().double().numpy() if layer.has_bias else None
    want = naive_conv(x.double().numpy(), layer.weight.detach().double().numpy(), b,
                      layer.stride, layer.pad, layer.dilation, layer.group)
    assert layer.top_shapes == [want.shape]
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-5, atol=1e-5)


def test_convolution_blobs_in_caffe_order_and_shapes():
    layer = build(conv_yaml("{num_output: 6, kernel_size: [3, 2], group: 3}"), [(1, 9, 5, 5)])
    assert layer.blob_names == ["weight", "bias"]
    assert tuple(layer.weight.shape) == (6, 3, 3, 2)  # (O, C/group, kh, kw)
    assert tuple(layer.bias.shape) == (6,)
    assert layer.top_shapes == [(1, 6, 3, 4)]


def test_convolution_without_filler_starts_at_zero():
    layer = build("name: c\ntype: Convolution\nbottom: d\ntop: o\n"
                  "convolution_param: {num_output: 2, kernel_size: 3}\n", [(1, 1, 4, 4)])
    assert not layer.weight.detach().any() and not layer.bias.detach().any()


def test_convolution_works_on_another_batch_size():
    layer = build(conv_yaml("{num_output: 2, kernel_size: 3, stride: 2}"), [(4, 1, 7, 7)])
    assert tuple(layer(torch.randn(3, 1, 7, 7)).shape) == (3, 2, 3, 3)


def test_convolution_1d_equals_2d_with_unit_height():
    layer = build(conv_yaml("{num_output: 3, kernel_size: 3, stride: 2, pad: 1, dilation: 1}"),
                  [(2, 2, 9)])
    x = rand(2, 2, 9).float()
    b = layer.bias.detach().double().numpy()
    want = naive_conv(x.double().numpy()[:, :, None], layer.weight.detach().double().numpy()
                      [:, :, None], b, (1, 2), (0, 1), (1, 1), 1)[:, :, 0]
    assert layer.top_shapes == [(2, 3, 5)]
    np.testing.assert_allclose(layer(x).detach().numpy(), want, rtol=1e-5, atol=1e-5)


def test_convolution_3d_shape_and_gradient():
    layer = build(conv_yaml("{num_output: 2, kernel_size: [2, 3, 2], stride: [1, 2, 1], "
                            "pad: 1}"), [(1, 1, 2, 3, 3)])
    assert tuple(layer.weight.shape) == (2, 1, 2, 3, 2)
    assert layer.top_shapes == [(1, 2, 3, 2, 4)]
    assert gradcheck(layer, rand(1, 1, 2, 3, 3))


def test_convolution_channel_axis_two_folds_leading_axes_into_batch():
    layer = build(conv_yaml("{num_output: 3, kernel_size: 3, axis: 2}"), [(2, 3, 2, 5, 5)])
    x = rand(2, 3, 2, 5, 5).float()
    y = layer(x)
    assert layer.top_shapes == [(2, 3, 3, 3, 3)] and tuple(y.shape) == (2, 3, 3, 3, 3)
    b = layer.bias.detach().double().numpy()
    want = naive_conv(x.reshape(6, 2, 5, 5).double().numpy(),
                      layer.weight.detach().double().numpy(), b, (1, 1), (0, 0), (1, 1), 1)
    np.testing.assert_allclose(y.detach().reshape(6, 3, 3, 3).numpy(), want, rtol=1e-5,
                               atol=1e-5)


def test_convolution_several_bottoms_share_weights():
    text = ("name: c\ntype: Convolution\nbottom: [a, b]\ntop: [ya, yb]\n"
            f"convolution_param: {{num_output: 2, kernel_size: 3, {FILLERS}}}\n")
    layer = build(text, [(1, 1, 4, 4), (1, 1, 4, 4)])
    a, b = rand(1, 1, 4, 4, seed=1).float(), rand(1, 1, 4, 4, seed=2).float()
    ya, yb = layer(a, b)
    assert layer.top_shapes == [(1, 2, 2, 2), (1, 2, 2, 2)]
    assert len(layer.blob_names) == 2
    torch.testing.assert_close(ya, torch.nn.functional.conv2d(a, layer.weight, layer.bias))
    torch.testing.assert_close(yb, torch.nn.functional.conv2d(b, layer.weight, layer.bias))


@pytest.mark.parametrize("param,shape", [
    ("{num_output: 2, kernel_size: 2, dilation: 2, pad: [1, 0], stride: [1, 2]}", (1, 1, 4, 5)),
    ("{num_output: 4, kernel_size: 2, group: 2, pad: 1}", (1, 2, 3, 3)),
])
def test_convolution_gradients(param, shape):
    assert gradcheck(build(conv_yaml(param), [shape]), rand(*shape))


def test_convolution_channels_not_divisible_by_group():
    with pytest.raises(NetError) as err:
        build(conv_yaml("{num_output: 4, kernel_size: 3, group: 2}"), [(1, 3, 5, 5)])
    assert str(err.value) == ("<string>:1: layer[0]: layer 'conv' (Convolution): bottom 'data' "
                              "(index 0) has 3 channels, which group 2 does not divide; make "
                              "channels a multiple of group")


@pytest.mark.parametrize("param,shape,message", [
    ("{num_output: 3, kernel_size: 3, group: 2}", (1, 4, 5, 5),
     "num_output 3 is not a multiple of group 2; make num_output a multiple of group"),
    ("{kernel_size: 3}", (1, 4, 5, 5),
     "num_output is not set; set convolution_param.num_output"),
    ("{num_output: 2}", (1, 4, 5, 5),
     "no kernel size is set; set kernel_size (or kernel_h and kernel_w)"),
    ("{num_output: 2, kernel_size: [3, 3, 3]}", (1, 4, 5, 5),
     "kernel_size is given 3 times for 2 spatial axes; give it once, or once per spatial axis"),
    ("{num_output: 2, kernel_size: 3, kernel_h: 3, kernel_w: 3}", (1, 4, 5, 5),
     "both kernel_size and kernel_h/kernel_w are set; keep one of them"),
    ("{num_output: 2, kernel_h: 3}", (1, 4, 5, 5),
     "only one of kernel_h and kernel_w is set; set both, or use kernel_size"),
    ("{num_output: 2, kernel_size: 3, pad_h: 1, pad_w: 1}", (1, 4, 5, 5, 5),
     "pad_h and pad_w apply to 2-D convolution only; this bottom has 3 spatial axes; use pad"),
    ("{num_output: 2, kernel_size: 3, stride: 0}", (1, 4, 5, 5),
     "stride [0, 0] has a zero; every stride is >= 1"),
    ("{num_output: 2, kernel_size: 4, dilation: 2}", (1, 4, 6, 6),
     "bottom 'data' (index 0) of spatial size [6, 6] padded to [6, 6] is smaller than the "
     "(dilated) kernel [7, 7]; use a smaller kernel_size or dilation, or more pad"),
    ("{num_output: 2, kernel_size: 3}", (4, 5),
     "bottom 'data' (index 0) has shape [4, 5]: 0 spatial axes after the channel axis 1; "
     "1 to 3 spatial axes are supported"),
])
def test_convolution_errors(param, shape, message):
    with pytest.raises(NetError) as err:
        build(conv_yaml(param), [shape])
    assert str(err.value) == f"<string>:1: layer[0]: layer 'conv' (Convolution): {message}"


def test_convolution_bottoms_of_different_shapes():
    text = ("name: c\ntype: Convolution\nbottom: [a, b]\ntop: [ya, yb]\n"
            "convolution_param: {num_output: 2, kernel_size: 3}\n")
    with pytest.raises(NetError, match=r"bottom 'b' \(index 1\) has shape \[1, 1, 5, 5\] but "
                                       r"bottom 'a' \(index 0\) has \[1, 1, 4, 4\]"):
        build(text, [(1, 1, 4, 4), (1, 1, 5, 5)])


# --- Deconvolution --------------------------------------------------------------------------
DECONV_CASES = [
    ("{num_output: 3, kernel_size: 3}", (2, 2, 3, 4)),
    ("{num_output: 2, kernel_size: 4, stride: 2, pad: 1}", (1, 3, 3, 3)),
    ("{num_output: 4, kernel_size: 3, stride: [2, 1], dilation: 2, group: 2, pad: [1, 0]}",
     (1, 4, 3, 3)),
]


@pytest.mark.parametrize("param,shape", DECONV_CASES)
def test_deconvolution_matches_naive_loops(param, shape):
    layer = build(conv_yaml(param, "Deconvolution"), [shape])
    x = rand(*shape).float()
    want = naive_deconv(x.double().numpy(), layer.weight.detach().double().numpy(),
                        layer.bias.detach().double().numpy(), layer.stride, layer.pad,
                        layer.dilation, layer.group)
    assert layer.top_shapes == [want.shape]
    np.testing.assert_allclose(layer(x).detach().numpy(), want, rtol=1e-5, atol=1e-5)


def test_deconvolution_weight_is_stored_input_channels_first():
    layer = build(conv_yaml("{num_output: 6, kernel_size: [2, 3], group: 2}", "Deconvolution"),
                  [(1, 4, 5, 5)])
    assert tuple(layer.weight.shape) == (4, 3, 2, 3)  # (C_in, O/group, kh, kw)
    assert layer.top_shapes == [(1, 6, 6, 7)]


def test_deconvolution_gradients():
    param = "{num_output: 4, kernel_size: 2, stride: [2, 1], dilation: 2, group: 2, pad: [1, 0]}"
    assert gradcheck(build(conv_yaml(param, "Deconvolution"), [(1, 2, 2, 3)]), rand(1, 2, 2, 3))


# --- Pooling --------------------------------------------------------------------------------
def pool_yaml(param: str, tops: str = "out") -> str:
    return f"name: pool\ntype: Pooling\nbottom: data\ntop: {tops}\npooling_param: {param}\n"


POOL_CASES = [
    # (pooling_param, input shape, torch's op computes it directly)
    ("{kernel_size: 3, stride: 2}", (2, 3, 7, 6), True),  # ceil: a partial last window
    ("{kernel_size: 3, stride: 2, pad: 1}", (1, 2, 5, 6), True),
    ("{kernel_size: 2, stride: 2, pad: 1}", (1, 2, 5, 5), True),  # last window dropped
    ("{kernel_size: 3, stride: 1, pad: 2}", (1, 2, 4, 5), False),  # pad > kernel / 2
    ("{kernel_size: 1, stride: 3}", (1, 2, 5, 7), False),  # Caffe keeps an empty last window
    ("{kernel_h: 3, kernel_w: 2, stride_h: 2, stride_w: 1, pad_h: 1, pad_w: 0}", (1, 2, 6, 5),
     True),
]


FLOOR_CASES = [
    ("{kernel_size: 3, stride: 2, round_mode: FLOOR}", (2, 3, 7, 6), True),  # 3 x 2, not 3 x 3
    ("{kernel_size: 2, stride: 2, pad: 1, round_mode: FLOOR}", (1, 2, 5, 5), True),
    ("{kernel_size: 3, stride: 1, pad: 2, round_mode: FLOOR}", (1, 2, 4, 5), False),
    ("{kernel_size: 3, stride: 2, ceil_mode: false}", (1, 2, 8, 8), True),
]
# A kernel larger than the (padded) input: Caffe's formula, rounded the same way (OpenPose's
# deploy nets declare a 1 x 1 input that is reshaped before use).
LARGE_KERNEL_CASES = [
    ("{kernel_size: 2, stride: 2}", (1, 2, 1, 1), False),          # 1 x 1 -> 1 x 1
    ("{kernel_size: 4, stride: 3, pad: 1}", (1, 2, 1, 2), False),  # -> 1 x 1
    ("{kernel_size: 5, stride: 4}", (1, 2, 3, 6), False),          # -> 1 x 2
]


@pytest.mark.parametrize("param,shape,direct", POOL_CASES + FLOOR_CASES + LARGE_KERNEL_CASES)
@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_pooling_matches_caffe_loops(param, shape, direct, method):
    layer = build(pool_yaml(param.rstrip("}") + f", pool: {method}}}"), [shape])
    x = rand(*shape, seed=3)
    plan = layer._plan(*shape[2:])
    assert plan.direct == direct
    want = caffe_pool(x.numpy(), method, layer.kernel, layer.stride, layer.pad,
                      ceil="FLOOR" not in param and "ceil_mode" not in param)
    assert layer.top_shapes == [want.shape]
    np.testing.assert_allclose(layer(x.float()).numpy(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("stride", [10_000_000, 1 << 40])
@pytest.mark.parametrize("method, pad", [("MAX", 0), ("MAX", 1), ("AVE", 0), ("AVE", 1)])
def test_pooling_with_a_stride_past_the_input_computes_only_its_windows(stride, method, pad):
    """Windows that start past the input are empty (-FLT_MAX for MAX, as Caffe's loop leaves
    them): computed as such, without padding the input out to the stride (which asked the
    allocator for petabytes)."""
    shape = (2, 3, 8, 8)
    layer = build(pool_yaml(f"{{kernel_size: 2, stride: {stride}, pad: {pad}, "
                            f"pool: {method}}}"), [shape])
    x = rand(*shape, seed=4)
    want = caffe_pool(x.numpy(), method, layer.kernel, layer.stride, layer.pad)
    assert layer.top_shapes == [want.shape]
    np.testing.assert_allclose(layer(x.float()).numpy(), want, rtol=1e-6, atol=1e-6)


def test_pooling_mask_and_stochastic_with_a_stride_past_the_input():
    layer = build(pool_yaml("{kernel_size: 2, stride: 10000000}").replace(
        "top: out", "top: [out, mask]"), [(1, 2, 8, 8)])
    x = rand(1, 2, 8, 8, seed=5)
    want, want_mask = caffe_pool(x.numpy(), "MAX", (2, 2), (10_000_000,) * 2, (0, 0), mask=True)
    y, mask = layer(x.float())
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
    np.testing.assert_array_equal(mask.numpy(), want_mask)
    stochastic = build(pool_yaml("{kernel_size: 2, stride: 10000000, pool: STOCHASTIC}"),
                       [(1, 2, 8, 8)], phase="TEST")
    positive = x.abs().float()
    want = caffe_pool(positive.numpy(), "STOCHASTIC", (2, 2), (10_000_000,) * 2, (0, 0))
    np.testing.assert_allclose(stochastic(positive).numpy(), want, rtol=1e-5)


@pytest.mark.parametrize("kind", ["Convolution", "Deconvolution"])
def test_a_convolution_stride_past_the_input_gives_caffes_numbers(kind):
    """A stride of 100,000 over a 12 x 12 input: one output per axis (Caffe's formula); torch's
    CPU convolution crashed the process on it (its backward), so the stride it is given is at
    most one past the kernel's span, which gives the same windows."""
    shape = (2, 4, 12, 12) if kind == "Convolution" else (2, 4, 1, 1)
    layer = build(conv_yaml("{num_output: 3, kernel_size: 5, stride: 100000}", kind), [shape])
    x = rand(*shape, seed=6).float().requires_grad_(True)
    y = layer(x)
    y.sum().backward()
    reference = naive_conv if kind == "Convolution" else naive_deconv
    want = reference(x.detach().double().numpy(), layer.weight.detach().double().numpy(),
                     layer.bias.detach().double().numpy(), layer.stride, layer.pad,
                     layer.dilation, layer.group)
    assert layer.top_shapes == [want.shape]
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-5, atol=1e-5)
    assert torch.isfinite(x.grad).all() and torch.isfinite(layer.weight.grad).all()


def test_pooling_output_sizes_by_round_mode():
    sizes = {mode: build(pool_yaml(f"{{kernel_size: 3, stride: 2, round_mode: {mode}}}"),
                         [(1, 1, 8, 8)]).top_shapes[0] for mode in ("CEIL", "FLOOR")}
    assert sizes == {"CEIL": (1, 1, 4, 4), "FLOOR": (1, 1, 3, 3)}


def test_pooling_ceil_mode_of_a_fork_reads_as_round_mode(caplog):
    caplog.set_level(logging.INFO, "caffe_py")
    layer = build(pool_yaml("{kernel_size: 3, stride: 2, ceil_mode: false}"), [(1, 1, 8, 8)])
    assert layer.top_shapes == [(1, 1, 3, 3)]
    assert [r.getMessage() for r in caplog.records] == [
        "note: <string>:5: layer[0].pooling_param.ceil_mode: ceil_mode: false (a fork's field) "
        "is read as round_mode: FLOOR"]
    with pytest.raises(SpecError) as err:
        build(pool_yaml("{kernel_size: 3, ceil_mode: true, round_mode: CEIL}"), [(1, 1, 8, 8)])
    assert str(err.value) == ("<string>:5: layer[0].pooling_param.ceil_mode: ceil_mode and "
                              "round_mode are both set; keep round_mode (Caffe 1.0's field)")


def test_convolution_hole_of_deeplab_v1_is_dilation(caplog):
    caplog.set_level(logging.INFO, "caffe_py")
    x = rand(1, 2, 9, 9, seed=4).float()
    holed = build(conv_yaml("{num_output: 3, kernel_size: 3, pad: 2, hole: 2}"), [x.shape])
    dilated = build(conv_yaml("{num_output: 3, kernel_size: 3, pad: 2, dilation: 2}"),
                    [x.shape])
    assert holed.top_shapes == dilated.top_shapes == [(1, 3, 9, 9)]
    dilated.load_state_dict(holed.state_dict())
    assert torch.equal(holed(x), dilated(x))
    assert caplog.records[0].getMessage() == (
        "note: <string>:5: layer[0].convolution_param.hole: hole (DeepLab v1's fork) read as "
        "dilation: [2]")
    hw = build(conv_yaml("{num_output: 1, kernel_size: 3, hole_h: 2, hole_w: 3}"), [x.shape])
    assert hw.top_shapes == [(1, 1, 5, 3)]
    with pytest.raises(SpecError) as err:
        build(conv_yaml("{num_output: 1, kernel_size: 3, hole: 2, dilation: 2}"), [x.shape])
    assert str(err.value) == ("<string>:5: layer[0].convolution_param.hole: hole (DeepLab v1's "
                              "dilation) and dilation are both set; keep dilation (Caffe 1.0's "
                              "field)")


def test_pooling_cifar10_quick_32_to_16():
    layer = build(pool_yaml("{pool: MAX, kernel_size: 3, stride: 2}"), [(100, 32, 32, 32)])
    assert layer.top_shapes == [(100, 32, 16, 16)]


def test_pooling_ave_divisor_counts_padding_up_to_h_plus_pad():
    layer = build(pool_yaml("{pool: AVE, kernel_size: 3, stride: 2, pad: 1}"), [(1, 1, 4, 4)])
    y = layer(torch.ones(1, 1, 4, 4))[0, 0]
    assert tuple(y.shape) == (3, 3)
    # corner (0, 0): 2x2 inputs over a 3x3 window; (0, 2): rows of 3, columns 3..4 (clipped to
    # H + pad = 5, so 2 wide) hold 2x1 inputs; (2, 2): a 2x2 window with one input
    assert y[0, 0].item() == pytest.approx(4 / 9)
    assert y[0, 2].item() == pytest.approx(2 / 6)
    assert y[2, 2].item() == pytest.approx(1 / 4)


@pytest.mark.parametrize("param,shape,direct", POOL_CASES)
def test_pooling_max_mask_is_caffe_flat_index(param, shape, direct):
    layer = build(pool_yaml(param), [shape], phase="TEST")
    text = pool_yaml(param, tops="[out, mask]")
    layer = build(text, [shape])
    x = rand(*shape, seed=4).float()
    y, mask = layer(x)
    want, want_mask = caffe_pool(x.double().numpy(), "MAX", layer.kernel, layer.stride,
                                 layer.pad, mask=True)
    assert layer.top_shapes == [want.shape, want.shape]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
    np.testing.assert_array_equal(mask.numpy(), want_mask)
    assert mask.dtype == x.dtype


def test_pooling_max_empty_window_is_minus_flt_max_with_mask_minus_one():
    layer = build(pool_yaml("{kernel_size: 1, stride: 3}", tops="[out, mask]"), [(1, 1, 5, 1)])
    y, mask = layer(torch.arange(5.0).view(1, 1, 5, 1))
    assert y.flatten().tolist() == [0.0, 3.0, -FLT_MAX]
    assert mask.flatten().tolist() == [0.0, 3.0, -1.0]


@pytest.mark.parametrize("index", [0, 2, 3, 4])
@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_pooling_gradients(index, method):
    param, shape, _ = POOL_CASES[index]
    shape = (1, 1) + shape[2:]
    layer = build(pool_yaml(param.rstrip("}") + f", pool: {method}}}"), [shape])
    assert gradcheck(layer, rand(*shape, seed=5))


@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_global_pooling(method):
    layer = build(pool_yaml(f"{{pool: {method}, global_pooling: true}}"), [(2, 3, 4, 5)])
    x = rand(2, 3, 4, 5).float()
    assert layer.top_shapes == [(2, 3, 1, 1)]
    want = x.amax((2, 3), keepdim=True) if method == "MAX" else x.mean((2, 3), keepdim=True)
    torch.testing.assert_close(layer(x), want)
    assert gradcheck(layer, rand(2, 2, 4, 5))


def test_global_max_pooling_mask():
    layer = build(pool_yaml("{global_pooling: true}", tops="[out, mask]"), [(1, 2, 3, 3)])
    x = torch.zeros(1, 2, 3, 3)
    x[0, 0, 2, 1], x[0, 1, 0, 2] = 5.0, 7.0
    y, mask = layer(x)
    assert y.flatten().tolist() == [5.0, 7.0] and mask.flatten().tolist() == [7.0, 2.0]


def test_pooling_runs_on_another_batch_size():
    layer = build(pool_yaml("{pool: AVE, kernel_size: 3, stride: 1, pad: 2}"), [(4, 1, 5, 5)])
    x = rand(2, 1, 5, 5)
    np.testing.assert_allclose(layer(x).numpy(), caffe_pool(x.numpy(), "AVE", (3, 3), (1, 1),
                                                            (2, 2)), rtol=1e-12)


def test_stochastic_pooling_test_phase_is_weighted_mean():
    layer = build(pool_yaml("{pool: STOCHASTIC, kernel_size: 3, stride: 2}"), [(1, 2, 7, 6)],
                  phase="TEST")
    x = rand(1, 2, 7, 6).abs()
    want = caffe_pool(x.numpy(), "STOCHASTIC", (3, 3), (2, 2), (0, 0))
    np.testing.assert_allclose(layer(x).numpy(), want, rtol=1e-12)
    assert gradcheck(layer, x + 0.5)


def test_stochastic_pooling_train_samples_in_proportion_to_value():
    layer = build(pool_yaml("{pool: STOCHASTIC, kernel_size: 2, stride: 2}"), [(1, 1, 2, 4)])
    # Two windows: [1, 2, 3, 4] and [0, 0, 5, 0]; 10000 draws of each.
    x = torch.tensor([[1.0, 2.0, 0.0, 0.0], [3.0, 4.0, 5.0, 0.0]]).expand(10000, 1, 2, 4)
    torch.manual_seed(0)
    y = layer(x.contiguous())
    assert tuple(y.shape) == (10000, 1, 1, 2)
    first = y[:, 0, 0, 0]
    freq = [(first == v).float().mean().item() for v in (1.0, 2.0, 3.0, 4.0)]
    assert freq == pytest.approx([0.1, 0.2, 0.3, 0.4], abs=0.02)
    assert bool((y[:, 0, 0, 1] == 5.0).all())


def test_stochastic_pooling_train_gradient_goes_to_the_sample_and_seed_repeats():
    # H = 6 leaves a partial last window of rows 4..5 (ceil rounding); it must sample inside.
    layer = build(pool_yaml("{pool: STOCHASTIC, kernel_size: 3, stride: 2}"), [(2, 3, 6, 7)])
    x = (torch.arange(2 * 3 * 42, dtype=torch.float32).view(2, 3, 6, 7) + 1.0).requires_grad_()
    torch.manual_seed(7)
    y = layer(x)
    torch.manual_seed(7)
    torch.testing.assert_close(layer(x), y)
    assert tuple(y.shape) == (2, 3, 3, 3) and bool((y >= 1.0).all())
    y.sum().backward()
    # every value is distinct, so the sampled element is the one whose value was returned;
    # windows overlap, so an element sampled by two windows gets a gradient of 2
    chosen = torch.bincount((y.detach().flatten() - 1).long(), minlength=x.numel())
    torch.testing.assert_close(x.grad.flatten(), chosen.float())


@pytest.mark.parametrize("param,shape,message", [
    ("{kernel_size: 5}", (1, 1, 3, 3),
     "bottom 'data' (index 0) of spatial size [3, 3] pools to [-1, -1] under kernel [5, 5], "
     "stride [1, 1], pad [0, 0] and round_mode CEIL; use a smaller kernel_size, more pad, or a "
     "larger input"),
    ("{kernel_size: 3, stride: 2, round_mode: FLOOR}", (1, 1, 2, 8),
     "bottom 'data' (index 0) of spatial size [2, 8] pools to [0, 3] under kernel [3, 3], "
     "stride [2, 2], pad [0, 0] and round_mode FLOOR; use a smaller kernel_size, more pad, or a "
     "larger input"),
    ("{kernel_size: 3, pad: 3}", (1, 1, 8, 8),
     "pad [3, 3] must be smaller than the kernel [3, 3]; use less pad"),
    ("{pool: STOCHASTIC, kernel_size: 3, pad: 1}", (1, 1, 8, 8),
     "STOCHASTIC pooling takes no padding; remove pad, or use MAX or AVE"),
    ("{stride: 2}", (1, 1, 8, 8),
     "no kernel size is set; set kernel_size (or kernel_h and kernel_w), or global_pooling"),
    ("{kernel_size: 2, kernel_h: 2, kernel_w: 2}", (1, 1, 8, 8),
     "both kernel_size and kernel_h/kernel_w are set; keep one of them"),
    ("{kernel_size: 2, pad_h: 1}", (1, 1, 8, 8),
     "only one of pad_h and pad_w is set; set both, or use pad"),
    ("{global_pooling: true, kernel_size: 2}", (1, 1, 8, 8),
     "global_pooling takes the whole input as the window; a kernel size is also set; remove "
     "kernel_size/kernel_h/kernel_w"),
    ("{global_pooling: true, stride: 2}", (1, 1, 8, 8),
     "global_pooling needs pad 0 and stride 1; remove pad and stride"),
    ("{kernel_size: 2}", (1, 8, 8),
     "bottom 'data' (index 0) has shape [1, 8, 8]; expected 4 axes"),
])
def test_pooling_errors(param, shape, message):
    with pytest.raises(NetError) as err:
        build(pool_yaml(param), [shape])
    assert str(err.value) == f"<string>:1: layer[0]: layer 'pool' (Pooling): {message}"


def test_pooling_mask_top_only_for_max():
    with pytest.raises(NetError, match="AVE pooling has one top; only MAX gives a second top"):
        build(pool_yaml("{pool: AVE, kernel_size: 2}", tops="[out, mask]"), [(1, 1, 4, 4)])


def test_pooling_built_from_messages_in_code():
    from caffe_py.layers.vision import PoolingParameter
    from caffe_py.spec.net_spec import LayerParameter

    param = PoolingParameter(pool="AVE", kernel_h=3, kernel_w=2, stride_h=2, stride_w=1)
    spec = LayerParameter(name="p", type="Pooling", bottom=["d"], top=["o"],
                          params={"pooling_param": param})
    layer = lookup("Pooling")(spec, [(1, 1, 5, 4)], BuildContext())
    assert (layer.kernel, layer.stride, layer.pad) == ((3, 2), (2, 1), (0, 0))
    x = rand(1, 1, 5, 4)
    np.testing.assert_allclose(layer(x).numpy(), caffe_pool(x.numpy(), "AVE", (3, 2), (2, 1),
                                                            (0, 0)), rtol=1e-12)


@pytest.mark.parametrize("param,tops,device,options,want", [
    ("{pool: MAX, kernel_size: 3, stride: 2}", "out", "cuda", {"max_pool_kernel": True}, True),
    ("{pool: MAX, kernel_size: 3, stride: 2}", "out", "cuda", {}, True),
    ("{pool: MAX, kernel_size: 3, stride: 2}", "out", "cuda", {"max_pool_kernel": False}, False),
    ("{pool: MAX, kernel_size: 3, stride: 2}", "[out, mask]", "cuda", {"max_pool_kernel": True},
     False),
    ("{pool: AVE, kernel_size: 3, stride: 2}", "out", "cuda", {"max_pool_kernel": True}, False),
    ("{pool: MAX, kernel_size: 3, stride: 2}", "out", "cpu", {"max_pool_kernel": True}, False),
])
def test_which_max_poolings_may_run_the_cuda_kernels(monkeypatch, param, tops, device, options,
                                                     want):
    from caffe_py.kernels import build as kernels_build
    from caffe_py.spec.net_spec import parse_layer
    from caffe_py.spec.schema import Source
    from caffe_py.spec.yamlio import loads

    monkeypatch.setattr(kernels_build, "available", lambda: True)   # as where it builds
    spec = parse_layer(loads(pool_yaml(param, tops)), Source(), "layer[0]")
    ctx = BuildContext(device=torch.device(device), options=options)
    assert lookup("Pooling")(spec, [(2, 16, 9, 9)], ctx).max_kernel is want


# --- LRN ------------------------------------------------------------------------------------
def lrn_yaml(param: str = "") -> str:
    text = "name: norm\ntype: LRN\nbottom: data\ntop: out\n"
    return text + (f"lrn_param: {param}\n" if param else "")


def test_lrn_defaults_match_caffe():
    layer = build(lrn_yaml(), [(2, 7, 3, 3)])
    p = layer.param()
    assert (p.local_size, p.alpha, p.beta, p.k, p.norm_region) == (5, 1.0, 0.75, 1.0,
                                                                   "ACROSS_CHANNELS")
    x = rand(2, 7, 3, 3)
    np.testing.assert_allclose(layer(x).numpy(), lrn_across(x.numpy(), 5, 1.0, 0.75, 1.0),
                               rtol=1e-12)


@pytest.mark.parametrize("size,alpha,beta,k", [(3, 2.0, 0.5, 2.0), (5, 1e-4, 0.75, 1.0),
                                               (1, 0.5, 1.0, 0.5)])
def test_lrn_across_channels_matches_loops(size, alpha, beta, k):
    layer = build(lrn_yaml(f"{{local_size: {size}, alpha: {alpha}, beta: {beta}, k: {k}}}"),
                  [(2, 6, 3, 4)])
    x = rand(2, 6, 3, 4, seed=1) * 3
    np.testing.assert_allclose(layer(x).numpy(), lrn_across(x.numpy(), size, alpha, beta, k),
                               rtol=1e-12)


@pytest.mark.parametrize("size,alpha,beta", [(3, 2.0, 0.5), (5, 1.0, 0.75)])
def test_lrn_within_channel_matches_loops(size, alpha, beta):
    layer = build(lrn_yaml(f"{{norm_region: WITHIN_CHANNEL, local_size: {size}, alpha: {alpha},"
                           f" beta: {beta}, k: 7}}"), [(2, 3, 5, 6)])
    x = rand(2, 3, 5, 6, seed=2) * 2
    np.testing.assert_allclose(layer(x).numpy(), lrn_within(x.numpy(), size, alpha, beta),
                               rtol=1e-12)


@pytest.mark.parametrize("region", ["ACROSS_CHANNELS", "WITHIN_CHANNEL"])
def test_lrn_gradients(region):
    layer = build(lrn_yaml(f"{{norm_region: {region}, local_size: 3, alpha: 0.5}}"),
                  [(1, 3, 3, 3)])
    assert gradcheck(layer, rand(1, 3, 3, 3, seed=3))


def test_lrn_even_local_size_fails():
    with pytest.raises(NetError) as err:
        build(lrn_yaml("{local_size: 4}"), [(1, 4, 3, 3)])
    assert str(err.value) == ("<string>:1: layer[0]: layer 'norm' (LRN): local_size 4 is even; "
                              "LRN needs an odd local_size; use 3 or 5")
