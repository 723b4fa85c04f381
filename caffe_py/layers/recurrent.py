"""Layer family: Caffe's recurrent layers, RNN and LSTM, and LSTM's one-step unit LSTMUnit
(recurrent_layer.cpp, rnn_layer.cpp, lstm_layer.cpp, lstm_unit_layer.cpp).

Bottoms: x (T x N x ...), cont (T x N; 0 at the first step of a sequence), optionally a static
input x_static (N x ..., seen at every step) and, with ``expose_hidden``, the initial state
h_0 (1 x N x H) [and c_0 for LSTM]. Tops: the hidden output (T x N x H) and, with
``expose_hidden``, the final state h_T [and c_T] (1 x N x H).

With ``expose_hidden`` the state bottoms and tops carry values only, as in Caffe 1.0
(recurrent_layer.cpp shares their data but not their diffs): no gradient flows into h_0 [c_0]
or back from h_T [c_T]; the hidden output's gradient reaches the inputs and weights as usual.

cont_t multiplies the previous state before it is used, so a 0 starts a new sequence. Without
``expose_hidden`` Caffe copies the last step's state into the next forward's initial state
(recurrent_layer.cpp Forward: "copy timestep T to timestep 0"), so cont = 1 at t = 0 continues
a sequence across batches; the carried state is detached (truncated back-propagation).

The input projections for all T steps are one matmul; only the recurrent matmul is per step.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from ..spec.layer_params.recurrent import RecurrentParameter
from .base import Layer, Shape, count
from .registry import register

log = logging.getLogger(__name__)


class Recurrent(Layer):
    """What RNN and LSTM share: bottom checks, the input projections, the state carry."""

    state_names: tuple[str, ...] = ()
    gates: int = 1
    """Rows of the input projection per hidden unit (LSTM: 4 gates)."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p: RecurrentParameter = self.param()
        if p.num_output <= 0:
            raise self.fail("recurrent_param.num_output is not set",
                            "set num_output to the hidden size")
        self.hidden = p.num_output
        self.expose_hidden = p.expose_hidden
        self.debug_info = p.debug_info
        states = len(self.state_names)
        self._check_wiring(len(bottom_shapes), states)
        self.static_input = len(bottom_shapes) - (states if self.expose_hidden else 0) == 3
        x = bottom_shapes[0]
        if len(x) < 2:
            raise self.bottom_error(0, f"has shape {list(x)}; expected T x N x ... (at least "
                                       "2 axes: time steps, streams)")
        steps, streams = x[0], x[1]
        self._check_shape(1, bottom_shapes[1], (steps, streams), "T x N: one flag per step "
                                                                  "and stream")
        static_size = 0
        if self.static_input:
            static = bottom_shapes[2]
            if len(static) < 1 or static[0] != streams:
                raise self.bottom_error(2, f"has shape {list(static)}; expected N x ... with "
                                           f"N = {streams} streams (as bottom "
                                           f"'{self.spec.bottom[0]}')")
            static_size = count(static, 1)
        first_state = 3 if self.static_input else 2
        for i in range(first_state, len(bottom_shapes)):
            self._check_shape(i, bottom_shapes[i], (1, streams, self.hidden), "1 x N x H")
        self._add_blobs(p, count(x, 2), static_size)
        self._carry: tuple[torch.Tensor, ...] | None = None
        out: list[Shape] = [(steps, streams, self.hidden)]
        if self.expose_hidden:
            out += [(1, streams, self.hidden)] * states
        return out

    def _check_wiring(self, n_bottoms: int, states: int) -> None:
        names = "h_0" if states == 1 else "h_0, c_0"
        tops = "h_T" if states == 1 else "h_T, c_T"
        if self.expose_hidden:
            allowed, want = (2 + states, 3 + states), f"x, cont[, x_static], {names}"
            n_tops, want_tops = 1 + states, f"the output, {tops}"
        else:
            allowed, want = (2, 3), "x, cont[, x_static]"
            n_tops, want_tops = 1, "the output"
        if n_bottoms not in allowed:
            fix = ("set recurrent_param.expose_hidden: true to pass the state" if
                   n_bottoms > 3 and not self.expose_hidden else None)
            raise self.fail(f"takes bottoms {want}; got {n_bottoms}", fix)
        if len(self.spec.top) != n_tops:
            raise self.fail(f"takes tops {want_tops}; got {len(self.spec.top)}")

    def _check_shape(self, index: int, shape: Shape, want: tuple[int, ...], form: str) -> None:
        if tuple(shape) != want:
            raise self.bottom_error(index, f"has shape {list(shape)}; expected {list(want)} "
                                           f"({form})")

    def _add_blobs(self, p: RecurrentParameter, input_size: int, static_size: int) -> None:
        """Create the weights in Caffe's order (each subclass defines its own)."""
        raise NotImplementedError(f"{type(self).__name__}._add_blobs")

    # --- forward helpers ----------------------------------------------------------------------
    def _project_inputs(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                        static: tuple[torch.Tensor, ...], static_weight: str) -> torch.Tensor:
        """W x_t + b (+ W_static x_static) for every step at once: (T, N, gates * H)."""
        steps, streams = x.shape[:2]
        projected = F.linear(x.reshape(steps, streams, -1), weight, bias)
        if self.static_input:
            flat = static[0].reshape(streams, -1)
            projected = projected + F.linear(flat, getattr(self, static_weight)).unsqueeze(0)
        return projected

    def _initial_state(self, given: tuple[torch.Tensor, ...], like: torch.Tensor,
                       streams: int) -> tuple[torch.Tensor, ...]:
        """h_0 [, c_0] as (N, H): the bottoms, or the state the last forward left behind."""
        if self.expose_hidden:  # values only: Caffe shares their data, not their diffs
            return tuple(s.detach().reshape(streams, self.hidden) for s in given)
        carry = self._carry
        if (carry is None or carry[0].shape[0] != streams or carry[0].dtype != like.dtype
                or carry[0].device != like.device):
            zeros = like.new_zeros(streams, self.hidden)
            return tuple(zeros for _ in self.state_names)
        return carry

    def _finish(self, output: torch.Tensor, final: tuple[torch.Tensor, ...]):
        """Keep the final state for the next forward (no expose_hidden), or return it."""
        if self.expose_hidden:  # values only, as Caffe shares the final state's data alone
            return (output, *(s.detach().unsqueeze(0) for s in final))
        # a fresh detached reference each time: the old carry may be saved for backward
        self._carry = tuple(s.detach() for s in final)
        return output

    def _debug(self, step: int, states: tuple[torch.Tensor, ...]) -> None:
        norms = ", ".join(f"mean |{n}_t| {s.abs().mean().item():.6g}"
                          for n, s in zip(self.state_names, states, strict=True))
        log.info("%s '%s' t=%d: %s", self.type_name, self.name, step, norms)

    def _split_bottoms(self, rest: tuple[torch.Tensor, ...]):
        static = rest[:1] if self.static_input else ()
        return static, rest[len(static):]


