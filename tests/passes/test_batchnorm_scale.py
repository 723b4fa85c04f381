"""The BatchNorm + Scale fusion pass (caffe_py/passes.py) against the unfused net, and
the dtype of a ResNet block's activations under bfloat16 autocast."""
from __future__ import annotations

import pytest
import torch
from net_text import AFFINE, conv

from caffe_py.net import Net
from caffe_py.spec.net_spec import parse_net
from caffe_py.spec.schema import Source
from caffe_py.spec.yamlio import loads

FROZEN = "param: [{lr_mult: 0}, {lr_mult: 0}, {lr_mult: 0}]"


def bn_scale(name: str, bottom: str, top: str | None = None) -> str:
    """Caffe's BatchNorm -> Scale pair on ``bottom`` (the BatchNorm writes ``top``)."""
    top = top or bottom
    return f"""
  - {{name: bn_{name}, type: BatchNorm, bottom: {bottom}, top: {top}, {FROZEN}}}
  - {{name: scale_{name}, type: Scale, bottom: {top}, top: {top}, {AFFINE}}}"""


# A bottleneck-like residual block as Caffe's ResNet-50 writes it; bn_b2 is not in place.
BLOCK = ("""
name: block
layer:
  - name: data
    type: Input
    top: [data, label]
    input_param: {shape: [{dim: [4, 3, 6, 6]}, {dim: [4]}]}"""
         + conv("conv1", "data", 4, 3) + bn_scale("conv1", "conv1")
         + "\n  - {name: relu1, type: ReLU, bottom: conv1, top: conv1}"
         + conv("b1", "conv1", 8, 1) + bn_scale("b1", "b1")
         + conv("b2", "conv1", 8, 3) + bn_scale("b2", "b2", "b2n")
         + """
  - {name: res, type: Eltwise, bottom: [b1, b2n], top: res}
  - {name: res_relu, type: ReLU, bottom: res, top: res}
  - {name: pool, type: Pooling, bottom: res, top: pool,
     pooling_param: {pool: AVE, global_pooling: true}}
  - {name: fc, type: InnerProduct, bottom: pool, top: fc,
     inner_product_param: {num_output: 5, weight_filler: {type: gaussian, std: 0.3}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [fc, label], top: loss}
""")
PAIRS = [("bn_conv1", "scale_conv1"), ("bn_b1", "scale_b1"), ("bn_b2", "scale_b2")]


def spec_of(text: str):
    return parse_net(loads(text), Source("net.yaml"))


def build(phase: str = "TRAIN", fuse: bool = True, text: str = BLOCK,
          dtype: torch.dtype = torch.float32) -> Net:
    net = Net(spec_of(text), phase, seed=3, options={"fuse_batchnorm_scale": fuse})
    return net.to(dtype)


