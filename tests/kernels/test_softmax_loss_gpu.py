"""The fused SoftmaxWithLoss kernels (csrc/softmax_loss.cu) against the layer's PyTorch path
(``fused_loss: false``, itself held to Caffe by tests/layers/test_loss.py and the golden
cases): loss, gradient and probabilities in every normalization, with ignored and out-of-range
labels, many blocks, determinism, the label check and a CUDA graph replay. Skipped without
CUDA; run with `pytest -m gpu`."""
from __future__ import annotations

import math

import pytest
import torch

from caffe_py.layers import BuildContext, lookup
from caffe_py.spec.net_spec import parse_layer
from caffe_py.spec.schema import Source
from caffe_py.spec.yamlio import loads

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

FLT_MIN = 1.17549435e-38


def layer(n: int, c: int, fused: bool, loss_param: str = "", tops: str = "loss"):
    node = loads(f"""
name: l
type: SoftmaxWithLoss
bottom: [score, label]
top: [{tops}]
{loss_param}""")
    ctx = BuildContext(device=torch.device("cuda"), options={"fused_loss": fused})
    return lookup("SoftmaxWithLoss")(parse_layer(node, Source(), "layer[0]"),
                                     [(n, c), (n,)], ctx)


def both(n, c, labels, loss_param="", tops="loss", scale=3.0, seed=0):
    """(loss, grad, prob?) of the fused kernels and of the PyTorch path on the same scores."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    scores = torch.randn(n, c, generator=g, device="cuda") * scale
    out = []
    for fused in (True, False):
        x = scores.clone().requires_grad_(True)
        lay = layer(n, c, fused, loss_param, tops)
        got = lay(x, labels)
        loss, prob = (got if isinstance(got, tuple) else (got, None))
        (loss * 0.7).backward()  # a loss weight: the top diff is not 1
        assert lay.fused(x) is fused
        out.append((loss.detach(), x.grad, None if prob is None else prob.detach()))
    return out


@pytest.mark.parametrize("n,c", [(1, 1), (64, 10), (7, 33), (256, 1000), (1000, 3)])
@pytest.mark.parametrize("mode", ["VALID", "FULL", "BATCH_SIZE", "NONE"])
def test_fused_loss_and_gradient_match_the_pytorch_path(n, c, mode):
    labels = torch.randint(0, c, (n,), device="cuda").float()  # Data layers give floats
    (loss, grad, _), (want, want_grad, _) = both(n, c, labels,
                                                 f"loss_param: {{normalization: {mode}}}")
    torch.testing.assert_close(loss, want, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ["VALID", "FULL", "NONE"])
def test_ignored_labels_count_out_of_the_valid_normalizer(mode):
    labels = torch.tensor([0, 255, 3, 255, 1, 2, 255, 0] * 5, device="cuda")
    (loss, grad, _), (want, want_grad, _) = both(
        40, 4, labels, f"loss_param: {{ignore_label: 255, normalization: {mode}}}")
    torch.testing.assert_close(loss, want, rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(grad, want_grad, rtol=1e-5, atol=1e-7)
    assert bool((grad[labels == 255] == 0).all())
    every = torch.full((3,), 255, device="cuda")  # nothing counts: the divisor is 1, loss 0
    (loss, grad, _), _ = both(3, 4, every, "loss_param: {ignore_label: 255}")
    assert loss.item() == 0.0 and bool((grad == 0).all())


def test_probability_top_and_the_flt_min_floor():
    labels = torch.tensor([0, 2], device="cuda")
    (_, _, prob), (_, _, want) = both(2, 5, labels, tops="loss, prob")
    torch.testing.assert_close(prob, want, rtol=1e-6, atol=1e-7)
    lay = layer(1, 3, True, "loss_param: {normalization: NONE}")
    x = torch.tensor([[0.0, 200.0, 0.0]], device="cuda", requires_grad=True)
    loss = lay(x, torch.tensor([0], device="cuda"))
    assert loss.item() == pytest.approx(-math.log(FLT_MIN), rel=1e-6)
    loss.backward()  # Caffe's gradient, p - onehot, also where the floor holds
    torch.testing.assert_close(x.grad, torch.tensor([[-1.0, 1.0, 0.0]], device="cuda"))


def test_out_of_range_labels_are_clamped_and_recorded_for_the_check():
    lay = layer(4, 5, True, "loss_param: {ignore_label: -1}")
    x = torch.randn(4, 5, device="cuda")
    assert math.isfinite(lay(x, torch.tensor([-1, 9, 2, -3], device="cuda")).item())
    (check,) = lay.device_checks
    assert check.state.tolist() == [-3, 9]  # -1 is ignored, -3 and 9 are not
    assert "layer 'l' (SoftmaxWithLoss): label -3 is outside [0, 5) (5 classes)" in \
        check.problem(check.state.cpu())


def test_many_blocks_are_deterministic_and_the_counter_is_reused():
    lay = layer(4099, 17, True)
    x = torch.randn(4099, 17, device="cuda")
    labels = torch.randint(0, 17, (4099,), device="cuda")
    first = lay(x, labels)
    for _ in range(5):
        assert torch.equal(lay(x, labels), first)
    assert lay._held[(4099, x.get_device())][1].item() == 0


def test_a_cuda_graph_replays_the_fused_loss():
    lay = layer(64, 10, True)
    x = torch.randn(64, 10, device="cuda", requires_grad=True)
    labels = torch.randint(0, 10, (64,), device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: the workspace is made outside the capture
        lay(x, labels).backward()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = lay(x, labels)
        loss.backward()
    for seed in (1, 2):
        with torch.no_grad():
            x.copy_(torch.randn(64, 10, device="cuda", generator=torch.Generator(
                device="cuda").manual_seed(seed)))
            labels.copy_(torch.randint(0, 10, (64,), device="cuda"))
        x.grad.zero_()
        graph.replay()
        want_x = x.detach().clone().requires_grad_(True)
        want = layer(64, 10, False)(want_x, labels)
        want.backward()
        torch.testing.assert_close(loss, want.detach(), rtol=2e-6, atol=1e-6)
        torch.testing.assert_close(x.grad, want_x.grad, rtol=1e-5, atol=1e-7)


def test_compiling_a_net_with_the_loss_breaks_no_graph():
    """torch.compile traces the PyTorch path in one graph (the layer decides at build time,
    so no kernel build or lock is traced); the compiled loss is the eager one's."""
    import torch._dynamo as dynamo

    from caffe_py.net import Net
    from caffe_py.spec.net_spec import parse_net

    text = """
name: small
input: [data, label]
input_shape: [{dim: [8, 6]}, {dim: [8]}]
layer:
  - {name: ip, type: InnerProduct, bottom: data, top: ip,
     inner_product_param: {num_output: 5, weight_filler: {type: gaussian, std: 0.1}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
"""
    net = Net(parse_net(loads(text), Source()), "TRAIN", device="cuda")
    inputs = {"data": torch.randn(8, 6, device="cuda"),
              "label": torch.randint(0, 5, (8,), device="cuda").float()}
    assert net.layer_by_name("loss").fused(torch.zeros(8, 5, device="cuda"))
    dynamo.reset()
    explained = dynamo.explain(net)(inputs)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    compiled = torch.compile(net)(inputs).loss
    torch.testing.assert_close(compiled, net(inputs).loss, rtol=2e-6, atol=1e-6)
