"""What a Solver is in a run (its role and seeds) and how it computes one forward/backward
(its step function): the seams through which parallel training and CUDA graphs plug in.

A run of one device has one Solver, the ``ROOT``. Data-parallel training builds one Solver per
replica: the root applies the update, tests, displays and snapshots; the others are ``WORKER``
(Caffe's WorkerSolver). With several hosts, the root of every other host is a ``HOST_ROOT``: it
applies the same update as the leading root, but tests, displays and snapshots nothing. When
the replicas average their weights every K iterations instead of summing gradients
(``model_average_period``), every worker is an ``AVERAGING_WORKER``: it applies its own update
between the averaging points.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from ..net import NetOutput
    from .solver import Solver


@dataclass(frozen=True)
class Role:
    """The jobs of one replica's Solver besides its own forward and backward."""

    applies_updates: bool = True
    """Runs Caffe's update on its (reduced) gradients; a worker receives its weights instead."""
    tests: bool = True
    """Builds and runs the TEST nets."""
    reports: bool = True
    """Displays, snapshots on schedule and logs the run's progress (one replica per run)."""
    seeds_rng: bool = True
    """Seeds the process's torch generators with its seed (one replica per process)."""


ROOT = Role()
WORKER = Role(applies_updates=False, tests=False, reports=False, seeds_rng=False)
HOST_ROOT = Role(applies_updates=True, tests=False, reports=False, seeds_rng=True)
AVERAGING_WORKER = Role(applies_updates=True, tests=False, reports=False, seeds_rng=False)


@dataclass(frozen=True)
class Seeds:
    """A replica's seeds: ``model`` for its fillers and Dropout (Caffe: random_seed + replica),
    ``data`` for its Data layers' crops and mirrors (the run's seed: the choices are a
    function of (seed, record position), so N replicas draw what one replica of N x the batch
    draws for the same records)."""

    model: int
    data: int


class StepFn(Protocol):
    """One iteration's forward and backward passes of a Solver's TRAIN net.

    Returns the mean loss over the solver's iter_size passes (a scalar on the device; gradients
    accumulate in the parameters' ``.grad``) and the last pass's outputs.
    """

    def __call__(self, solver: Solver) -> tuple[torch.Tensor, NetOutput]: ...


def eager_step(solver: Solver, net: Any = None) -> tuple[torch.Tensor, NetOutput]:
    """The plain step: iter_size forward and backward passes, op by op (through ``net``, a
    compiled form of the solver's net, when given)."""
    net = net if net is not None else solver.net
    if solver.param.iter_size == 1:
        with solver.autocast():
            out = net()
        if out.loss.requires_grad:
            out.loss.backward()
        return out.loss.detach().float(), out
    total = torch.zeros((), device=solver.device)
    out = None
    for _ in range(solver.param.iter_size):
        with solver.autocast():
            out = net()
        if out.loss.requires_grad:
            out.loss.backward()
        total += out.loss.detach().float()
    assert out is not None  # iter_size >= 1 (the schema's minimum)
    return total / solver.param.iter_size, out


class CompiledStep:
    """A :class:`StepFn` running the net compiled by ``torch.compile`` (inductor): the first
    call compiles (minutes for a large net), later ones run the generated kernels; the
    parameters are the net's own, so the update, snapshots and sharing see the same tensors."""

    def __init__(self, net: Any):
        self.net = torch.compile(net)

    def __call__(self, solver: Solver) -> tuple[torch.Tensor, NetOutput]:
        return eager_step(solver, self.net)
