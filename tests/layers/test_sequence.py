"""The OCR forks' sequence layers (Lstm, Reverse, Transpose, CTCGreedyDecoder, WarpCTCLoss)
against loop references written from the fork's sources (senlinuc/caffe_ocr), forward and the
fork's backward, and float64 gradchecks where that backward is the exact derivative. No fork
of these is built here."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from layer_helpers import build, gradcheck, rand

from caffe_py.errors import SpecError


def sigmoid(v):
    return 1 / (1 + np.exp(-v))


def lstm_loops(x, wi, wh, b, cont, top_diff, clip):
    """lstm_layer_Junhyuk.cpp's Forward_cpu and Backward_cpu, element by element."""
    steps, batch, _ = x.shape
    hidden = wh.shape[1]
    h = np.zeros((steps, batch, hidden))
    c = np.zeros_like(h)
    gate = np.zeros((steps, batch, 4 * hidden))
    pre = np.einsum("tni,gi->tng", x, wi) + b
    for t in range(steps):
        for n in range(batch):
            p = pre[t, n].copy()
            if cont[t, n]:
                p += wh @ (h[t - 1, n] if t > 0 else np.zeros(hidden))
            for d in range(hidden):
                gate[t, n, d] = sigmoid(p[d])
                gate[t, n, hidden + d] = sigmoid(p[hidden + d]) if cont[t, n] else 0.0
                gate[t, n, 2 * hidden + d] = sigmoid(p[2 * hidden + d])
                gate[t, n, 3 * hidden + d] = np.tanh(p[3 * hidden + d])
                c_prev = c[t - 1, n, d] if t > 0 else 0.0
                c[t, n, d] = gate[t, n, hidden + d] * c_prev + gate[t, n, d] * gate[t, n,
                                                                                     3 * hidden + d]
                h[t, n, d] = gate[t, n, 2 * hidden + d] * np.tanh(c[t, n, d])
    dh = top_diff.copy()
    dc = np.zeros_like(c)
    dpre = np.zeros_like(gate)
    for t in range(steps - 1, -1, -1):
        for n in range(batch):
            for d in range(hidden):
                i, f, o, g = (gate[t, n, k * hidden + d] for k in range(4))
                tanh_c = np.tanh(c[t, n, d])
                do = dh[t, n, d] * tanh_c
                dc[t, n, d] += dh[t, n, d] * o * (1 - tanh_c ** 2)
                if t > 0:
                    dc[t - 1, n, d] = dc[t, n, d] * f if cont[t, n] else 0.0
                c_prev = c[t - 1, n, d] if t > 0 else 0.0
                df = dc[t, n, d] * c_prev if cont[t, n] else 0.0
                di, dg = dc[t, n, d] * g, dc[t, n, d] * i
                values = [di * i * (1 - i), df * f * (1 - f), do * o * (1 - o), dg * (1 - g * g)]
                for k, value in enumerate(values):
                    dpre[t, n, k * hidden + d] = np.clip(value, -clip, clip) if clip else value
        if t > 0:
            for n in range(batch):
                if cont[t, n]:
                    dh[t - 1, n] += dpre[t, n] @ wh
    h_prev = np.concatenate([np.zeros((1, batch, hidden)), h[:-1]])
    return (h, np.einsum("tng,gi->tni", dpre, wi), np.einsum("tng,tni->gi", dpre, x),
            np.einsum("tng,tnh->gh", dpre, h_prev), dpre.sum((0, 1)))


LSTM = ("name: l\ntype: Lstm\nbottom: x\ntop: h\nlstm_param: {num_output: 3, "
        "weight_filler: {type: gaussian, std: 0.5}, bias_filler: {type: gaussian}")