def inputs(step: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    return {"data": torch.randn(4, 3, 6, 6, generator=gen).to(dtype),
            "label": torch.tensor([0.0, 1.0, 4.0, 2.0], dtype=dtype)}


def test_pairs_are_found_and_the_option_turns_the_pass_off():
    fused = build()
    assert fused.fused_norm == PAIRS
    assert fused.layer_by_name("bn_b2").fused_scale == "scale_b2"
    assert fused.layer_by_name("scale_b1").folded_into == "bn_b1"
    off = build(fuse=False)
    assert off.fused_norm == []
    assert all(layer.folded_into is None for layer in off.layers if layer.spec.type == "Scale")
    # parameters and blobs are untouched: same names, order and values
    assert [p.name for p in fused.learnable_params()] == [p.name for p in off.learnable_params()]
    for a, b in zip(fused.layer_blobs().values(), off.layer_blobs().values(), strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def sgd_step(net: Net, lr: float = 0.1) -> None:
    with torch.no_grad():
        for p in net.learnable_params():
            p.param.sub_(lr * p.lr_mult * p.param.grad)
            p.param.grad = None


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5)])
def test_fused_net_trains_and_tests_like_the_unfused_one(dtype, tol):
    nets = {fuse: build(fuse=fuse, dtype=dtype) for fuse in (True, False)}
    tests = {fuse: build("TEST", fuse, dtype=dtype) for fuse in (True, False)}
    for fuse in (True, False):  # the TEST nets read the TRAIN nets' (re-pointed) blobs
        tests[fuse].share_weights_with(nets[fuse])
    for step in range(3):
        out = {fuse: net(inputs(step, dtype)) for fuse, net in nets.items()}
        torch.testing.assert_close(out[True].loss, out[False].loss, atol=tol, rtol=tol)
        for fuse in (True, False):
            out[fuse].loss.backward()
        grads = [{p.name: p.param.grad for p in nets[fuse].learnable_params()}
                 for fuse in (True, False)]
        assert grads[0].keys() == grads[1].keys()
        for name in grads[0]:
            torch.testing.assert_close(grads[0][name], grads[1][name], atol=tol, rtol=tol,
                                       msg=f"step {step}: gradient of {name}")
        for a, b in zip(nets[True].layer_blobs().values(), nets[False].layer_blobs().values(),
                        strict=True):
            for x, y in zip(a, b, strict=True):  # running sums and count included
                torch.testing.assert_close(x, y, atol=tol, rtol=tol)
        for fuse in (True, False):
            sgd_step(nets[fuse])
        test_out = {fuse: net(inputs(10 + step, dtype)) for fuse, net in tests.items()}
        torch.testing.assert_close(test_out[True].outputs["loss"],
                                   test_out[False].outputs["loss"], atol=tol, rtol=tol)
    assert nets[True].layer_by_name("bn_b1").count.item() == pytest.approx(1 + 0.999 + 0.999**2)


def test_fused_batchnorm_uses_the_scale_blobs_it_shares():
    # The TEST net's own scale blobs were filled by another seed: after sharing, its output
    # must follow the TRAIN net's blobs (read at forward time, not captured at build).
    train = build()
    test = Net(spec_of(BLOCK), "TEST", seed=9)
    test.share_weights_with(train)
    reference = build("TEST", fuse=False)
    reference.share_weights_with(train)
    x = inputs(0, torch.float32)
    train(x)  # some statistics
    with torch.no_grad():
        train.layer_by_name("scale_b1").scale.mul_(-2.0)
    torch.testing.assert_close(test(x).outputs["loss"], reference(x).outputs["loss"])


def test_use_global_stats_in_train_and_a_single_value_per_channel():
    text = BLOCK.replace(FROZEN, FROZEN + ", batch_norm_param: {use_global_stats: true}", 1)
    nets = [build(fuse=fuse, text=text) for fuse in (True, False)]
    for net in nets:
        with torch.no_grad():
            bn = net.layer_by_name("bn_conv1")
            bn.mean_sum.fill_(0.5), bn.var_sum.fill_(2.0), bn.count.fill_(2.0)
    losses = [net(inputs(0, torch.float32)).loss for net in nets]
    torch.testing.assert_close(losses[0], losses[1])
    single = """
name: single
layer:
  - {name: data, type: Input, top: x, input_param: {shape: {dim: [1, 3]}}}""" + bn_scale("x", "x")
    nets = [build(fuse=fuse, text=single, dtype=torch.float64) for fuse in (True, False)]
    x = {"x": torch.tensor([[1.0, -2.0, 3.0]], dtype=torch.float64)}
    outs = [net(x).outputs["x"] for net in nets]
    assert nets[0].fused_norm == [("bn_x", "scale_x")]
    torch.testing.assert_close(outs[0], outs[1])
    torch.testing.assert_close(outs[0], nets[0].layer_by_name("scale_x").bias.view(1, 3))


