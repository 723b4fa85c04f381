"""The run layer: ``train(param, devices, options)``, what ``cpy train`` calls (Caffe's
tools/caffe.cpp ``train()``).

It checks what can be checked before anything is built, once for every kind of run (weights
vs snapshot, the start files, the precision override, the seed, a writable snapshot prefix),
then picks a strategy and runs it under the signal handler:

* :class:`SingleDevice`: one Solver on one device (eager, or its step as a CUDA graph);
* :class:`~caffe_py.parallel.replicated.Replicated`: one Solver and one thread per device of
  this process, synchronised by the tree (or NCCL ring) through the Solver's callbacks;
* :class:`~caffe_py.parallel.multihost.MultiHost`: the same on every host (one process each,
  ``WORLD_SIZE > 1``), the hosts' roots joined through torch.distributed.

Each strategy returns the root's Solver when training ends.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from .devices import check_devices, prepare_host
from .errors import SolverError
from .fileio import is_file, remove_stale_temporaries
from .options import TrainOptions
from .solver import snapshot as snap
from .solver.signals import SignalHandler
from .solver.solver import Solver, resolve_seed
from .spec.solver_spec import SolverParameter

log = logging.getLogger(__name__)

Action = Callable[[], str]


class Strategy(Protocol):
    """How a run uses its devices; built by :func:`choose_strategy`."""

    @property
    def leads(self) -> bool:
        """Whether this process tests, displays and snapshots (checks the snapshot prefix)."""
        ...

    def run(self, param: SolverParameter, action: Action) -> Solver:
        """Train to max_iter; ``action`` reports signals. Returns the root's Solver."""
        ...


def train(param: SolverParameter, devices: Sequence[torch.device | str | int],
          options: TrainOptions | None = None) -> Solver:
    """Train ``param``'s net on ``devices``: checks, then the chosen strategy's run."""
    options = options or TrainOptions()
    check_start_files(options)
    param = prepared(param, options)
    if options.deterministic:
        make_deterministic()
    devices = check_devices(devices)
    prepare_host(devices)
    strategy = choose_strategy(devices, options)
    if strategy.leads:
        snap.check_writable(param.snapshot_prefix)
        for stale in remove_stale_temporaries(f"{param.snapshot_prefix}_iter_"):
            log.info(f"Removed {stale.name}, left by an interrupted snapshot")
    with SignalHandler(options.sigint_effect, options.sighup_effect,
                       options.sigterm_effect) as signals:
        return strategy.run(param, signals.requested_action)


def check_start_files(options: TrainOptions) -> None:
    """--weights must name weights and --snapshot a solver state, both existing files, and
    not both at once."""
    if options.weights and options.snapshot:
        raise SolverError("--weights and --snapshot are both given; --weights starts a new run "
                          "from those weights, --snapshot resumes one: give only one")
    for path in options.weights:
        if snap.is_state_path(path):
            raise SolverError(f"{path} is a solver state, not weights; pass it to --snapshot "
                              "to resume training")
    if options.snapshot and not snap.is_state_path(options.snapshot):
        raise SolverError(f"{options.snapshot} is not a solver state (its name has no "
                          "'.solverstate'); pass weights to --weights, or give the "
                          "<prefix>_iter_<N>.solverstate.pt file to --snapshot")
    for path in [*options.weights, *([options.snapshot] if options.snapshot else [])]:
        if not is_file(path):
            raise SolverError(f"{path}: file not found; check the path")


def make_deterministic() -> None:
    """Deterministic cuDNN algorithms (no benchmark search) and PyTorch kernels; an op that has
    none warns once instead of failing."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)


def prepared(param: SolverParameter, options: TrainOptions) -> SolverParameter:
    """The solver as the run uses it: the precision override applied, and a seed drawn from
    the clock (random_seed -1) fixed once for every replica."""
    precision = options.precision or param.precision
    return dataclasses.replace(param, random_seed=resolve_seed(param.random_seed),
                               precision=precision)


def choose_strategy(devices: list[torch.device], options: TrainOptions) -> Strategy:
    """Several hosts when the launcher says so, else several devices, else one."""
    from .parallel.multihost import world_size

    if options.graphs != "off" and any(d.type != "cuda" for d in devices):
        if options.graphs == "on":
            kinds = ", ".join(sorted({d.type for d in devices}))
            log.info(f"Note: --graphs on applies to CUDA devices only; training on {kinds} "
                     "without graphs")
        options = dataclasses.replace(options, graphs="off")
    if world_size() > 1:  # one process per host, started by torchrun (docs/parallel.md)
        from .parallel.multihost import MultiHost

        return MultiHost(devices, options)
    if len(devices) > 1:
        from .parallel.replicated import Replicated

        return Replicated(devices, options)
    return SingleDevice(devices[0], options)


class SingleDevice:
    """One Solver on one device: Caffe's single-GPU ``caffe train``."""

    leads = True

    def __init__(self, device: torch.device, options: TrainOptions):
        self.device, self.options = device, options

    def run(self, param: SolverParameter, action: Action) -> Solver:
        from .solver.graph_loop import GraphedLoop

        opts = self.options
        with Solver(param, device=self.device, action=action) as solver:
            from .solver.roles import AutoCompile, CompiledStep

            if opts.compile == "on":
                solver.step_fn = CompiledStep(solver.net)
            if opts.graphs != "off":
                auto = opts.compile == "auto" and not opts.deterministic
                solver.runner = GraphedLoop(required=opts.graphs == "on",
                                            auto_compile=AutoCompile() if auto else None)
            batch = solver.batch_size()
            log.info(f"Batch: {batch} per replica x 1 replica x iter_size {param.iter_size} = "
                     f"{batch * param.iter_size} per update (device {self.device}, precision "
                     f"{param.precision})")
            if opts.weights:
                solver.load_weights(opts.weights)
            solver.solve(opts.snapshot, opts.progress, opts.tensorboard)
            return solver