@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_lstm_matches_the_forks_loops(clip):
    layer = build(LSTM + f", clipping_threshold: {clip}}}\n", [(4, 2, 5)]).double()
    x = rand(4, 2, 5, seed=1).requires_grad_()
    h = layer(x)
    top_diff = rand(4, 2, 3, seed=2)
    cont = np.ones((4, 2))
    cont[0] = 0
    want = lstm_loops(x.detach().numpy(), layer.weight_i.detach().numpy(),
                      layer.weight_h.detach().numpy(), layer.bias.detach().numpy(), cont,
                      top_diff.numpy(), clip)
    np.testing.assert_allclose(h.detach().numpy(), want[0], rtol=1e-10, atol=1e-12)
    h.backward(top_diff)
    for got, expected in zip((x.grad, layer.weight_i.grad, layer.weight_h.grad,
                              layer.bias.grad), want[1:], strict=True):
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10, atol=1e-12)


def test_lstm_without_clipping_is_the_exact_derivative():
    layer = build(LSTM + "}\n", [(3, 2, 4)])
    assert gradcheck(layer, rand(3, 2, 4, seed=3))


def test_lstm_with_flags_restarts_sequences_and_carries_state():
    layer = build("name: l\ntype: Lstm\nbottom: [x, c]\ntop: h\nlstm_param: {num_output: 2, "
                  "weight_filler: {type: gaussian}, bias_filler: {type: gaussian}}\n",
                  [(3, 2, 2), (3, 2)]).double()
    x = rand(3, 2, 2, seed=4)
    flags = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    first = layer(x, flags)
    # item 1 restarts at t = 1: its steps 1.. equal a fresh run on x[1:]
    fresh = layer(x[1:, 1:], torch.tensor([[0.0], [1.0]]))
    assert torch.allclose(first[1:, 1], fresh[:, 0])
    # a forward whose flags continue at t = 0 starts from where the last one ended: item 0
    # (one sequence from t = 0) then equals a 4-step run without flags
    layer(x, flags)
    carry = layer(x[:1], torch.ones(1, 2))
    reference = build("name: l\ntype: Lstm\nbottom: x\ntop: h\nlstm_param: {num_output: 2}\n",
                      [(4, 2, 2)]).double()
    reference.load_state_dict(layer.state_dict())
    assert torch.allclose(carry[0, 0], reference(torch.cat([x, x[:1]]))[3, 0])


def test_reverse_and_transpose():
    x = rand(3, 2, 4, seed=5)
    rev = build("name: r\ntype: Reverse\nbottom: x\ntop: y\nreverse_param: {axis: 0}\n",
                [x.shape])
    assert torch.equal(rev(x), x.flip(0))
    assert gradcheck(rev, x)
    tr = build("name: t\ntype: Transpose\nbottom: x\ntop: y\ntranspose_param: {dim: [2, 0, 1]}\n",
               [x.shape])
    assert tr.top_shapes == [(4, 3, 2)]
    assert torch.equal(tr(x)[1, 2, 0], x[2, 0, 1])
    assert gradcheck(tr, x)
    with pytest.raises(SpecError, match=r"dim \[0, 0, 1\] is not a permutation"):
        build("name: t\ntype: Transpose\nbottom: x\ntop: y\ntranspose_param: {dim: [0, 0, 1]}\n",
              [x.shape])


def test_ctc_greedy_decoder_merges_repeats_and_drops_blanks():
    # (T, N, C): item 0's best classes 1 1 0 2 2 1, item 1's 0 0 3 3 0 3
    best = torch.tensor([[1, 0], [1, 0], [0, 3], [2, 3], [2, 0], [1, 3]])
    scores = torch.nn.functional.one_hot(best, 4).double()
    layer = build("name: d\ntype: CTCGreedyDecoder\nbottom: s\ntop: seq\n", [scores.shape])
    out = layer(scores)
    assert out.shape == (2, 6, 1, 1)
    assert out[0, :, 0, 0].tolist() == [1, 2, 1, -1, -1, -1]
    assert out[1, :, 0, 0].tolist() == [3, 3, -1, -1, -1, -1]
    unmerged = build("name: d\ntype: CTCGreedyDecoder\nbottom: s\ntop: seq\n"
                     "ctc_decoder_param: {ctc_merge_repeated: false}\n", [scores.shape])
    assert unmerged(scores)[0, :, 0, 0].tolist() == [1, 1, 2, 2, 1, -1]
    acc = build("name: d\ntype: CTCGreedyDecoder\nbottom: [s, l]\ntop: acc\n",
                [scores.shape, (2, 4)])
    labels = torch.tensor([[1.0, 2.0, 1.0, -1.0], [3.0, 1.0, 0.0, 0.0]])
    # item 0 exact; item 1: [3, 1] against [3, 3], one edit of two
    assert acc(scores, labels).reshape(-1).tolist() == pytest.approx([1 - 0.5 / 2, 0.5])


