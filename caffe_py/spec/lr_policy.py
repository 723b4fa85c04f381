"""Caffe's learning-rate policies (SGDSolver::GetLearningRate).

``it`` is the iteration count before the update it is used for. ``multistep`` keeps state
(``current_step``, which rises by at most one per call and is saved in the solver state);
``step`` recomputes it from ``it`` as Caffe does. The rate is rounded to float32, Caffe's Dtype.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .solver_spec import SolverParameter


def learning_rate(p: SolverParameter, it: int, current_step: int) -> tuple[float, int]:
    """The rate for iteration ``it`` and the (possibly advanced) ``current_step``."""
    policy = p.lr_policy
    if policy == "fixed":
        rate = p.base_lr
    elif policy == "step":
        current_step = it // p.stepsize
        rate = p.base_lr * math.pow(p.gamma, current_step)
    elif policy == "exp":
        rate = p.base_lr * math.pow(p.gamma, it)
    elif policy == "inv":
        rate = p.base_lr * math.pow(1.0 + p.gamma * it, -p.power)
    elif policy == "multistep":
        if current_step < len(p.stepvalue) and it >= p.stepvalue[current_step]:
            current_step += 1
        rate = p.base_lr * math.pow(p.gamma, current_step)
    elif policy == "poly":
        rate = p.base_lr * math.pow(1.0 - it / p.max_iter, p.power)
    elif policy == "sigmoid":   # past exp's range the rate is 0, as Caffe's 1 / (1 + inf)
        z = -p.gamma * (it - p.stepsize)
        rate = p.base_lr / (1.0 + math.exp(z)) if z < 709.0 else 0.0
    else:  # the spec's choices make this unreachable from YAML
        raise ValueError(f"unknown lr_policy {policy!r}")
    with np.errstate(over="ignore"):   # past float32: inf, which the spec check refuses
        return float(np.float32(rate)), current_step
