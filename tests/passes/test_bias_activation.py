"""The bias + activation fusion pass, on CPU: the CUDA functions are swapped for the torch
reference (same signatures), so the pass's wiring is what is tested here. The fused kernel
itself is tested against the reference in tests/kernels/test_cuda_kernels.py."""
from __future__ import annotations

import pytest
import torch

from caffe_py.kernels import functions, reference
from caffe_py.layers import activation
from caffe_py.net import Net
from caffe_py.passes import fuse_bias_activation

NET = """
name: fuse
input: [data, target]
input_shape: [{dim: [2, 3, 8, 8]}, {dim: [2, 4]}]
layer:
  - {name: conv, type: Convolution, bottom: data, top: conv,
     convolution_param: {num_output: 5, kernel_size: 3, weight_filler: {type: xavier},
                         bias_filler: {type: gaussian, std: 0.5}}}
  - {name: relu1, type: ReLU, bottom: conv, top: conv, relu_param: {negative_slope: 0.1}}
  - {name: pool, type: Pooling, bottom: conv, top: pool,
     pooling_param: {pool: MAX, kernel_size: 2, stride: 2}}
  - {name: ip1, type: InnerProduct, bottom: pool, top: ip1,
     inner_product_param: {num_output: 6, weight_filler: {type: xavier},
                           bias_filler: {type: gaussian, std: 0.5}}}
  - {name: relu2, type: ReLU, bottom: ip1, top: ip1}
  - {name: ip2, type: InnerProduct, bottom: ip1, top: ip2,
     inner_product_param: {num_output: 4, weight_filler: {type: xavier},
                           bias_filler: {type: gaussian, std: 0.5}}}
  - {name: tanh, type: TanH, bottom: ip2, top: ip2}
  - {name: loss, type: EuclideanLoss, bottom: [ip2, target], top: loss}
"""


@pytest.fixture
def cuda_backend(monkeypatch):
    """The kernels are allowed (engine TORCH still picks torch), run by the reference; DEFAULT
    fuses these small test tensors too."""
    monkeypatch.setattr(activation, "choose_backend",
                        lambda layer, engine: "torch" if engine == "TORCH" else "cuda")
    monkeypatch.setattr(activation, "FUSE_MIN_ELEMENTS", 0)
    monkeypatch.setattr(functions, "activation", reference.activation)
    monkeypatch.setattr(functions, "bias_activation", reference.bias_activation)


