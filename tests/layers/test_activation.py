"""ReLU, PReLU, ELU, Sigmoid, TanH, AbsVal, Power, BNLL, Exp, Log, Threshold, Clip, Swish:
values against numpy, float64 gradcheck, the engine choice, the build fallback and in-place
use."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from caffe_py.errors import NetError, SpecError
from caffe_py.kernels import build
from caffe_py.layers import BuildContext, lookup
from caffe_py.net import Net
from caffe_py.spec.net_spec import parse_layer
from caffe_py.spec.schema import Source
from caffe_py.spec.yamlio import loads


def make(text: str, shape=(2, 3, 4, 5), device: str = "cpu", options=None, seed: int = 0):
    spec = parse_layer(loads(text), Source(), "layer[0]")
    ctx = BuildContext(device=torch.device(device), options=dict(options or {}),
                       generator=torch.Generator().manual_seed(seed))
    return lookup(spec.type)(spec, [tuple(shape)], ctx)


def layer_yaml(kind: str, param: str = "", bottom: str = "x", top: str = "y") -> str:
    text = f"name: act\ntype: {kind}\nbottom: {bottom}\ntop: {top}\n"
    return text + (param + "\n" if param else "")


def away_from_zero(*shape, seed: int = 0) -> torch.Tensor:
    """Random float64 values with |x| >= 0.1: Caffe's gradient checks skip the kink at 0."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(*shape, generator=g, dtype=torch.float64) * 1.9 + 0.1
    sign = torch.randint(0, 2, shape, generator=g).to(torch.float64) * 2 - 1
    return x * sign


def np_sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


# name, YAML block, numpy reference
CASES = [
    ("ReLU", "", lambda x: np.maximum(x, 0)),
    ("ReLU", "relu_param: {negative_slope: 0.1}",
     lambda x: np.maximum(x, 0) + 0.1 * np.minimum(x, 0)),
    ("ReLU", "relu_param: {negative_slope: -0.3}",
     lambda x: np.maximum(x, 0) - 0.3 * np.minimum(x, 0)),
    ("ELU", "", lambda x: np.where(x > 0, x, np.exp(x) - 1)),
    ("ELU", "elu_param: {alpha: 0.5}", lambda x: np.where(x > 0, x, 0.5 * (np.exp(x) - 1))),
    ("ELU", "elu_param: {alpha: -0.5}", lambda x: np.where(x > 0, x, -0.5 * (np.exp(x) - 1))),
    ("Sigmoid", "", np_sigmoid),
    ("TanH", "", np.tanh),
    ("AbsVal", "", np.abs),
    ("Power", "", lambda x: x),
    ("Power", "power_param: {power: 2, scale: 0.5, shift: 1}", lambda x: (1 + 0.5 * x) ** 2),
    ("Power", "power_param: {power: 3, scale: -2, shift: 0.25}", lambda x: (0.25 - 2 * x) ** 3),
    ("Power", "power_param: {power: 0.5, scale: 1, shift: 3}", lambda x: np.sqrt(3 + x)),
    ("BNLL", "", lambda x: np.log1p(np.exp(x))),
    ("Exp", "", np.exp),
    ("Exp", "exp_param: {base: 2, scale: 0.5, shift: 1}", lambda x: 2.0 ** (1 + 0.5 * x)),
    ("Exp", "exp_param: {base: 1}", lambda x: np.ones_like(x)),
    ("Log", "log_param: {shift: 3}", lambda x: np.log(3 + x)),
    ("Log", "log_param: {base: 10, scale: 0.5, shift: 2}", lambda x: np.log10(2 + 0.5 * x)),
    ("Clip", "clip_param: {min: -0.5, max: 0.7}", lambda x: np.clip(x, -0.5, 0.7)),
    ("Swish", "", lambda x: x * np_sigmoid(x)),
    ("Swish", "swish_param: {beta: 0.5}", lambda x: x * np_sigmoid(0.5 * x)),
]