NOT_FUSED = """
name: not_fused
layer:
  - {name: data, type: Input, top: x, input_param: {shape: {dim: [2, 3, 2, 2]}}}
  - {name: bn_read, type: BatchNorm, bottom: x, top: a}
  - {name: peek, type: ReLU, bottom: a, top: peek}
  - {name: scale_read, type: Scale, bottom: a, top: a, scale_param: {bias_term: true}}
  - {name: bn_nobias, type: BatchNorm, bottom: x, top: b}
  - {name: scale_nobias, type: Scale, bottom: b, top: b}
  - {name: bn_copy, type: BatchNorm, bottom: x, top: c}
  - {name: scale_copy, type: Scale, bottom: c, top: c2, scale_param: {bias_term: true}}
  - {name: bn_loss, type: BatchNorm, bottom: x, top: d, loss_weight: 1}
  - {name: scale_loss, type: Scale, bottom: d, top: d, scale_param: {bias_term: true}}
  - {name: bn_down, type: BatchNorm, bottom: x, top: e}
  - {name: scale_down, type: Scale, bottom: e, top: e, propagate_down: false,
     scale_param: {bias_term: true}}
  - {name: bn_ok, type: BatchNorm, bottom: x, top: f}
  - {name: scale_ok, type: Scale, bottom: f, top: f, scale_param: {bias_term: true}}
"""


def test_pairs_that_cannot_be_fused_are_left_alone():
    # read in between, no bias, not in place, a loss on the BatchNorm top, propagate_down
    net = build(text=NOT_FUSED)
    assert net.fused_norm == [("bn_ok", "scale_ok")]


def dtypes_under_autocast(net: Net) -> dict[str, torch.dtype]:
    seen: dict[str, torch.dtype] = {}
    hooks = [layer.register_forward_hook(
        lambda mod, args, out: seen.__setitem__(mod.name, out.dtype))
        for layer in net.layers if layer.spec.type not in ("Input", "SoftmaxWithLoss")]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(inputs(0, torch.float32))
    out.loss.backward()
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("fuse", [True, False])
def test_activations_of_a_resnet_block_stay_bfloat16_under_autocast(fuse):
    net = build(fuse=fuse)
    seen = dtypes_under_autocast(net)
    assert set(seen) == {layer.name for layer in net.layers} - {"data", "loss"}
    assert {name: d for name, d in seen.items() if d != torch.bfloat16} == {}
    for p in net.learnable_params():  # the float32 blobs still get their gradients
        assert p.param.dtype == torch.float32
        assert p.param.grad is not None and p.param.grad.dtype == torch.float32, p.name
    assert net.layer_by_name("bn_conv1").mean_sum.dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_fused_net_matches_and_stays_bfloat16():
    # On a GPU batch_norm with weight and bias may take cuDNN's path: same statistics.
    nets = {fuse: Net(spec_of(BLOCK), "TRAIN", seed=3, device="cuda",
                      options={"fuse_batchnorm_scale": fuse}) for fuse in (True, False)}
    x = {k: v.cuda() for k, v in inputs(0, torch.float32).items()}
    for _ in range(2):
        losses = {fuse: net(x).loss for fuse, net in nets.items()}
        torch.testing.assert_close(losses[True], losses[False], atol=1e-4, rtol=1e-4)
    for a, b in zip(nets[True].layer_blobs().values(), nets[False].layer_blobs().values(),
                    strict=True):
        for u, v in zip(a, b, strict=True):
            torch.testing.assert_close(u, v, atol=1e-4, rtol=1e-4)
    seen: dict[str, torch.dtype] = {}
    for layer in nets[True].layers:
        if layer.spec.type not in ("Input", "SoftmaxWithLoss"):
            layer.register_forward_hook(
                lambda mod, args, out: seen.__setitem__(mod.name, out.dtype))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        nets[True](x).loss.backward()
    assert {name: d for name, d in seen.items() if d != torch.bfloat16} == {}