def run(net: Net) -> tuple[float, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    inputs = {"data": torch.randn(2, 3, 8, 8, generator=g), "target": torch.randn(2, 4,
                                                                                  generator=g)}
    out = net(inputs)
    out.loss.backward()
    return out.loss.item(), [p.param.grad.clone() for p in net.learnable_params()]


def test_fused_net_matches_the_unfused_net(spec_of, cuda_backend):
    plain = Net(spec_of(NET), seed=5, options={"fuse_bias_activation": False})
    fused = Net(spec_of(NET), seed=5, options={"fuse_bias_activation": False})
    fused.ctx.options["fuse_bias_activation"] = True  # run the pass on the built net
    params_before = [p.param for p in fused.learnable_params()]
    blobs_before = {k: [id(t) for t in v] for k, v in fused.layer_blobs().items()}
    assert fuse_bias_activation(fused) == [("conv", "relu1"), ("ip1", "relu2"), ("ip2", "tanh")]
    # Same parameter objects, same blob lists: the solver and snapshots see no change.
    assert [p.param for p in fused.learnable_params()] == params_before
    assert all(a is b for a, b in zip(params_before, [p.param for p in
                                                       fused.learnable_params()], strict=True))
    assert {k: [id(t) for t in v] for k, v in fused.layer_blobs().items()} == blobs_before
    assert fused.layer_by_name("conv").has_bias is False
    assert fused.layer_by_name("relu1").fused_bias
    loss, grads = run(plain)
    fused_loss, fused_grads = run(fused)
    assert fused_loss == pytest.approx(loss, rel=1e-6)
    assert len(grads) == 6
    for a, b in zip(grads, fused_grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
    # Fusing again finds nothing left to fuse.
    assert fuse_bias_activation(fused) == []


def test_the_net_fuses_when_it_is_built(spec_of, cuda_backend):
    assert Net(spec_of(NET), seed=5).fused == [("conv", "relu1"), ("ip1", "relu2"),
                                               ("ip2", "tanh")]


def test_the_option_turns_it_off(spec_of, cuda_backend):
    net = Net(spec_of(NET), options={"fuse_bias_activation": False})
    assert net.fused == []
    assert fuse_bias_activation(net) == []
    assert net.layer_by_name("conv").has_bias


@pytest.mark.parametrize(("old", "new", "left"), [
    # not in place
    ("{name: relu2, type: ReLU, bottom: ip1, top: ip1}",
     "{name: relu2, type: ReLU, bottom: ip1, top: r2}", "ip1"),
    # a negative slope: the backward needs the input
    ("{name: relu2, type: ReLU, bottom: ip1, top: ip1}",
     "{name: relu2, type: ReLU, bottom: ip1, top: ip1, relu_param: {negative_slope: -0.5}}",
     "ip1"),
    # the activation runs on PyTorch's ops
    ("{name: relu2, type: ReLU, bottom: ip1, top: ip1}",
     "{name: relu2, type: ReLU, bottom: ip1, top: ip1, relu_param: {engine: TORCH}}", "ip1"),
    # no bias
    ("inner_product_param: {num_output: 6,",
     "inner_product_param: {num_output: 6, bias_term: false,", "ip1"),
])
def test_ineligible_pairs_are_left_alone(spec_of, cuda_backend, old, new, left):
    text = NET.replace(old, new)
    if "top: r2" in new:
        text = text.replace("bottom: ip1, top: ip2", "bottom: r2, top: ip2")
    fused = Net(spec_of(text), seed=5).fused
    assert left not in [p for p, _ in fused]
    assert ("conv", "relu1") in fused


def test_a_reader_between_producer_and_activation_blocks_fusion(spec_of, cuda_backend):
    text = NET.replace(
        "  - {name: relu1, type: ReLU, bottom: conv, top: conv, relu_param: {negative_slope: 0.1}}",
        "  - {name: peek, type: Power, bottom: conv, top: peek}\n"
        "  - {name: relu1, type: ReLU, bottom: conv, top: conv, relu_param: {negative_slope: 0.1}}"
        "\n  - {name: silence, type: Silence, bottom: peek}")
    assert Net(spec_of(text), seed=5).fused == [("ip1", "relu2"), ("ip2", "tanh")]


def test_a_cpu_net_fuses_nothing(spec_of):
    net = Net(spec_of(NET))
    assert net.fused == []
    assert fuse_bias_activation(net) == []


def test_default_engine_follows_the_measured_table(spec_of, monkeypatch):
    """DEFAULT: PyTorch's op for the plain kinds, the kernels for PReLU; CUDA forces them."""
    monkeypatch.setattr(activation, "choose_backend",
                        lambda layer, engine: "torch" if engine == "TORCH" else "cuda")
    monkeypatch.setattr(activation, "DEFAULT_BACKEND",
                        {**activation.DEFAULT_BACKEND, "ReLU": "torch", "TanH": "torch",
                         "PReLU": "cuda"})
    net = Net(spec_of(NET), seed=5, options={"fuse_bias_activation": False})
    assert [net.layer_by_name(n).backend for n in ("relu1", "relu2", "tanh")] == ["torch"] * 3
    assert net.layer_by_name("relu1").kernels_allowed
    forced = Net(spec_of(NET), seed=5, options={"fuse_bias_activation": False,
                                                "activation_engine": "CUDA"})
    assert [forced.layer_by_name(n).backend for n in ("relu1", "relu2", "tanh")] == ["cuda"] * 3


def test_default_fuses_only_tensors_of_the_minimum_size(spec_of, monkeypatch):
    monkeypatch.setattr(activation, "choose_backend",
                        lambda layer, engine: "torch" if engine == "TORCH" else "cuda")
    monkeypatch.setattr(functions, "bias_activation", reference.bias_activation)
    # conv's top is 2 x 5 x 6 x 6 = 360 elements; ip1's and ip2's are 12 and 8.
    monkeypatch.setattr(activation, "FUSE_MIN_ELEMENTS", 360)
    net = Net(spec_of(NET), seed=5)
    assert net.fused == [("conv", "relu1")]
    assert net.layer_by_name("relu1").backend == "cuda"  # moved onto the kernels
    assert net.layer_by_name("relu2").backend == activation.DEFAULT_BACKEND["ReLU"]
    # Engine CUDA (here through the net option) fuses whatever the size.
    forced = Net(spec_of(NET), seed=5, options={"activation_engine": "CUDA"})
    assert forced.fused == [("conv", "relu1"), ("ip1", "relu2"), ("ip2", "tanh")]