def ctc_cost(logits: np.ndarray, target: list[int], blank: int) -> float:
    """-log p(target | logits) by the forward (alpha) recursion over one item (T, C)."""
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    ext = [blank]
    for k in target:
        ext += [k, blank]
    alpha = np.zeros(len(ext))
    alpha[0] = probs[0, blank]
    if len(ext) > 1:
        alpha[1] = probs[0, ext[1]]
    for t in range(1, len(probs)):
        new = np.zeros_like(alpha)
        for s, k in enumerate(ext):
            total = alpha[s] + (alpha[s - 1] if s > 0 else 0.0)
            if s > 1 and k != blank and k != ext[s - 2]:
                total += alpha[s - 2]
            new[s] = total * probs[t, k]
        alpha = new
    return -np.log(alpha[-1] + (alpha[-2] if len(ext) > 1 else 0.0))


def test_warp_ctc_loss_is_the_mean_cost_with_warp_ctcs_gradient():
    x = rand(6, 3, 5, seed=6).requires_grad_()
    labels = torch.tensor([[1.0, 2.0, 0.0], [3.0, 3.0, 4.0], [2.0, 0.0, 0.0]])
    layer = build("name: ctc\ntype: WarpCTCLoss\nbottom: [x, l]\ntop: loss\n",
                  [x.shape, labels.shape])
    assert layer.is_loss
    loss = layer(x, labels)
    targets = [[1, 2], [3, 3, 4], [2]]
    costs = [ctc_cost(x.detach().numpy()[:, n], targets[n], 0) for n in range(3)]
    assert loss.item() == pytest.approx(np.mean(costs), rel=1e-10)
    (5.0 * loss).backward()  # the fork's gradient ignores the loss weight and the mean
    summed = x.detach().requires_grad_()
    total = sum(torch.nn.functional.ctc_loss(summed[:, n:n + 1].log_softmax(2),
                                             torch.tensor([targets[n]]), torch.tensor([6]),
                                             torch.tensor([len(targets[n])]), 0,
                                             reduction="sum") for n in range(3))
    total.backward()
    np.testing.assert_allclose(x.grad.numpy(), summed.grad.numpy(), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("layer,bottoms", [("CTCGreedyDecoder", "x"),
                                           ("WarpCTCLoss", "[x, labels]")])
def test_ctc_layers_refuse_image_blobs_at_setup(layer, bottoms):
    """A 4-D bottom like an image batch was a reshape error at the first forward."""
    from caffe_py.errors import NetError

    with pytest.raises(NetError) as info:
        build(f"name: s\ntype: {layer}\nbottom: {bottoms}\ntop: s\n", [(4, 3, 8, 8), (4, 2)])
    assert str(info.value).endswith(
        f"layer 's' ({layer}): bottom 'x' (index 0) of shape [4, 3, 8, 8] is not T x N x C "
        "scores (a fourth axis must be 1); give time steps x items x classes (e.g. Reshape or "
        "Permute the scores to that)")
    build(f"name: s\ntype: {layer}\nbottom: {bottoms}\ntop: s\n", [(5, 4, 6, 1), (4, 2)])
