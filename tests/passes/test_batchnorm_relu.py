"""The BatchNorm + ReLU and BatchNorm + Eltwise + ReLU fusion passes (caffe_py/passes.py):
which layers they fold, and that a CPU net with them (the layers' own operations, called by
the layer that applies them) trains bit for bit as the net without them. The fused kernels
themselves are held to a float64 oracle in tests/kernels/test_batchnorm_relu_gpu.py."""
from __future__ import annotations

import pytest
import torch
from net_text import AFFINE, conv

from caffe_py.net import Net
from caffe_py.spec.net_spec import parse_net
from caffe_py.spec.schema import Source
from caffe_py.spec.yamlio import loads

NET = ("""
name: bnrelu
layer:
  - {name: data, type: Input, top: [data, label],
     input_param: {shape: [{dim: [4, 3, 6, 6]}, {dim: [4]}]}}"""
       + conv("c1", "data") + """
  - {name: bn1, type: BatchNorm, bottom: c1, top: c1}
  - {name: scale1, type: Scale, bottom: c1, top: c1, """ + AFFINE + """}
  - {name: relu1, type: ReLU, bottom: c1, top: c1}""" + conv("c2", "c1") + """
  - {name: bn2, type: BatchNorm, bottom: c2, top: c2}
  - {name: relu2, type: ReLU, bottom: c2, top: c2, relu_param: {negative_slope: 0.2}}"""
       + conv("c3", "c2") + """
  - {name: bn3, type: BatchNorm, bottom: c3, top: c3}
  - {name: relu3, type: ReLU, bottom: c3, top: r3}
  - {name: pool, type: Pooling, bottom: r3, top: pool,
     pooling_param: {pool: AVE, global_pooling: true}}
  - {name: fc, type: InnerProduct, bottom: pool, top: fc,
     inner_product_param: {num_output: 5, weight_filler: {type: gaussian, std: 0.3}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
""")
PAIRS = [("bn1", "relu1"), ("bn2", "relu2")]


def build(text: str = NET, phase: str = "TRAIN", **options) -> Net:
    return Net(parse_net(loads(text), Source("net.yaml")), phase, seed=3, options=options)


def test_pairs_are_found_and_the_relu_passes_its_bottom_through():
    net = build()
    assert net.fused_relu == PAIRS
    assert net.layer_by_name("bn1").fused_relu == "relu1"
    assert net.layer_by_name("bn1").fused_scale == "scale1"
    assert net.layer_by_name("relu2").folded_into == "bn2"
    assert net.layer_by_name("relu3").folded_into is None  # not in place
    assert "fused relu 'relu1'" in repr(net.layer_by_name("bn1"))
    assert "folded into 'bn2'" in repr(net.layer_by_name("relu2"))
    x = torch.randn(2, 4, 3, 3)
    assert net.layer_by_name("relu1")(x) is x


def test_the_option_and_the_test_phase_leave_the_layers_alone():
    assert build(fuse_batchnorm_relu=False).fused_relu == []
    assert build(phase="TEST").fused_relu == []  # global statistics: nothing to fuse
    assert build(fuse_batchnorm_scale=False).fused_relu == [("bn2", "relu2")]


@pytest.mark.parametrize("old,new", [
    ("{name: relu1, type: ReLU, bottom: c1, top: c1}",
     "{name: relu1, type: ReLU, bottom: c1, top: c1, relu_param: {engine: TORCH}}"),
    ("{name: relu1, type: ReLU, bottom: c1, top: c1}",
     "{name: relu1, type: ReLU, bottom: c1, top: c1, propagate_down: [false]}"),
    ("{name: bn1, type: BatchNorm, bottom: c1, top: c1}",
     "{name: bn1, type: BatchNorm, bottom: c1, top: c1, "
     "batch_norm_param: {use_global_stats: true}}"),
    ("  - {name: relu1, type: ReLU, bottom: c1, top: c1}",
     "  - {name: peek, type: Pooling, bottom: c1, top: peek, pooling_param: {pool: MAX, "
     "kernel_size: 2}}\n  - {name: relu1, type: ReLU, bottom: c1, top: c1}"),
], ids=["engine TORCH", "propagate_down false", "global statistics", "a reader between"])
def test_ineligible_pairs_are_left_alone(old, new):
    assert NET.count(old) == 1
    assert build(NET.replace(old, new)).fused_relu == [("bn2", "relu2")]


def train(net: Net, steps: int = 2) -> tuple[list[float], list[torch.Tensor]]:
    losses = []
    g = torch.Generator().manual_seed(11)
    for _ in range(steps):
        inputs = {"data": torch.randn(4, 3, 6, 6, generator=g),
                  "label": torch.randint(0, 5, (4,), generator=g).float()}
        net.zero_grad()
        out = net(inputs)
        out.loss.backward()
        losses.append(out.loss.item())
        with torch.no_grad():
            for p in net.parameters():
                if p.grad is not None:
                    p -= 0.1 * p.grad
    return losses, [t.detach().clone() for t in (*net.parameters(), *net.buffers())]


def test_a_fused_cpu_net_trains_bit_for_bit_as_the_unfused_net():
    fused_losses, fused_state = train(build())
    plain_losses, plain_state = train(build(fuse_batchnorm_relu=False))
    assert fused_losses == plain_losses
    assert len(fused_state) == len(plain_state) == 16
    assert all(torch.equal(a, b) for a, b in zip(fused_state, plain_state, strict=True))