@pytest.mark.parametrize(("kind", "param", "ref"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_forward_matches_numpy_and_gradcheck(kind, param, ref):
    layer = make(layer_yaml(kind, param))
    assert layer.top_shapes == [(2, 3, 4, 5)]
    x = away_from_zero(2, 3, 4, 5, seed=1)
    np.testing.assert_allclose(layer(x).detach().numpy(), ref(x.numpy()), rtol=1e-12,
                               atol=1e-12)
    small = away_from_zero(2, 3, 2, 2, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(layer, (small,), eps=1e-6, atol=1e-7)


def test_relu_gradient_at_zero_follows_caffe():
    # Caffe: g * ((x > 0) + slope * (x <= 0)), so x == 0 takes the slope.
    for slope, expected in ((0.0, 0.0), (0.2, 0.2), (-0.5, -0.5)):
        layer = make(layer_yaml("ReLU", f"relu_param: {{negative_slope: {slope}}}"), (3,))
        x = torch.tensor([0.0, 1.0, -1.0], dtype=torch.float64, requires_grad=True)
        layer(x).sum().backward()
        assert x.grad.tolist() == [expected, 1.0, slope]


def test_power_constant_cases_give_zero_gradient():
    for param, value in (("{power: 0, scale: 2, shift: 5}", 1.0),
                         ("{power: 2, scale: 0, shift: 3}", 9.0)):
        layer = make(layer_yaml("Power", f"power_param: {param}"), (4,))
        x = torch.tensor([1.0, float("inf"), -2.0, float("nan")], requires_grad=True)
        y = layer(x)
        assert y.tolist() == [value] * 4
        y.sum().backward()
        assert x.grad.tolist() == [0.0] * 4


def test_absval_gradient_at_zero_is_zero():
    layer = make(layer_yaml("AbsVal"), (3,))
    x = torch.tensor([0.0, 2.0, -3.0], requires_grad=True)
    layer(x).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, -1.0]


def test_bnll_gradient_is_caffes_sigmoid_also_far_out():
    layer = make(layer_yaml("BNLL"), (4,))
    x = torch.tensor([-80.0, 0.0, 49.0, 80.0], dtype=torch.float64, requires_grad=True)
    y = layer(x)
    np.testing.assert_allclose(y.detach().numpy(), [np.log1p(np.exp(-80.0)), np.log(2.0),
                                                    49.0 + np.log1p(np.exp(-49.0)), 80.0])
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np_sigmoid(np.minimum(x.detach().numpy(), 50)))


def test_threshold_is_a_step_with_no_gradient():
    layer = make(layer_yaml("Threshold", "threshold_param: {threshold: 0.3}"), (4,))
    x = torch.tensor([0.3, 0.31, -1.0, 2.0], requires_grad=True)
    y = layer(x)
    assert y.tolist() == [0.0, 1.0, 0.0, 1.0] and not y.requires_grad


def test_clip_gradient_passes_at_both_bounds():
    layer = make(layer_yaml("Clip", "clip_param: {min: -1, max: 1}"), (5,))
    x = torch.tensor([-2.0, -1.0, 0.5, 1.0, 3.0], requires_grad=True)
    layer(x).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]


@pytest.mark.parametrize(("param", "message"), [
    ("exp_param: {base: -2}", "layer[0].exp_param.base: base -2 is not positive; use a base "
                              "> 0, or -1 for e"),
    ("log_param: {base: 0}", "layer[0].log_param.base: base 0 is not positive; use a base > 0, "
                             "or -1 for e"),
    ("log_param: {base: 1}", "layer[0].log_param.base: base 1 has log(base) = 0, so log_1 is "
                             "undefined; use a base > 0 other than 1, or -1 for e"),
    ("clip_param: {min: 0}", "layer[0].clip_param: clip_param.max is required; set "
                             "clip_param.max"),
])
def test_exp_log_clip_parameter_errors(param, message):
    kind = param.split("_", 1)[0].capitalize()
    with pytest.raises(SpecError) as err:
        make(layer_yaml(kind, param), (3,))
    assert str(err.value) == f"<string>:5: {message}"


def test_clip_without_its_block_names_both_bounds():
    with pytest.raises(NetError) as err:
        make(layer_yaml("Clip"), (3,))
    assert str(err.value) == ("<string>:1: layer[0]: layer 'act' (Clip): clip_param.min and "
                              "clip_param.max are required; set both, e.g. clip_param: {min: 0, "
                              "max: 6}")


def test_prelu_per_channel_default_filler_and_values():
    layer = make(layer_yaml("PReLU"), (2, 3, 4))
    assert layer.blob_names == ["slope"]
    assert layer.slope.shape == (3,) and layer.slope.tolist() == [0.25] * 3
    with torch.no_grad():
        layer.slope.copy_(torch.tensor([0.1, -0.2, 0.3]))
    x = away_from_zero(2, 3, 4, seed=3)
    a = np.array([0.1, -0.2, 0.3])[None, :, None]
    expected = np.maximum(x.numpy(), 0) + a * np.minimum(x.numpy(), 0)
    np.testing.assert_allclose(layer(x).detach().numpy(), expected, rtol=1e-7)


