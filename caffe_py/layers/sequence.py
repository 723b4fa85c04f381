"""Layer family: the OCR forks' sequence layers (the CRNN / CTPN ports of Caffe; semantics read
from senlinuc/caffe_ocr's sources).

- ``Lstm`` (Junhyuk Oh's LSTM, CTPN's and CRNN's): bottom x (T, N, I) and, optionally, the
  continuation flags (T, N); top h (T, N, H). Gates i, f, o, g from x W_i^T + b (+ h_{t-1}
  W_h^T where the sequence continues), c_t = f c_{t-1} + i g, h_t = o tanh(c_t); a sequence
  starts at t = 0 (without flags) or where the flag is 0 (its forget gate is then 0). With the
  flags, a forward starts from the state the previous forward ended in. Backward is the
  fork's: each gate's pre-activation gradient clipped to ``clipping_threshold`` (when > 0)
  and W_h's gradient summing every step's, as its one matrix product does.
- ``Reverse``: the order along ``axis`` reversed (axis 0: time).
- ``Transpose``: top axis i is bottom axis dim[i].
- ``CTCGreedyDecoder``: per item, each step's best class (the first of a tie), repeats merged
  (``ctc_merge_repeated``) and blanks dropped; one bottom: the decoded classes (N, T, 1, 1),
  -1 after the end; with the labels (N, L) as second bottom: (1, 2, 1, 1), one minus the mean
  edit distance relative to the longer sequence, and the share of items decoded exactly.
- ``WarpCTCLoss`` (Baidu's warp-ctc in the fork): activations (T, N, C) (softmax inside) and
  labels (N, L) padded with the blank (or sequence lengths, label lengths and labels (L, N));
  the loss is the mean CTC cost over the items whose cost is finite; the gradient is the sum
  of the items' cost gradients, written by the fork in its forward, so neither divided by
  that count nor scaled by the loss weight.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..spec.layer_params.sequence import (
    CTCDecoderParameter,
    CTCLossParameter,
    LstmParameter,
    ReverseParameter,
    TransposeParameter,
)
from .base import Layer, Shape, count
from .registry import register


# --- Lstm -----------------------------------------------------------------------------------
def _steps(x: torch.Tensor, w_i: torch.Tensor, w_h: torch.Tensor, bias: torch.Tensor,
           cont: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The fork's forward over T steps: h (T, N, H), c (T, N, H), gates (T, N, 4H)."""
    steps, hidden = x.shape[0], w_h.shape[1]
    pre = x @ w_i.t() + bias  # (T, N, 4H)
    hs, cs, gates = [], [], []
    h, c = h0, c0
    for t in range(steps):
        keep = cont[t].unsqueeze(1)  # (N, 1): 1 where the sequence continues
        p = pre[t] + keep * (h @ w_h.t())
        i, f, o = (torch.sigmoid(p[:, k * hidden:(k + 1) * hidden]) for k in range(3))
        f = f * keep
        g = torch.tanh(p[:, 3 * hidden:])
        c = f * c + i * g
        h = o * torch.tanh(c)
        hs.append(h)
        cs.append(c)
        gates.append(torch.cat([i, f, o, g], dim=1))
    return torch.stack(hs), torch.stack(cs), torch.stack(gates)


