"""Caffe's update pipeline (SGDSolver::ApplyUpdate) and the six update rules.

The pipeline is fixed: rate -> clip (global L2 norm) -> normalize (/ iter_size) -> regularize
(L2 or L1, weight_decay * decay_mult) -> the rule (local_rate = rate * lr_mult) -> w -= update.
Each solver type overrides only :meth:`UpdateRule.compute`.

For speed every step is a ``torch._foreach_*`` call over a *group* of parameters sharing
(lr_mult, decay_mult), so a net with 50 blobs costs a handful of kernel launches per step
instead of hundreds. Gradients are modified in place, as Caffe modifies the diff: they may be
views into a flat buffer owned by the parallel package, so they are never replaced.
The history blobs follow Caffe's layout: ``history[j * N + i]`` is history j of parameter i.

SGD with float32 parameters on a GPU (the common case) runs the whole pipeline after the clip
as one kernel instead (:func:`~caffe_py.kernels.functions.sgd_update`, a few launches for a
large net), with the same numbers bit for bit: the foreach pipeline stays the path of the
other rules and of the CPU, and the kernel's test oracle (``Updater(..., fused=False)``).

A rule's per-iteration multiplier (the local rate, and Adam's bias correction) is computed on
the host by :meth:`UpdateRule.scale`; :meth:`Updater.apply_scales` takes it as a Python float
(op by op) or as a 0-d device tensor (what a CUDA graph replays: a new rate every iteration
without capturing a new graph).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..kernels import build, functions
from ..spec.solver_spec import SolverParameter

Tensors = list[torch.Tensor]
Scale = float | torch.Tensor
"""A per-iteration multiplier: a host float, or a 0-d tensor on the parameters' device."""


@dataclass(frozen=True)
class ParamGroup:
    """Parameters (indices into the solver's list) that share their multipliers."""

    indices: tuple[int, ...]
    lr_mult: float
    decay_mult: float


def group_params(mults: Sequence[tuple[float, float]]) -> list[ParamGroup]:
    """Group parameter indices by (lr_mult, decay_mult), in order of first appearance."""
    groups: dict[tuple[float, float], list[int]] = {}
    for i, key in enumerate(mults):
        groups.setdefault((float(key[0]), float(key[1])), []).append(i)
    return [ParamGroup(tuple(ix), lr, dec) for (lr, dec), ix in groups.items()]


class UpdateRule:
    """SGD with Caffe's momentum form: h = m*h + local_rate*g; update = h."""

    type_name = "SGD"
    histories = 1
    """History blobs per parameter (AdaDelta and Adam keep two)."""

    def __init__(self, p: SolverParameter):
        self.p = p

    def scale(self, local_rate: float, it: int) -> float:
        """The update's multiplier at iteration ``it`` (before it is incremented): the local
        rate (rate * lr_mult), times whatever else the rule folds in (Adam's correction)."""
        return local_rate

    def compute(self, g: Tensors, h: list[Tensors], scale: Scale) -> Tensors:
        """The update for each gradient in ``g``; ``h[j]`` is history j of the same params."""
        (hist,) = h
        torch._foreach_mul_(hist, self.p.momentum)
        _add_scaled_(hist, g, scale)
        return hist


class Nesterov(UpdateRule):
    """h_new = m*h + local_rate*g; update = (1+m)*h_new - m*h."""

    type_name = "Nesterov"

    def compute(self, g, h, scale):
        (hist,) = h
        m = self.p.momentum
        previous = torch._foreach_mul(hist, m)
        torch._foreach_mul_(hist, m)
        _add_scaled_(hist, g, scale)
        update = torch._foreach_mul(hist, 1.0 + m)
        torch._foreach_sub_(update, previous)
        return update


class AdaGrad(UpdateRule):
    """h += g^2; update = local_rate * g / (sqrt(h) + delta)."""

    type_name = "AdaGrad"

    def compute(self, g, h, scale):
        (hist,) = h
        torch._foreach_addcmul_(hist, g, g)
        return _scaled_ratio(g, hist, self.p.delta, scale)