@register("RNN")
class RNN(Recurrent):
    """h_t = tanh(W_hh (cont_t h_{t-1}) + W_xh x_t + b_h [+ W_xh_static x_static]),
    o_t = tanh(W_ho h_t + b_o). Blobs: W_xh, b_h, [W_xh_static], W_hh, W_ho, b_o."""

    bottoms = (2, 4)
    tops = (1, 2)
    state_names = ("h",)

    def _add_blobs(self, p: RecurrentParameter, input_size: int, static_size: int) -> None:
        h = self.hidden
        self.add_blob("W_xh", (h, input_size), p.weight_filler)
        self.add_blob("b_h", (h,), p.bias_filler)
        if self.static_input:
            self.add_blob("W_xh_static", (h, static_size), p.weight_filler)
        self.add_blob("W_hh", (h, h), p.weight_filler)
        self.add_blob("W_ho", (h, h), p.weight_filler)
        self.add_blob("b_o", (h,), p.bias_filler)

    def forward(self, x: torch.Tensor, cont: torch.Tensor, *rest: torch.Tensor):
        static, given = self._split_bottoms(rest)
        steps, streams = x.shape[:2]
        pre = self._project_inputs(x, self.W_xh, self.b_h, static, "W_xh_static")
        flags = cont.reshape(steps, streams, 1).to(pre.dtype)
        (h,) = self._initial_state(given, pre, streams)
        w_hh = self.W_hh.t()
        hidden = []
        for t in range(steps):
            h = torch.tanh(torch.addmm(pre[t], flags[t] * h, w_hh))
            hidden.append(h)
            if self.debug_info:
                self._debug(t, (h,))
        output = torch.tanh(F.linear(torch.stack(hidden), self.W_ho, self.b_o))
        return self._finish(output, (h,))


