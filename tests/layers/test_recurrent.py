"""RNN and LSTM against step-by-step numpy references of Caffe's unrolled nets."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from caffe_py.errors import NetError
from caffe_py.layers.base import BuildContext
from caffe_py.layers.registry import lookup
from caffe_py.spec.net_spec import parse_layer
from caffe_py.spec.schema import Source
from caffe_py.spec.yamlio import loads

T, N, H = 5, 3, 4
CONT = np.array([[0, 0, 0], [1, 1, 0], [1, 0, 1], [1, 1, 1], [0, 1, 1]], dtype=np.float64)
"""Every stream starts a sequence at t = 0 and restarts once mid-way (a 0 later on)."""


def build(kind: str, bottoms: str, shapes, tops: str = "y", param: str = ""):
    text = f"""
layer:
  - name: rec
    type: {kind}
    bottom: [{bottoms}]
    top: [{tops}]
    recurrent_param:
      num_output: {H}
      weight_filler: {{type: gaussian, std: 0.5}}
      bias_filler: {{type: uniform, min: -0.5, max: 0.5}}
{param}"""
    spec = parse_layer(loads(text)["layer"][0], Source(), "layer[0]")
    return lookup(spec.type)(spec, shapes, BuildContext()).double()


def weights(layer) -> dict[str, np.ndarray]:
    return {n: b.detach().numpy() for n, b in zip(layer.blob_names, layer.blobs(), strict=True)}


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-z))


def np_lstm(w, x, cont, x_static=None, h0=None, c0=None):
    """Caffe's LSTM one step at a time and one stream at a time (LSTMUnit's formulas)."""
    h = np.zeros((x.shape[1], H)) if h0 is None else h0.copy()
    c = np.zeros((x.shape[1], H)) if c0 is None else c0.copy()
    out = np.zeros((x.shape[0], x.shape[1], H))
    for t in range(x.shape[0]):
        for n in range(x.shape[1]):
            gates = w["W_xc"] @ x[t, n].ravel() + w["b_c"] + w["W_hc"] @ (cont[t, n] * h[n])
            if x_static is not None:
                gates += w["W_xc_static"] @ x_static[n].ravel()
            i, f, o = (sigmoid(gates[k * H:(k + 1) * H]) for k in range(3))
            g = np.tanh(gates[3 * H:])
            c[n] = cont[t, n] * f * c[n] + i * g
            h[n] = o * np.tanh(c[n])
        out[t] = h
    return out, h, c


def np_rnn(w, x, cont, x_static=None, h0=None):
    h = np.zeros((x.shape[1], H)) if h0 is None else h0.copy()
    out = np.zeros((x.shape[0], x.shape[1], H))
    for t in range(x.shape[0]):
        for n in range(x.shape[1]):
            a = w["W_hh"] @ (cont[t, n] * h[n]) + w["W_xh"] @ x[t, n].ravel() + w["b_h"]
            if x_static is not None:
                a += w["W_xh_static"] @ x_static[n].ravel()
            h[n] = np.tanh(a)
            out[t, n] = np.tanh(w["W_ho"] @ h[n] + w["b_o"])
    return out, h


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(T, N, 2, 3)), rng.normal(size=(N, 5))


def t64(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a)


def test_lstm_blobs_in_caffe_order():
    layer = build("LSTM", "x, cont, s", [(T, N, 2, 3), (T, N), (N, 5)])
    assert layer.blob_names == ["W_xc", "b_c", "W_xc_static", "W_hc"]
    assert [tuple(b.shape) for b in layer.blobs()] == [(16, 6), (16,), (16, 5), (16, 4)]
    plain = build("LSTM", "x, cont", [(T, N, 7), (T, N)])
    assert plain.blob_names == ["W_xc", "b_c", "W_hc"]
    assert plain.top_shapes == [(T, N, H)]


def test_rnn_blobs_in_caffe_order():
    layer = build("RNN", "x, cont, s", [(T, N, 2, 3), (T, N), (N, 5)])
    assert layer.blob_names == ["W_xh", "b_h", "W_xh_static", "W_hh", "W_ho", "b_o"]
    assert [tuple(b.shape) for b in layer.blobs()] == [(4, 6), (4,), (4, 5), (4, 4), (4, 4),
                                                       (4,)]


@pytest.mark.parametrize("static", [False, True])
def test_lstm_matches_step_by_step_reference_with_resets(data, static):
    x, xs = data
    bottoms, shapes = "x, cont", [x.shape, CONT.shape]
    if static:
        bottoms, shapes = "x, cont, s", shapes + [xs.shape]
    layer = build("LSTM", bottoms, shapes)
    inputs = (t64(x), t64(CONT)) + ((t64(xs),) if static else ())
    y = layer(*inputs).detach().numpy()
    want, _, _ = np_lstm(weights(layer), x, CONT, xs if static else None)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)
    # the mid-sequence reset really restarts: stream 1 at t=2 equals a fresh start there
    fresh, _, _ = np_lstm(weights(layer), x[2:], CONT[2:], xs if static else None)
    np.testing.assert_allclose(y[2:4, 1], fresh[:2, 1], rtol=1e-10)


@pytest.mark.parametrize("static", [False, True])
def test_rnn_matches_step_by_step_reference_with_resets(data, static):
    x, xs = data
    bottoms, shapes = "x, cont", [x.shape, CONT.shape]
    if static:
        bottoms, shapes = "x, cont, s", shapes + [xs.shape]
    layer = build("RNN", bottoms, shapes)
    inputs = (t64(x), t64(CONT)) + ((t64(xs),) if static else ())
    y = layer(*inputs).detach().numpy()
    want, _ = np_rnn(weights(layer), x, CONT, xs if static else None)
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)


def test_lstm_expose_hidden_takes_and_returns_state(data):
    x, _ = data
    rng = np.random.default_rng(1)
    h0, c0 = rng.normal(size=(1, N, H)), rng.normal(size=(1, N, H))
    cont = np.ones((T, N))
    layer = build("LSTM", "x, cont, h0, c0", [x.shape, cont.shape, h0.shape, c0.shape],
                  tops="y, hT, cT", param="      expose_hidden: true\n")
    assert layer.top_shapes == [(T, N, H), (1, N, H), (1, N, H)]
    y, h_t, c_t = layer(t64(x), t64(cont), t64(h0), t64(c0))
    want, h_want, c_want = np_lstm(weights(layer), x, cont, h0=h0[0], c0=c0[0])
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-10)
    np.testing.assert_allclose(h_t.detach().numpy()[0], h_want, rtol=1e-10)
    np.testing.assert_allclose(c_t.detach().numpy()[0], c_want, rtol=1e-10)


def test_rnn_expose_hidden(data):
    x, xs = data
    h0 = np.random.default_rng(2).normal(size=(1, N, H))
    layer = build("RNN", "x, cont, s, h0", [x.shape, CONT.shape, xs.shape, h0.shape],
                  tops="y, hT", param="      expose_hidden: true\n")
    y, h_t = layer(t64(x), t64(CONT), t64(xs), t64(h0))
    want, h_want = np_rnn(weights(layer), x, CONT, xs, h0=h0[0])
    np.testing.assert_allclose(y.detach().numpy(), want, rtol=1e-10)
    np.testing.assert_allclose(h_t.detach().numpy()[0], h_want, rtol=1e-10)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_state_carries_to_the_next_batch_when_cont_is_one(data, kind):
    # Caffe copies timestep T into timestep 0 between forwards (no expose_hidden)
    x, _ = data
    cont = CONT.copy()
    cont[3] = 1.0  # the second batch starts at t = 3 and continues every stream
    layer = build(kind, "x, cont", [x.shape, cont.shape])
    whole = layer(t64(x), t64(cont)).detach()
    split = build(kind, "x, cont", [(3, N, 2, 3), (3, N)])
    split.load_state_dict(layer.state_dict())
    first = split(t64(x[:3]), t64(cont[:3]))
    second = split(t64(x[3:]), t64(cont[3:]))
    torch.testing.assert_close(torch.cat([first, second]).detach(), whole)
    # a 0 at t = 0 of the next batch forgets the carried state
    restart = np.zeros((2, N))
    again = split(t64(x[3:]), t64(restart)).detach()
    fresh = build(kind, "x, cont", [(2, N, 2, 3), (2, N)])
    fresh.load_state_dict(layer.state_dict())
    torch.testing.assert_close(again, fresh(t64(x[3:]), t64(restart)).detach())


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_gradcheck_through_time_static_and_weights(kind):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    xs = torch.randn(2, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    cont = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    layer = build(kind, "x, cont, s", [(3, 2, 3), (3, 2), (2, 2)])
    names = layer.blob_names
    params = tuple(b.detach().clone().requires_grad_() for b in layer.blobs())

    def call(x, xs, *blobs):
        return torch.func.functional_call(layer, dict(zip(names, blobs, strict=True)),
                                          (x, cont, xs))

    assert torch.autograd.gradcheck(call, (x, xs) + params)


def test_debug_info_logs_every_step(caplog):
    layer = build("LSTM", "x, cont", [(2, 1, 3), (2, 1)], param="      debug_info: true\n")
    with caplog.at_level(logging.INFO, logger="caffe_py.layers.recurrent"):
        layer(torch.ones(2, 1, 3, dtype=torch.float64), torch.zeros(2, 1, dtype=torch.float64))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert lines[0].startswith("LSTM 'rec' t=0: mean |h_t| ")
    assert ", mean |c_t| " in lines[1]


def test_wiring_and_shape_errors():
    head = "<string>:3: layer[0]: layer 'rec'"
    with pytest.raises(NetError) as err:
        build("LSTM", "x, cont", [(T, N, 2), (T, N + 1)])
    assert str(err.value) == (f"{head} (LSTM): bottom 'cont' (index 1) has shape [5, 4]; "
                              "expected [5, 3] (T x N: one flag per step and stream)")
    with pytest.raises(NetError) as err:
        build("RNN", "x, cont, s, h0", [(T, N, 2), (T, N), (N, 2), (1, N, H)])
    assert str(err.value) == (f"{head} (RNN): takes bottoms x, cont[, x_static]; got 4; set "
                              "recurrent_param.expose_hidden: true to pass the state")
    with pytest.raises(NetError) as err:
        build("LSTM", "x, cont, h0", [(T, N, 2), (T, N), (1, N, H)],
              param="      expose_hidden: true\n")
    assert str(err.value) == (f"{head} (LSTM): takes bottoms x, cont[, x_static], h_0, c_0; "
                              "got 3")
    with pytest.raises(NetError) as err:
        build("LSTM", "x, cont, h0, c0", [(T, N, 2), (T, N), (1, N, H), (1, N, H)],
              param="      expose_hidden: true\n")
    assert str(err.value) == f"{head} (LSTM): takes tops the output, h_T, c_T; got 1"
    with pytest.raises(NetError) as err:
        build("LSTM", "x, cont, h0, c0", [(T, N, 2), (T, N), (1, N, H), (N, H)],
              tops="y, h, c", param="      expose_hidden: true\n")
    assert str(err.value) == (f"{head} (LSTM): bottom 'c0' (index 3) has shape [3, 4]; "
                              "expected [1, 3, 4] (1 x N x H)")
    with pytest.raises(NetError) as err:
        build("RNN", "x, cont, s", [(T, N, 2), (T, N), (N + 1, 2)])
    assert str(err.value) == (f"{head} (RNN): bottom 's' (index 2) has shape [4, 2]; expected "
                              "N x ... with N = 3 streams (as bottom 'x')")
    with pytest.raises(NetError) as err:
        build("RNN", "x, cont", [(T,), (T, N)])
    assert str(err.value) == (f"{head} (RNN): bottom 'x' (index 0) has shape [5]; expected "
                              "T x N x ... (at least 2 axes: time steps, streams)")


def test_num_output_is_required():
    text = """