class RMSProp(UpdateRule):
    """h = rms_decay*h + (1-rms_decay)*g^2; update = local_rate * g / (sqrt(h) + delta)."""

    type_name = "RMSProp"

    def compute(self, g, h, scale):
        (hist,) = h
        decay = self.p.rms_decay
        torch._foreach_mul_(hist, decay)
        torch._foreach_addcmul_(hist, g, g, value=1.0 - decay)
        return _scaled_ratio(g, hist, self.p.delta, scale)


class AdaDelta(UpdateRule):
    """h = m*h + (1-m)*g^2; u = g*sqrt((h2+d)/(h+d)); h2 = m*h2 + (1-m)*u^2; update = rate*u."""

    type_name = "AdaDelta"
    histories = 2

    def compute(self, g, h, scale):
        hist, hist2 = h
        m, d = self.p.momentum, self.p.delta
        torch._foreach_mul_(hist, m)
        torch._foreach_addcmul_(hist, g, g, value=1.0 - m)
        ratio = torch._foreach_add(hist2, d)
        torch._foreach_div_(ratio, torch._foreach_add(hist, d))
        torch._foreach_sqrt_(ratio)
        update = torch._foreach_mul(g, ratio)  # u
        torch._foreach_mul_(hist2, m)
        torch._foreach_addcmul_(hist2, update, update, value=1.0 - m)
        torch._foreach_mul_(update, scale)
        return update


class Adam(UpdateRule):
    """m1 = b1*m1 + (1-b1)*g; m2 = b2*m2 + (1-b2)*g^2; t = it+1;
    update = local_rate * sqrt(1-b2^t)/(1-b1^t) * m1 / (sqrt(m2) + delta)."""

    type_name = "Adam"
    histories = 2

    def scale(self, local_rate, it):
        b1, b2 = self.p.momentum, self.p.momentum2
        t = it + 1
        return local_rate * ((1.0 - b2 ** t) ** 0.5 / (1.0 - b1 ** t))

    def compute(self, g, h, scale):
        m1, m2 = h
        b1, b2 = self.p.momentum, self.p.momentum2
        torch._foreach_mul_(m1, b1)
        torch._foreach_add_(m1, g, alpha=1.0 - b1)
        torch._foreach_mul_(m2, b2)
        torch._foreach_addcmul_(m2, g, g, value=1.0 - b2)
        # delta goes in before the bias correction (Caffe), unlike torch.optim.Adam.
        return _scaled_ratio(m1, m2, self.p.delta, scale)


def _add_scaled_(acc: Tensors, g: Tensors, scale: Scale) -> None:
    """acc += scale * g (one fused op for a float; a multiply, then an add, for a tensor)."""
    if isinstance(scale, torch.Tensor):
        torch._foreach_add_(acc, torch._foreach_mul(g, scale))
    else:
        torch._foreach_add_(acc, g, alpha=scale)


def _scaled_ratio(num: Tensors, sq: Tensors, delta: float, scale: Scale) -> Tensors:
    """scale * num / (sqrt(sq) + delta), as new tensors."""
    den = torch._foreach_sqrt(sq)
    torch._foreach_add_(den, delta)
    out = list(torch._foreach_div(num, den))
    torch._foreach_mul_(out, scale)
    return out


RULES: dict[str, type[UpdateRule]] = {
    cls.type_name: cls for cls in (UpdateRule, Nesterov, AdaGrad, RMSProp, AdaDelta, Adam)}