class _Lstm(torch.autograd.Function):
    """The fork Lstm's forward and backward (module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w_i: torch.Tensor, w_h: torch.Tensor,
                bias: torch.Tensor, cont: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor,
                clip: float) -> tuple[torch.Tensor, torch.Tensor]:
        h, c, gates = _steps(x, w_i, w_h, bias, cont, h0, c0)
        ctx.save_for_backward(x, w_i, w_h, cont, h0, c0, h, c, gates)
        ctx.clip = clip
        last_cell = c[-1].clone()
        ctx.mark_non_differentiable(last_cell)
        return h, last_cell

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, _last_cell: Any) -> tuple[Any, ...]:
        x, w_i, w_h, cont, h0, c0, h, c, gates = ctx.saved_tensors
        steps, hidden = x.shape[0], w_h.shape[1]
        dh_top = grad.clone()  # the fork adds the recurrence into the top's diff
        dpre = torch.empty_like(gates)
        dc = torch.zeros_like(c[0])
        for t in range(steps - 1, -1, -1):
            i, f, o, g = (gates[t, :, k * hidden:(k + 1) * hidden] for k in range(4))
            keep = cont[t].unsqueeze(1)
            c_prev = c[t - 1] if t > 0 else c0
            tanh_c = torch.tanh(c[t])
            d_o = dh_top[t] * tanh_c
            dc = dc + dh_top[t] * o * (1 - tanh_c * tanh_c)
            d_f = keep * dc * c_prev
            d_i, d_g = dc * g, dc * i
            step = torch.cat([d_i * i * (1 - i), d_f * f * (1 - f), d_o * o * (1 - o),
                              d_g * (1 - g * g)], dim=1)
            if ctx.clip > 0:
                step = step.clamp(-ctx.clip, ctx.clip)
            dpre[t] = step
            dc = keep * dc * f
            if t > 0:
                dh_top[t - 1] += keep * (step @ w_h)
        h_prev = torch.cat([h0.unsqueeze(0), h[:-1]])
        flat = dpre.reshape(-1, 4 * hidden)
        return (dpre @ w_i, flat.t() @ x.reshape(-1, x.shape[2]),
                flat.t() @ h_prev.reshape(-1, hidden), flat.sum(0), None, None, None, None)


@register("Lstm")
class Lstm(Layer):
    """The fork LSTM (module docstring): x (T, N, I) [, flags (T, N)] -> h (T, N, H)."""

    bottoms = (1, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        self.require_axes(0, bottom_shapes[0], 3)
        steps, batch, inputs = bottom_shapes[0]
        if len(bottom_shapes) == 2 and count(bottom_shapes[1]) != steps * batch:
            raise self.bottom_error(1, f"(the continuation flags) has shape "
                                       f"{list(bottom_shapes[1])}; expected {[steps, batch]}")
        p: LstmParameter = self.param()
        hidden = p.num_output
        self.hidden, self.clip = hidden, p.clipping_threshold
        self.add_blob("weight_i", (4 * hidden, inputs), p.weight_filler)
        self.add_blob("weight_h", (4 * hidden, hidden), p.weight_filler)
        self.add_blob("bias", (4 * hidden,), p.bias_filler)
        self._state: tuple[torch.Tensor, torch.Tensor] | None = None
        return [(steps, batch, hidden)]

    def forward(self, x: torch.Tensor, flags: torch.Tensor | None = None) -> torch.Tensor:
        steps, batch = x.shape[:2]
        zeros = x.new_zeros(batch, self.hidden)
        if flags is None:
            cont = torch.ones(steps, batch, dtype=x.dtype, device=x.device)
            cont[0] = 0
            h0, c0 = zeros, zeros
        else:
            cont = (flags.detach().reshape(steps, batch) != 0).to(x.dtype)
            state = self._state
            h0, c0 = state if state is not None and state[0].shape == zeros.shape else (zeros,
                                                                                       zeros)
        h, last_cell = _Lstm.apply(x, self.weight_i, self.weight_h, self.bias, cont, h0, c0,
                                   self.clip)
        if flags is not None:  # carried into the next forward (truncated BPTT)
            self._state = (h[-1].detach(), last_cell)
        return h


# --- Reverse, Transpose ---------------------------------------------------------------------
@register("Reverse")
class Reverse(Layer):
    """The bottom with its order along ``axis`` reversed."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        (shape,) = bottom_shapes
        p: ReverseParameter = self.param()
        if p.axis >= len(shape):
            raise self.fail(f"reverse_param.axis {p.axis} is out of range for a bottom of "
                            f"{len(shape)} axes")
        self.axis = p.axis
        return [shape]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flip(x, dims=(self.axis,))


@register("Transpose")
class Transpose(Layer):
    """The bottom's axes permuted: top axis i is bottom axis dim[i]."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        (shape,) = bottom_shapes
        p: TransposeParameter = self.param()
        if len(p.dim) != len(shape):
            raise self.fail(f"transpose_param.dim names {len(p.dim)} axes for a bottom of "
                            f"{len(shape)}", "name every bottom axis once")
        self.dims = tuple(p.dim)
        return [tuple(shape[d] for d in self.dims)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(*self.dims)


# --- CTC ------------------------------------------------------------------------------------
def greedy_decode(scores: torch.Tensor, blank: int, merge: bool) -> list[list[int]]:
    """Each item's decoded classes from (T, N, C) scores (the first best class of a tie)."""
    best = scores.detach().argmax(dim=2).t().tolist()  # (N, T)
    out = []
    for row in best:
        seq, prev = [], -1
        for k in row:
            if k != blank and not (merge and k == prev):
                seq.append(k)
            prev = k
        out.append(seq)
    return out


