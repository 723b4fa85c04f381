"""How a training run uses its devices: the strategies the run layer (caffe_py/train.py)
chooses between, in one place.

* :class:`SingleDevice`: one Solver on one device (Caffe's single-GPU ``caffe train``); on a
  GPU its iterations are CUDA-graph replays (:class:`~caffe_py.solver.graph_loop.GraphedLoop`),
  else eager;
* :class:`Replicated`: one Solver and one thread per device of this process, synchronised by
  the tree (or the NCCL ring) through the Solver's callbacks (caffe_py/parallel/replicated.py);
* :class:`MultiHost`: the same on every host (one process each, ``WORLD_SIZE > 1``), the
  hosts' roots joined through torch.distributed (caffe_py/parallel/multihost.py).

Each is made from the devices and the run's options, says whether its process ``leads`` (tests,
displays, snapshots, owns the snapshot prefix), and ``run`` trains to max_iter and returns the
root's Solver. Every Solver gets its seams (step function, runner, callbacks) when it is made.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from .cpu_threads import governor_for
from .devices import rank, world_size
from .options import TrainOptions
from .solver.solver import Solver, own_test_batches
from .spec.solver_spec import SolverParameter

log = logging.getLogger(__name__)

Action = Callable[[], str]
"""What a signal asks for after an iteration (solver/signals.py)."""


class Strategy(Protocol):
    """How a run uses its devices; built by :func:`choose_strategy`."""

    options: TrainOptions

    @property
    def leads(self) -> bool:
        """Whether this process tests, displays and snapshots (and owns the snapshot prefix)."""
        ...

    def run(self, param: SolverParameter, action: Action) -> Solver:
        """Train to max_iter; ``action`` reports signals. Returns the root's Solver."""
        ...


def leads() -> bool:
    """Whether this process leads its run: the only process, or rank 0 of several hosts."""
    return world_size() == 1 or rank() == 0


def choose_strategy(devices: Sequence[torch.device], options: TrainOptions) -> Strategy:
    """Several hosts when the launcher says so, else several devices, else one."""
    if options.graphs != "off" and any(d.type != "cuda" for d in devices):
        if options.graphs == "on":
            kinds = ", ".join(sorted({d.type for d in devices}))
            log.info(f"Note: --graphs on applies to CUDA devices only; training on {kinds} "
                     "without graphs")
        options = dataclasses.replace(options, graphs="off")
    if world_size() > 1:  # one process per host, started by torchrun (docs/parallel.md)
        return MultiHost(devices, options)
    if len(devices) > 1:
        return Replicated(devices, options)
    return SingleDevice(devices[0], options)


class SingleDevice:
    """One Solver on one device."""

    leads = True

    def __init__(self, device: torch.device, options: TrainOptions):
        self.device, self.options = device, options

    def run(self, param: SolverParameter, action: Action) -> Solver:
        from .solver.graph_loop import GraphedLoop
        from .solver.graphed_tests import GraphedTests
        from .solver.roles import AutoCompile, CompiledStep, StepFn, eager_step

        opts = self.options
        step: StepFn = CompiledStep() if opts.compile == "on" else eager_step
        runner = None
        if opts.graphs != "off":
            auto = opts.compile == "auto" and not opts.deterministic
            runner = GraphedLoop(required=opts.graphs == "on",
                                 auto_compile=AutoCompile() if auto else None)
        # on the CPU, the thread count follows other processes' load (cpu_threads.py)
        governor = governor_for(self.device, opts.deterministic)
        tests = GraphedTests() if opts.graphs != "off" else own_test_batches
        with Solver(param, device=self.device, action=action, step=step, runner=runner,
                    inputs=opts.inputs, test_inputs=opts.test_inputs, test_batches=tests,
                    callbacks=[governor] if governor else []) as solver:
            batch = solver.batch_size()
            log.info(f"Batch: {batch} per replica x 1 replica x iter_size {param.iter_size} = "
                     f"{batch * param.iter_size} per update (device {self.device}, precision "
                     f"{param.precision})")
            if opts.weights:
                solver.load_weights(opts.weights)
            try:
                solver.solve(opts.snapshot, opts.progress, opts.tensorboard)
            finally:
                if governor is not None:
                    governor.close()
            return solver


class Replicated:
    """One process, several devices: one replica each (caffe_py/parallel/replicated.py)."""

    leads = True

    def __init__(self, devices: Sequence[torch.device], options: TrainOptions):
        self.devices, self.options = list(devices), options

    def run(self, param: SolverParameter, action: Action) -> Solver:
        from .parallel.replicated import ReplicatedRun

        with ReplicatedRun(param, self.devices, self.options, action=action) as run:
            return run.run()


class MultiHost:
    """One host among several (``WORLD_SIZE > 1``): this host's replicas, joined to the other
    hosts through torch.distributed (caffe_py/parallel/multihost.py)."""

    def __init__(self, devices: Sequence[torch.device], options: TrainOptions):
        self.devices, self.options = list(devices), options

    @property
    def leads(self) -> bool:
        """Rank 0 tests, displays and snapshots."""
        return leads()

    def run(self, param: SolverParameter, action: Action) -> Solver:
        from .parallel.multihost import run_host

        return run_host(param, self.devices, self.options, action)