@register("LSTM")
class LSTM(Recurrent):
    """Caffe's LSTM: gates = W_xc x_t + b_c [+ W_xc_static x_static] + W_hc (cont_t h_{t-1}),
    in the order i, f, o, g along 4H; i, f, o = sigmoid, g = tanh;
    c_t = cont_t f c_{t-1} + i g; h_t = o tanh(c_t). Blobs: W_xc, b_c, [W_xc_static], W_hc."""

    bottoms = (2, 5)
    tops = (1, 3)
    state_names = ("h", "c")

    def _add_blobs(self, p: RecurrentParameter, input_size: int, static_size: int) -> None:
        h = self.hidden
        self.add_blob("W_xc", (4 * h, input_size), p.weight_filler)
        self.add_blob("b_c", (4 * h,), p.bias_filler)
        if self.static_input:
            self.add_blob("W_xc_static", (4 * h, static_size), p.weight_filler)
        self.add_blob("W_hc", (4 * h, h), p.weight_filler)

    def forward(self, x: torch.Tensor, cont: torch.Tensor, *rest: torch.Tensor):
        static, given = self._split_bottoms(rest)
        steps, streams = x.shape[:2]
        pre = self._project_inputs(x, self.W_xc, self.b_c, static, "W_xc_static")  # (T, N, 4H)
        flags = cont.reshape(steps, streams, 1).to(pre.dtype)
        h, c = self._initial_state(given, pre, streams)
        w_hc = self.W_hc.t()
        split = 3 * self.hidden
        hidden = []
        for t in range(steps):
            gates = torch.addmm(pre[t], flags[t] * h, w_hc)  # (N, 4H): i, f, o | g
            ifo = torch.sigmoid(gates[:, :split])
            g = torch.tanh(gates[:, split:])
            i, f, o = ifo.chunk(3, dim=1)
            c = torch.addcmul(i * g, flags[t] * f, c)
            h = o * torch.tanh(c)
            hidden.append(h)
            if self.debug_info:
                self._debug(t, (h, c))
        return self._finish(torch.stack(hidden), (h, c))


class _LSTMUnitFunction(torch.autograd.Function):
    """One LSTM step with Caffe's gradient: c = f c_prev + i g, h = o tanh(c), where f is
    cont * sigmoid(x_f) (0 where cont is 0) and Caffe's backward takes f (1 - f) as the forget
    gate's derivative (exact for cont in {0, 1}, the values sequence flags take)."""

    @staticmethod
    def forward(ctx, c_prev: torch.Tensor, x: torch.Tensor, cont: torch.Tensor):
        i, f, o, g = x.chunk(4, dim=-1)  # (1, N, D) each
        i, o, g = torch.sigmoid(i), torch.sigmoid(o), torch.tanh(g)
        flag = cont.unsqueeze(-1)  # (1, N, 1)
        f = torch.where(flag == 0, torch.zeros_like(f), flag * torch.sigmoid(f))
        c = f * c_prev + i * g
        tanh_c = torch.tanh(c)
        ctx.save_for_backward(c_prev, i, f, o, g, tanh_c)
        return c, o * tanh_c

    @staticmethod
    def backward(ctx, dc: torch.Tensor | None, dh: torch.Tensor | None):
        c_prev, i, f, o, g, tanh_c = ctx.saved_tensors
        dc = torch.zeros_like(c_prev) if dc is None else dc
        dh = torch.zeros_like(c_prev) if dh is None else dh
        dc_total = dc + dh * o * (1 - tanh_c * tanh_c)
        dx = torch.cat([dc_total * g * i * (1 - i), dc_total * c_prev * f * (1 - f),
                        dh * tanh_c * o * (1 - o), dc_total * i * (1 - g * g)], dim=-1)
        return dc_total * f, dx, None


@register("LSTMUnit")
class LSTMUnit(Layer):
    """One step of Caffe's LSTM: bottoms c_prev (1 x N x D), the gate inputs x (1 x N x 4D,
    in the order i, f, o, g) and cont (1 x N); tops c and h (1 x N x D). The flags get no
    gradient."""

    bottoms = (3, 3)
    tops = (2, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        c_prev, x, cont = bottom_shapes
        for index, (shape, axes) in enumerate(((c_prev, 3), (x, 3), (cont, 2))):
            self.require_axes(index, shape, axes)
            if shape[0] != 1 or shape[1] != c_prev[1]:
                raise self.bottom_error(index, f"has shape {list(shape)}; expected 1 x N ... "
                                               f"with N = {c_prev[1]} (as bottom "
                                               f"'{self.spec.bottom[0]}')")
        if x[2] != 4 * c_prev[2]:
            raise self.bottom_error(1, f"has shape {list(x)}; its last axis must be 4 x "
                                       f"{c_prev[2]} (the gates i, f, o, g)")
        return [c_prev, c_prev]

    def forward(self, c_prev: torch.Tensor, x: torch.Tensor, cont: torch.Tensor):
        return _LSTMUnitFunction.apply(c_prev, x, cont.detach().to(x.dtype))