def bn_scale(name: str, blob: str) -> str:
    return (f"\n  - {{name: bn{name}, type: BatchNorm, bottom: {blob}, top: {blob}}}"
            f"\n  - {{name: scale{name}, type: Scale, bottom: {blob}, top: {blob}, {AFFINE}}}")


# Two residual blocks as Caffe's ResNet writes them: the first with a projection shortcut
# (both bottoms of its sum normalised), the second with the identity shortcut.
RESIDUAL = ("""
name: residual
layer:
  - {name: data, type: Input, top: [data, label],
     input_param: {shape: [{dim: [4, 3, 6, 6]}, {dim: [4]}]}}"""
            + conv("c0", "data") + bn_scale("0", "c0")
            + "\n  - {name: relu0, type: ReLU, bottom: c0, top: c0}"
            + conv("p1", "c0") + bn_scale("p1", "p1")
            + conv("a1", "c0") + bn_scale("a1", "a1")
            + "\n  - {name: relua1, type: ReLU, bottom: a1, top: a1}"
            + conv("b1", "a1") + bn_scale("b1", "b1") + """
  - {name: res1, type: Eltwise, bottom: [p1, b1], top: res1}
  - {name: res1_relu, type: ReLU, bottom: res1, top: res1}""" + conv("b2", "res1")
            + bn_scale("b2", "b2") + """
  - {name: res2, type: Eltwise, bottom: [res1, b2], top: res2}
  - {name: res2_relu, type: ReLU, bottom: res2, top: res2, relu_param: {negative_slope: 0.1}}
  - {name: pool, type: Pooling, bottom: res2, top: pool,
     pooling_param: {pool: AVE, global_pooling: true}}
  - {name: fc, type: InnerProduct, bottom: pool, top: fc,
     inner_product_param: {num_output: 5, weight_filler: {type: gaussian, std: 0.3}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
""")
TRIPLES = [("bnb1", "res1", "res1_relu"), ("bnb2", "res2", "res2_relu")]


def test_a_residual_sum_applies_the_later_batchnorm_and_the_relu():
    net = build(RESIDUAL)
    assert net.fused_sum == TRIPLES
    assert net.fused_relu == [("bn0", "relu0"), ("bna1", "relua1")]
    assert net.layer_by_name("bnb1").deferred_to == "res1"
    assert net.layer_by_name("bnp1").deferred_to is None   # the projection: the earlier one
    assert net.layer_by_name("res2_relu").folded_into == "res2"
    assert "fused batchnorm 'bnb2', fused relu 'res2_relu'" in repr(net.layer_by_name("res2"))
    assert "applied by 'res1'" in repr(net.layer_by_name("bnb1"))
    x = torch.randn(2, 4, 3, 3)
    assert net.layer_by_name("bnb1")(x) is x


def test_a_fused_residual_cpu_net_trains_bit_for_bit_as_the_unfused_net():
    fused_losses, fused_state = train(build(RESIDUAL))
    plain_losses, plain_state = train(build(RESIDUAL, fuse_batchnorm_eltwise=False,
                                            fuse_batchnorm_relu=False))
    assert fused_losses == plain_losses
    assert len(fused_state) == len(plain_state) == 32
    assert all(torch.equal(a, b) for a, b in zip(fused_state, plain_state, strict=True))


@pytest.mark.parametrize("old,new,fused", [
    ("{name: res2, type: Eltwise, bottom: [res1, b2], top: res2}",
     "{name: res2, type: Eltwise, bottom: [res1, b2], top: res2, "
     "eltwise_param: {coeff: [1, 2]}}", TRIPLES[:1]),
    ("{name: res2, type: Eltwise, bottom: [res1, b2], top: res2}",
     "{name: res2, type: Eltwise, bottom: [res1, b2], top: res2, "
     "eltwise_param: {operation: PROD}}", TRIPLES[:1]),
    ("  - {name: pool, type: Pooling, bottom: res2, top: pool,",
     "  - {name: peek, type: Pooling, bottom: b2, top: peek, pooling_param: {pool: MAX, "
     "kernel_size: 2}}\n  - {name: pool, type: Pooling, bottom: res2, top: pool,",
     TRIPLES[:1]),
    ("  - {name: res2_relu, type: ReLU, bottom: res2, top: res2, relu_param: "
     "{negative_slope: 0.1}}\n",
     "  - {name: res2_relu, type: ReLU, bottom: res2, top: r2, relu_param: "
     "{negative_slope: 0.1}}\n", TRIPLES[:1] + [("bnb2", "res2", None)]),
], ids=["coefficients", "PROD", "a later reader", "a ReLU not in place"])
def test_sums_that_cannot_apply_a_batchnorm_are_left_alone(old, new, fused):
    assert RESIDUAL.count(old) == 1
    text = RESIDUAL.replace(old, new)
    if "top: r2" in text:
        text = text.replace("bottom: res2, top: pool", "bottom: r2, top: pool")
    assert build(text).fused_sum == fused


def test_the_option_and_the_test_phase_leave_the_sums_alone():
    assert build(RESIDUAL, fuse_batchnorm_eltwise=False).fused_sum == []
    assert build(RESIDUAL, phase="TEST").fused_sum == []
