"""What a Solver is in a run (its role and seeds) and how it computes one forward/backward
(its step function): the seams through which parallel training and CUDA graphs plug in.

A run of one device has one Solver, the ``ROOT``. Data-parallel training builds one Solver per
replica: the root applies the update, tests, displays and snapshots; the others are ``WORKER``
(Caffe's WorkerSolver). With several hosts, the root of every other host is a ``HOST_ROOT``: it
applies the same update as the leading root, but tests, displays and snapshots nothing. When
the replicas average their weights every K iterations instead of summing gradients
(``model_average_period``), every worker is an ``UPDATING_WORKER``: it applies its own update
between the averaging points (so it is when the whole iterations of every replica are captured
as CUDA graphs, each replica updating its copy of the weights with the same summed gradient).
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..errors import CaffePyError

if TYPE_CHECKING:
    from ..net import Net, NetOutput
    from .solver import Solver

log = logging.getLogger(__name__)

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
UPDATING_WORKER = Role(applies_updates=True, tests=False, reports=False, seeds_rng=False)
"""A worker that applies its own update: between model-averaging points, or when every
replica updates its copy of the weights with the same all-reduced gradient (captured whole
iterations, parallel/captured.py)."""


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


def eager_step(solver: Solver, net: Callable[[], NetOutput] | None = None,
               ) -> tuple[torch.Tensor, NetOutput]:
    """The plain step: iter_size forward and backward passes, op by op (through ``net``, a
    compiled form of the solver's net, when given); the backward passes run on this thread
    when the solver's :attr:`~caffe_py.solver.solver.Solver.backward_in_caller` says so."""
    with torch.autograd.set_multithreading_enabled(not solver.backward_in_caller):
        return _passes(solver, net if net is not None else solver.net.run)


def _passes(solver: Solver, forward: Callable[[], NetOutput]) -> tuple[torch.Tensor, NetOutput]:
    """The iter_size forward and backward passes of :func:`eager_step`."""
    if solver.param.iter_size == 1:
        with solver.autocast():
            out = forward()
        if out.loss.requires_grad:
            solver.backward(out.loss)
        loss = out.loss.detach()
        return (loss if loss.dtype == torch.float32 else loss.float()), out
    total = torch.zeros((), device=solver.device)
    last: NetOutput | None = None
    for _ in range(solver.param.iter_size):
        with solver.autocast():
            last = forward()
        if last.loss.requires_grad:
            solver.backward(last.loss)
        total += last.loss.detach().float()
    assert last is not None  # iter_size >= 1 (the schema's minimum)
    return total / solver.param.iter_size, last


class CompiledStep:
    """A :class:`StepFn` running the net compiled by ``torch.compile`` (inductor): the first
    call compiles (minutes for a large net), later ones run the generated kernels; the
    parameters are the net's own, so the update, snapshots and sharing see the same tensors.

    With ``fallback`` (the automatic choice, not ``--compile on``) a compiler failure is one
    log line and the step runs the plain net from then on; the batch the failed call read is
    not trained on (the data positions count it, so nothing is read twice)."""

    def __init__(self, net: Net | None = None, *, fallback: bool = False,
                 compiler: Any = torch.compile):
        self.compiler = compiler
        self.net = compiler(net) if net is not None else None
        """The compiled net: ``net`` compiled now, or (None) the solver's at the first call."""
        self.fallback = fallback
        self.failed: str | None = None
        """Why compiling failed (the step then runs the plain net)."""

    def __call__(self, solver: Solver) -> tuple[torch.Tensor, NetOutput]:
        if self.failed is not None:
            return eager_step(solver)
        if self.net is None:
            self.net = self.compiler(solver.net)
        if not self.fallback:
            return eager_step(solver, self.net)
        try:
            return eager_step(solver, self.net)
        except CaffePyError:
            raise  # the net's own errors (data, labels) are the run's, compiled or not
        except Exception as exc:  # noqa: BLE001 (the compiler's many error types: one line)
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
            self.failed = f"{type(exc).__name__}: {first}"
            log.info(f"torch.compile failed ({self.failed}); training the plain net "
                     "(one batch skipped); --compile off skips the attempt")
            solver.zero_grads()  # what the failed pass left behind
            return eager_step(solver)


@dataclass(frozen=True)
class AutoCompile:
    """When ``--compile auto`` (the default) compiles: once the step time is measured, if
    the iterations left would take longer than ``min_seconds`` at that rate. A compile costs
    tens of seconds to minutes and makes a large net's step faster (ResNet-50 on an H100:
    1.46x torchvision compiled, 1.04x not; docs/performance.md), so only a long run earns it
    back; short runs and small nets never pay for it."""

    min_seconds: float = 1800.0
    compiler: Any = torch.compile

    def worth(self, iterations_left: int, step_ms: float) -> bool:
        return iterations_left * step_ms / 1000.0 > self.min_seconds

    def step(self, net: Net) -> CompiledStep:
        return CompiledStep(net, fallback=True, compiler=self.compiler)
