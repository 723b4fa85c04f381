"""InnerProduct on a GPU: the float32 path (the product, then the bias: Caffe's two steps) and
the others (autocast, more than two axes) against float64, forward and every gradient.
Skipped without CUDA; run with `pytest -m gpu`."""
from __future__ import annotations

import pytest
import torch
from layer_helpers import build, rand

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

FILLERS = "weight_filler: {type: gaussian, std: 0.05}, bias_filler: {type: gaussian}"


def ip(param: str, shape):
    text = ("name: l\ntype: InnerProduct\nbottom: data\ntop: out\n"
            f"inner_product_param: {{{param}, {FILLERS}}}\n")
    return build(text, [shape]).cuda()


def check(layer, x, rtol, atol, autocast=False):
    """The layer's output and its input, weight and bias gradients on the GPU against the same
    layer in float64 on the host."""
    ref = build_ref(layer)
    xg = x.cuda().float().requires_grad_(True)
    xr = x.double().requires_grad_(True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        out = layer(xg)
    want = ref(xr)
    seed = torch.Generator().manual_seed(5)
    dy = torch.randn(want.shape, generator=seed, dtype=torch.float64)
    out.float().backward(dy.cuda().float())
    want.backward(dy)
    torch.testing.assert_close(out.float().cpu().double(), want, rtol=rtol, atol=atol)
    torch.testing.assert_close(xg.grad.cpu().double(), xr.grad, rtol=rtol, atol=atol)
    for (name, p), (_, q) in zip(layer.named_parameters(), ref.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad.cpu().double(), q.grad, rtol=rtol, atol=atol,
                                   msg=lambda m, name=name: f"{name}: {m}")


def build_ref(layer):
    import copy

    return copy.deepcopy(layer).cpu().double()


@pytest.mark.parametrize("shape,param", [
    ((64, 500), "num_output: 10"),              # LeNet's ip2: cuBLAS's split-K for addmm
    ((64, 50, 4, 4), "num_output: 500"),        # LeNet's ip1, flattened from axis 1
    ((100, 1024), "num_output: 10, transpose: true"),
    ((7, 33), "num_output: 3, bias_term: false"),
])
def test_float32_path_against_float64(shape, param):
    layer = ip(param, shape)
    check(layer, rand(*shape, seed=1), rtol=1e-4, atol=1e-4)


def test_more_axes_and_autocast_keep_f_linear():
    check(ip("num_output: 5, axis: 2", (2, 3, 4, 2)), rand(2, 3, 4, 2, seed=2),
          rtol=1e-4, atol=1e-4)
    # bf16 products: a weight gradient sums 64 of them, each off by up to 2^-8 relative
    check(ip("num_output: 10", (64, 500)), rand(64, 500, seed=3), rtol=2e-2, atol=0.15,
          autocast=True)