def test_prelu_gradcheck_input_and_slopes():
    for param in ("", "prelu_param: {channel_shared: true}"):
        layer = make(layer_yaml("PReLU", param), (2, 3, 2, 2)).double()
        with torch.no_grad():
            layer.slope.copy_(torch.linspace(0.1, 0.5, layer.slope.numel()).reshape(
                layer.slope.shape))
        x = away_from_zero(2, 3, 2, 2, seed=4).requires_grad_()
        assert torch.autograd.gradcheck(layer._impl, (x, layer.slope))


def test_prelu_shared_slope_is_a_scalar_blob_with_its_filler():
    layer = make(layer_yaml("PReLU", "prelu_param: {channel_shared: true, "
                                     "filler: {type: constant, value: 0.5}}"), (2, 3, 4))
    assert layer.slope.shape == () and layer.slope.item() == 0.5
    x = torch.tensor([[-2.0, 4.0]])
    layer2 = make(layer_yaml("PReLU", "prelu_param: {channel_shared: true}"), (1, 2))
    assert layer2(x).tolist() == [[-0.5, 4.0]]
    assert [n for n, _ in layer.named_parameters()] == ["slope"]


def test_prelu_needs_two_axes():
    with pytest.raises(NetError) as err:
        make(layer_yaml("PReLU"), (7,))
    assert str(err.value) == ("<string>:1: layer[0]: layer 'act' (PReLU): bottom 'x' (index 0) "
                              "has shape [7]; PReLU needs at least 2 axes (N, C, ...)")


def test_param_blocks_validate():
    with pytest.raises(SpecError) as err:
        make(layer_yaml("ReLU", "relu_param: {negative_slop: 0.1}"))
    assert "unknown key 'negative_slop'" in str(err.value)
    assert "did you mean 'negative_slope'?" in str(err.value)
    with pytest.raises(SpecError) as err:
        make(layer_yaml("Sigmoid", "sigmoid_param: {engine: CUDAA}"))
    assert "'CUDAA' is not one of DEFAULT, CAFFE, CUDNN, CUDA, TORCH; did you mean 'CUDA'?" \
        in str(err.value)


# ---- engine choice -------------------------------------------------------------------------
@pytest.mark.parametrize("engine", ["DEFAULT", "CAFFE", "CUDNN", "TORCH"])
def test_cpu_nets_use_torch(engine):
    for kind, block in (("ReLU", "relu_param"), ("ELU", "elu_param"),
                        ("Sigmoid", "sigmoid_param"), ("TanH", "tanh_param")):
        layer = make(layer_yaml(kind, f"{block}: {{engine: {engine}}}"))
        assert layer.backend == "torch"
    assert make(layer_yaml("PReLU")).backend == "torch"


def test_engine_cuda_on_a_cpu_net_is_an_error_naming_the_layer():
    with pytest.raises(NetError) as err:
        make(layer_yaml("ReLU", "relu_param: {engine: CUDA}"))
    assert str(err.value) == ("<string>:1: layer[0]: layer 'act' (ReLU): engine CUDA needs a "
                              "CUDA device but the net is built on cpu; build the net on a GPU, "
                              "or use engine DEFAULT or TORCH")
    with pytest.raises(NetError, match="engine CUDA needs a CUDA device"):
        make(layer_yaml("PReLU"), options={"activation_engine": "CUDA"})


def test_net_option_activation_engine():
    assert make(layer_yaml("TanH"), options={"activation_engine": "TORCH"}).backend == "torch"
    # An explicit engine wins over the net option.
    layer = make(layer_yaml("TanH", "tanh_param: {engine: TORCH}"),
                 options={"activation_engine": "CUDA"})
    assert layer.backend == "torch"
    with pytest.raises(NetError) as err:
        make(layer_yaml("TanH"), options={"activation_engine": "GPU"})
    assert str(err.value) == ("<string>:1: layer[0]: layer 'act' (TanH): the net option "
                              "activation_engine is 'GPU'; use one of DEFAULT, CUDA, TORCH")


@pytest.fixture
def failing_build(monkeypatch):
    """The extension's compiler fails: every layer must fall back, warning once."""
    calls = []

    def fail(verbose):
        calls.append(verbose)
        raise build.BuildError("nvcc: exit status 1")

    build.reset()
    monkeypatch.setattr(build, "_compile", fail)
    yield calls
    build.reset()