class Updater:
    """Runs the update pipeline over a fixed list of parameters and owns their history.

    ``params`` are the learnable tensors (each once, shared blobs deduplicated) and ``mults``
    their (lr_mult, decay_mult). Parameters with lr_mult 0 are never touched.
    """

    def __init__(self, p: SolverParameter, params: Sequence[torch.Tensor],
                 mults: Sequence[tuple[float, float]], *, fused: bool | None = None):
        self.p = p
        self.params = list(params)
        self.rule = RULES[p.type](p)
        self.groups = [g for g in group_params(mults) if g.lr_mult != 0]
        n = len(self.params)
        self.history: Tensors = [torch.zeros_like(w, memory_format=torch.preserve_format)
                                 for _ in range(self.rule.histories) for w in self.params]
        self._hist = [[[self.history[j * n + i] for i in g.indices]
                       for j in range(self.rule.histories)] for g in self.groups]
        self._weights = [[self.params[i] for i in g.indices] for g in self.groups]
        self._order = [i for g in self.groups for i in g.indices]
        # the kernel's view of the same lists: every weight and its first history in group
        # order, each one's group, each group's decay
        self._flat = ([w for ws in self._weights for w in ws],
                      [h for hs in self._hist for h in hs[0]],
                      [k for k, g in enumerate(self.groups) for _ in g.indices],
                      [self.p.weight_decay * g.decay_mult for g in self.groups])
        self._undo: Tensors = []
        """The weights and history as they were, for an update a device flag may skip."""
        self.mean_of = 1
        """How many replicas' gradients the gradients hold the sum of, where the all-reduce
        leaves Caffe's division by their count to this update (:meth:`can_take_mean`): the
        SGD kernel folds it into its first multiply."""
        self.fused = fused
        """Whether SGD runs as one CUDA kernel (:func:`~caffe_py.kernels.functions.sgd_update`)
        instead of op by op: None decides at the first update (SGD on float32 CUDA parameters
        whose kernels build); False keeps the op-by-op pipeline, the kernel's test oracle."""

    @torch.no_grad()
    def apply(self, rate: float, it: int) -> None:
        """One update at ``rate`` for iteration ``it`` (before it is incremented)."""
        self.apply_scales(self.scales(rate, it))

    def gradients(self) -> Tensors:
        """Every parameter's gradient (zeros where no loss reached it), in parameter order."""
        return [self._grad(i) for i in range(len(self.params))]

    def scales(self, rate: float, it: int) -> list[float]:
        """Each group's multiplier for the update at ``rate`` in iteration ``it``."""
        return [self.rule.scale(rate * g.lr_mult, it) for g in self.groups]

    @torch.no_grad()
    def apply_scales(self, scales: Sequence[Scale] | torch.Tensor,
                     skip: torch.Tensor | None = None) -> None:
        """One update with each group's multiplier given (see :meth:`scales`): host floats, or
        a 1-D device tensor of one multiplier per group (read when the update runs).
        ``skip``, a device flag (float16's loss scaling: the gradients overflowed), leaves
        every weight and history tensor as it was when it is set, with no host sync."""
        grads = [self._grad(i) for i in self._order]
        if not grads:
            return
        self._clip(grads)
        if skip is not None:
            self._divide(grads)
            self._masked(grads, scales, skip)
            return
        if self.fused is None:
            self.fused = self._fusable()
        if self.fused and self._fused_sgd(grads, scales):
            return
        self._divide(grads)
        self._pipeline(grads, scales)

    def can_take_mean(self) -> bool:
        """Whether this update can divide gradients summed over replicas by their count itself
        (:attr:`mean_of`), in the SGD kernel's first multiply, with the numbers of a division
        right after the sum: SGD in the kernel, ``iter_size`` 1 (one multiply, as the sum's
        1/N is), no gradient clipping (whose norm reads the divided gradients) and every
        parameter learning (a frozen one's gradient would stay a sum)."""
        return (self.p.iter_size == 1 and self.p.clip_gradients <= 0
                and len(self._order) == len(self.params) and self.fused is not False
                and self._fusable())

    def _divide(self, grads: Tensors) -> None:
        """Caffe's 1/N of summed replicas' gradients, where the SGD kernel does not fold it."""
        if self.mean_of > 1:
            torch._foreach_mul_(grads, 1.0 / self.mean_of)

    def _masked(self, grads: Tensors, scales: Sequence[Scale] | torch.Tensor,
                skip: torch.Tensor) -> None:
        """The op-by-op update, then each weight and history tensor put back where ``skip``
        is set (a select, not arithmetic: an overflowed update holds inf and NaN)."""
        kept = [self.params[i] for i in self._order] + list(self.history)
        if not self._undo:
            self._undo = [torch.empty_like(t) for t in kept]
        torch._foreach_copy_(self._undo, kept)
        self._pipeline(grads, scales)
        flag = skip.bool()
        for t, before in zip(kept, self._undo, strict=True):
            t.copy_(torch.where(flag, before, t))

    def _pipeline(self, grads: Tensors, scales: Sequence[Scale] | torch.Tensor) -> None:
        """Caffe's update op by op: normalize -> regularize -> rule -> w -= update."""
        if isinstance(scales, torch.Tensor):
            scales = list(scales.unbind())
        start = 0
        for group, w, hist, scale in zip(self.groups, self._weights, self._hist, scales,
                                         strict=True):
            g = grads[start:start + len(w)]
            start += len(w)
            if self.p.iter_size > 1:
                torch._foreach_mul_(g, 1.0 / self.p.iter_size)
            self._regularize(w, g, group.decay_mult)
            update = self.rule.compute(g, hist, scale)
            torch._foreach_sub_(w, update)

    def _fusable(self) -> bool:
        """SGD (Caffe's momentum rule, L2 or L1) on float32 CUDA parameters, kernels built."""
        if type(self.rule) is not UpdateRule or not self.groups:
            return False
        if not all(w.is_cuda and w.dtype == torch.float32 for w in self.params):
            return False
        return build.available()

    def _fused_sgd(self, grads: Tensors, scales: Sequence[Scale] | torch.Tensor) -> bool:
        """The SGD update in one kernel; False (nothing changed) where it does not apply."""
        rates: list[float] | torch.Tensor
        if isinstance(scales, torch.Tensor):
            rates = scales
        elif any(isinstance(v, torch.Tensor) for v in scales):
            return False
        else:
            rates = [float(v) for v in scales]
        weights, history, group, decays = self._flat
        grad_scale = 1.0 / (self.p.iter_size * self.mean_of)   # one of the two is 1
        return functions.sgd_update(weights, grads, history, group, rates, decays,
                                    self.p.momentum, grad_scale,
                                    self.p.regularization_type == "L1")

    def _grad(self, i: int) -> torch.Tensor:
        w = self.params[i]
        if w.grad is None:  # a blob no loss reaches: Caffe's diff stays zero
            w.grad = torch.zeros_like(w)
        return w.grad

    def _clip(self, grads: Tensors) -> None:
        """Scale every gradient by clip/norm when the global L2 norm exceeds clip (no sync)."""
        clip = self.p.clip_gradients
        if clip <= 0:
            return
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        scale = torch.where(norm > clip, clip / norm, torch.ones_like(norm))
        torch._foreach_mul_(grads, scale)

    def _regularize(self, w: Tensors, g: Tensors, decay_mult: float) -> None:
        local_decay = self.p.weight_decay * decay_mult
        if local_decay == 0:
            return
        if self.p.regularization_type == "L2":
            torch._foreach_add_(g, w, alpha=local_decay)
        else:
            torch._foreach_add_(g, torch._foreach_sign(w), alpha=local_decay)

    def load_history(self, history: Sequence[torch.Tensor], source: str) -> None:
        """Copy saved history blobs (Caffe order) in; a count or shape mismatch is an error."""
        from ..errors import SolverError

        if len(history) != len(self.history):
            raise SolverError(f"{source}: holds {len(history)} history blobs but this "
                              f"{self.p.type} solver over this net needs {len(self.history)}; "
                              "resume with the same net and solver type")
        for k, (mine, saved) in enumerate(zip(self.history, history, strict=True)):
            if mine.shape != saved.shape:
                raise SolverError(f"{source}: history blob {k} has shape {list(saved.shape)}, "
                                  f"the net's parameter has {list(mine.shape)}; resume with "
                                  "the same net")
            mine.copy_(saved)