def edit_distance(a: list[int], b: list[int]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def require_scores(layer: Layer, shape: Shape) -> None:
    """The CTC layers' scores: T x N x C, or with a fourth axis of 1 (an InnerProduct's
    output reshaped as the forks do); a 4-D image blob was a reshape error at forward."""
    layer.require_axes(0, shape, (3, 4))
    if len(shape) == 4 and shape[3] != 1:
        raise layer.bottom_error(0, f"of shape {list(shape)} is not T x N x C scores (a fourth "
                                    "axis must be 1)",
                                 "give time steps x items x classes (e.g. Reshape or Permute "
                                 "the scores to that)")


@register("CTCGreedyDecoder")
class CTCGreedyDecoder(Layer):
    """Greedy CTC decoding (module docstring): scores (T, N, C) [, labels (N, L)]."""

    bottoms = (1, 2)
    capturable = False  # decoding is host work

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        require_scores(self, bottom_shapes[0])
        steps, batch, classes = bottom_shapes[0][:3]
        p: CTCDecoderParameter = self.param()
        self.blank = p.blank_index if p.blank_index >= 0 else classes - 1
        self.merge = p.ctc_merge_repeated
        if len(bottom_shapes) == 2:
            if bottom_shapes[1][0] != batch:
                raise self.bottom_error(1, f"(the labels) has {bottom_shapes[1][0]} rows for "
                                           f"{batch} items")
            return [(1, 2, 1, 1)]
        return [(batch, steps, 1, 1)]

    def forward(self, scores: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        scores = scores.reshape(scores.shape[:3])
        decoded = greedy_decode(scores, self.blank, self.merge)
        steps, batch = scores.shape[:2]
        if labels is None:
            out = torch.full((batch, steps, 1, 1), -1.0, dtype=scores.dtype)
            for n, seq in enumerate(decoded):
                out[n, :len(seq), 0, 0] = torch.tensor(seq, dtype=scores.dtype)
            return out.to(scores.device)
        rows = labels.detach().reshape(batch, -1).tolist()
        distance, exact = 0.0, 0
        for row, seq in zip(rows, decoded, strict=True):
            target = []
            for value in row:
                if value < 0:  # the sequence has ended
                    break
                k = int(0.5 + value)
                if k != self.blank:
                    target.append(k)
            longest = max(len(target), len(seq))
            if longest == 0:
                continue
            ed = edit_distance(target, seq)
            distance += ed / longest
            exact += ed == 0
        return torch.tensor([1 - distance / batch, exact / batch], dtype=scores.dtype,
                            device=scores.device).reshape(1, 2, 1, 1)


class _WarpCTC(torch.autograd.Function):
    """The mean of the finite CTC costs; backward hands back the summed costs' gradient,
    computed in the forward, as warp-ctc writes it (the incoming gradient is not read)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                target_lengths: torch.Tensor, blank: int) -> torch.Tensor:
        with torch.enable_grad():
            leaf = x.detach().requires_grad_()
            costs = F.ctc_loss(leaf.log_softmax(2), targets, input_lengths, target_lengths,
                               blank, reduction="none", zero_infinity=True)
            (grad,) = torch.autograd.grad(costs.sum(), leaf)
        raw = F.ctc_loss(x.detach().log_softmax(2), targets, input_lengths, target_lengths,
                         blank, reduction="none")
        finite = torch.isfinite(raw)
        ctx.save_for_backward(grad)
        return raw[finite].sum() / finite.sum().clamp(min=1)

    @staticmethod
    def backward(ctx: Any, _grad: torch.Tensor) -> tuple[Any, ...]:
        (grad,) = ctx.saved_tensors
        return grad, None, None, None, None


@register("WarpCTCLoss")
class WarpCTCLoss(Layer):
    """warp-ctc's loss (module docstring): activations (T, N, C) and labels (N, L), or
    activations, sequence lengths (N,), label lengths (N,) and labels (L, N)."""

    bottoms = (2, 4)
    is_loss = True

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        require_scores(self, bottom_shapes[0])
        if len(bottom_shapes) == 3:
            raise self.fail("the fork's three-bottom form (sequence indicators and target "
                            "sequences) is not supported here",
                            "give the labels (N, L) padded with the blank as the second bottom, "
                            "or the sequence lengths, label lengths and labels (L, N)")
        p: CTCLossParameter = self.param()
        self.blank = p.blank_index
        return [()]

    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        x = x.reshape(x.shape[:3])
        steps, batch = x.shape[:2]
        if len(rest) == 1:  # labels (N, L), the blank as padding
            rows = rest[0].detach().reshape(batch, -1).long()
            kept = rows != self.blank
            targets = rows[kept]
            target_lengths = kept.sum(1)
            input_lengths = torch.full((batch,), steps, dtype=torch.long)
        else:
            input_lengths = rest[0].detach().reshape(-1).long()
            target_lengths = rest[1].detach().reshape(-1).long()
            columns = rest[2].detach().reshape(-1, batch).long().t()  # (N, L)
            targets = torch.cat([columns[n, :int(target_lengths[n])] for n in range(batch)])
        return _WarpCTC.apply(x, targets.to(x.device), input_lengths.cpu(),
                              target_lengths.cpu(), self.blank)