def test_failed_build_falls_back_with_one_warning(failing_build, caplog):
    x = away_from_zero(2, 3, 4, 5, seed=5).float()
    with caplog.at_level(logging.WARNING, logger="caffe_py"):
        relu = make(layer_yaml("ReLU", "relu_param: {negative_slope: 0.1}"), device="cuda")
        elu = make(layer_yaml("ELU"), device="cuda")
        forced = make(layer_yaml("Sigmoid", "sigmoid_param: {engine: CUDA}"), device="cuda")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [(
        "WARNING", "The CUDA activation kernels are unavailable (nvcc: exit status 1); the "
        "activation layers use PyTorch's ops instead")]
    assert failing_build == [False]  # one build attempt per process
    assert (relu.backend, elu.backend, forced.backend) == ("torch", "torch", "torch")
    # The layers run PyTorch's ops (on the CPU tensors given here).
    torch.testing.assert_close(relu(x), torch.nn.functional.leaky_relu(x, 0.1), rtol=0, atol=0)
    torch.testing.assert_close(elu(x), torch.nn.functional.elu(x), rtol=0, atol=0)
    torch.testing.assert_close(forced(x), torch.sigmoid(x), rtol=0, atol=0)


# ---- in place ------------------------------------------------------------------------------
def test_in_place_needs_the_spec_and_the_net_option():
    on = {"inplace_activations": True}
    assert make(layer_yaml("ReLU", top="x"), options=on).inplace
    assert not make(layer_yaml("ReLU", top="x")).inplace
    assert not make(layer_yaml("ReLU", top="y"), options=on).inplace
    # The backward of these needs the input, which in place would destroy.
    assert not make(layer_yaml("ReLU", "relu_param: {negative_slope: -1}", top="x"),
                    options=on).inplace
    assert not make(layer_yaml("ELU", "elu_param: {alpha: -1}", top="x"), options=on).inplace
    for kind in ("ELU", "Sigmoid", "TanH"):
        assert make(layer_yaml(kind, top="x"), options=on).inplace


def test_in_place_overwrites_and_keeps_gradients():
    layer = make(layer_yaml("Sigmoid", top="x"), options={"inplace_activations": True})
    w = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    x = away_from_zero(3, 4, seed=6)
    pre = x * w
    y = layer(pre)
    assert y is pre
    y.sum().backward()
    expected = (torch.sigmoid(x * 1.5) * (1 - torch.sigmoid(x * 1.5)) * x).sum()
    torch.testing.assert_close(w.grad, expected)
    # A leaf that needs a gradient cannot be overwritten: the layer computes out of place.
    leaf = x.clone().requires_grad_()
    assert layer(leaf) is not leaf


CHAIN = """
name: chain
input: data
input_shape: {dim: [2, 3, 6, 6]}
layer:
  - {name: conv, type: Convolution, bottom: data, top: conv,
     convolution_param: {num_output: 4, kernel_size: 3, weight_filler: {type: xavier},
                         bias_filler: {type: constant, value: 0.1}}}
  - {name: relu, type: ReLU, bottom: conv, top: conv, relu_param: {negative_slope: 0.05}}
  - {name: ip, type: InnerProduct, bottom: conv, top: ip,
     inner_product_param: {num_output: 3, weight_filler: {type: xavier}}}
  - {name: tanh, type: TanH, bottom: ip, top: ip}
  - {name: loss, type: EuclideanLoss, bottom: [ip, target], top: loss}
"""


def chain_grads(spec_of, options) -> tuple[float, list[torch.Tensor]]:
    net = Net(spec_of(CHAIN.replace("input: data", "input: [data, target]").replace(
        "input_shape: {dim: [2, 3, 6, 6]}", "input_shape: [{dim: [2, 3, 6, 6]}, {dim: [2, 3]}]")),
        options=options, seed=3)
    g = torch.Generator().manual_seed(7)
    data = torch.randn(2, 3, 6, 6, generator=g)
    target = torch.randn(2, 3, generator=g)
    out = net({"data": data, "target": target})
    out.loss.backward()
    return out.loss.item(), [p.param.grad.clone() for p in net.learnable_params()]


def test_conv_relu_in_place_ip_chain_gradients(spec_of):
    loss, grads = chain_grads(spec_of, {})
    loss_in_place, grads_in_place = chain_grads(spec_of, {"inplace_activations": True})
    assert loss == loss_in_place
    assert len(grads) == 4
    for a, b in zip(grads, grads_in_place, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