layer:
  - name: rec
    type: LSTM
    bottom: [x, cont]
    top: y
"""
    spec = parse_layer(loads(text)["layer"][0], Source(), "layer[0]")
    with pytest.raises(NetError) as err:
        lookup("LSTM")(spec, [(T, N, 2), (T, N)], BuildContext())
    assert str(err.value) == ("<string>:3: layer[0]: layer 'rec' (LSTM): "
                              "recurrent_param.num_output is not set; set num_output to the "
                              "hidden size")


def test_expose_hidden_state_carries_values_but_no_gradient(data):
    # Caffe 1.0 shares the state bottoms' and tops' data, not their diffs
    x, _ = data
    layer = build("LSTM", "x, cont, h0, c0", [x.shape, (T, N), (1, N, H), (1, N, H)],
                  tops="y, hT, cT", param="      expose_hidden: true\n")
    h0 = torch.ones(1, N, H, dtype=torch.float64, requires_grad=True)
    y, h_t, c_t = layer(t64(x), t64(np.ones((T, N))), h0, torch.zeros(1, N, H).double())
    assert y.requires_grad and not h_t.requires_grad and not c_t.requires_grad
    y.sum().backward()
    assert h0.grad is None


# --- LSTMUnit ------------------------------------------------------------------------------

def unit(shapes):
    spec = parse_layer(loads("name: u\ntype: LSTMUnit\nbottom: [c0, x, cont]\ntop: [c, h]\n"),
                       Source(), "layer[0]")
    return lookup("LSTMUnit")(spec, shapes, BuildContext())


def test_lstm_unit_matches_one_step_of_the_reference():
    rng = np.random.default_rng(3)
    c0, x = rng.normal(size=(1, N, H)), rng.normal(size=(1, N, 4 * H))
    cont = np.array([[1.0, 0.0, 1.0]])
    layer = unit([c0.shape, x.shape, cont.shape])
    assert layer.top_shapes == [(1, N, H), (1, N, H)]
    c, h = layer(t64(c0), t64(x), t64(cont))
    i, f, o = (sigmoid(x[0, :, k * H:(k + 1) * H]) for k in range(3))
    g = np.tanh(x[0, :, 3 * H:])
    c_want = cont[0][:, None] * f * c0[0] + i * g
    np.testing.assert_allclose(c.numpy()[0], c_want, rtol=1e-12)
    np.testing.assert_allclose(h.numpy()[0], o * np.tanh(c_want), rtol=1e-12)


def test_lstm_unit_gradcheck_with_sequence_flags():
    rng = np.random.default_rng(4)
    c0 = torch.from_numpy(rng.normal(size=(1, N, 2))).requires_grad_()
    x = torch.from_numpy(rng.normal(size=(1, N, 8))).requires_grad_()
    layer = unit([(1, N, 2), (1, N, 8), (1, N)])
    cont = torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda a, b: layer(a, b, cont), (c0, x))


def test_lstm_unit_gate_width_error():
    with pytest.raises(NetError, match=r"has shape \[1, 3, 7\]; its last axis must be 4 x 2"):
        unit([(1, 3, 2), (1, 3, 7), (1, 3)])
