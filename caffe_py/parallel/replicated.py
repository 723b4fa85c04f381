"""Data-parallel training in one process: one Solver and one thread per device.

``train_replicated(param, devices, options)`` is what ``cpy train --gpus 0,1,2,3`` (or
``--gpus cpu:N``) calls. Every replica builds the full TRAIN net on its device and reads its own
share of each database (a shared :class:`~caffe_py.io.ReaderPool`: replica i of N gets records
i, i+N, ...), so each device runs the net's batch size and the effective batch is batch x N, as
in Caffe. Replica 0 is the root: it alone applies updates, runs the test nets, displays and
snapshots; the others are Caffe's WorkerSolvers (``applies_updates`` False, seeds
random_seed + replica index; their Data feeds all use random_seed itself, see
:meth:`ReplicatedRun._add_replica`). Weights and gradients move through :mod:`.sync` (the tree) or
:mod:`.nccl` (the ring), plugged in as solver callbacks.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..devices import DeviceError
from ..errors import SolverError
from ..solver import snapshot as snap
from ..solver.signals import SignalHandler
from ..solver.solver import Solver, TrainOptions, check_start_files, resolve_seed, stdout_log
from ..spec.solver_spec import SolverParameter
from .graphs import use_cuda_graphs
from .lockstep import LockstepRoot
from .nccl import NcclSync
from .sync import (
    DEFAULT_TIMEOUT_S,
    Failure,
    SyncGroup,
    TreeSync,
    replica_error,
    run_replicas,
)

REDUCTIONS = ("tree", "nccl")
Log = Callable[[str], None]


def check_devices(devices: Sequence[torch.device | str | int]) -> list[torch.device]:
    """Devices as torch.device, each CUDA id existing and listed once (for library callers;
    ``cpy train`` has checked its ``--gpus`` with :func:`caffe_py.devices.parse_devices`)."""
    out = [torch.device("cuda", d) if isinstance(d, int) else torch.device(d) for d in devices]
    if not out:
        raise DeviceError("no device to train on; give --gpus ids, 'all' or cpu:N")
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    seen: set[int] = set()
    for d in out:
        if d.type != "cuda":
            continue
        index = 0 if d.index is None else d.index
        if index >= available:
            have = f"{available} GPU(s) (ids 0-{available - 1})" if available else "no GPU"
            raise DeviceError(f"GPU {index} does not exist: this machine has {have}; pass "
                              "--gpus with existing ids, 'all', or cpu:N")
        if index in seen:
            raise DeviceError(f"GPU {index} is listed twice in --gpus; list each GPU once")
        seen.add(index)
    kinds = {d.type for d in out}
    if len(kinds) > 1:
        raise DeviceError("--gpus mixes CPU and GPU replicas; use one kind")
    return [torch.device("cuda", d.index or 0) if d.type == "cuda" else d for d in out]


class ReplicatedRun:
    """N Solvers (one per device) wired to one sync group and one reader pool.

    Build it, then :meth:`run`; :meth:`close` stops the readers (also done by ``with``).
    ``extra_callbacks(i)`` gives replica i more callbacks after the sync one (benchmarks time
    and profile steps with it); the solver's ``memory_format`` field lays out each net before
    its weights move into the flat buffers; ``cuda_graphs`` runs each replica's
    forward/backward as one CUDA graph replay (:mod:`.graphs`; default: the options'
    ``cuda_graphs`` field when it has one, else off); ``overlap=False`` makes the tree reduce
    only after backward (no Python hooks in backward's thread); ``lockstep`` has the root's
    thread issue every replica's iteration (:mod:`.lockstep`; default: on with CUDA graphs on
    GPUs, tree reduction only).

    Several hosts (:mod:`.multihost`): this run holds global replicas ``replica_offset`` ..
    of ``total_replicas``; seeds and the reader's round-robin are global, the tree's root
    leaves the sum unscaled (the hosts' roots sum and scale it next), and with ``lead``
    False the root neither tests, displays nor snapshots: it steps like a worker.
    """

    def __init__(self, param: SolverParameter, devices: Sequence[torch.device | str | int],
                 options: TrainOptions | None = None, *, log: Log = stdout_log,
                 action: Callable[[], str] | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 extra_callbacks: Callable[[int], Sequence[Any]] | None = None,
                 cuda_graphs: bool | None = None, overlap: bool = True,
                 lockstep: bool | None = None, replica_offset: int = 0,
                 total_replicas: int | None = None, lead: bool = True):
        from ..io import ReaderPool

        self.options = options or TrainOptions()
        if self.options.reduction not in REDUCTIONS:
            raise SolverError(f"reduction '{self.options.reduction}' is not one of "
                              f"{', '.join(REDUCTIONS)}")
        self.devices = check_devices(devices)
        self.param = param
        self.log = log
        n = len(self.devices)
        self.replica_offset, self.lead = replica_offset, lead
        self.total_replicas = n if total_replicas is None else total_replicas
        base_seed = resolve_seed(param.random_seed)
        if cuda_graphs is None:
            cuda_graphs = bool(getattr(self.options, "cuda_graphs", False))
        # a graph replay runs no hooks: with graphs the tree reduces after backward
        self.sync: SyncGroup = (NcclSync(self.devices, timeout=timeout)
                                if self.options.reduction == "nccl"
                                else TreeSync(self.devices, timeout=timeout,
                                              overlap=overlap and not cuda_graphs,
                                              root_scale=total_replicas is None))
        # with graphs on GPUs one thread issues every replica's step (see .lockstep)
        if lockstep is None:
            lockstep = cuda_graphs and all(d.type == "cuda" for d in self.devices)
        self.lockstep = bool(lockstep) and isinstance(self.sync, TreeSync)
        self.pool = ReaderPool(replicas=n, replica_offset=replica_offset,
                               total_replicas=self.total_replicas)
        self.solvers: list[Solver] = []
        try:
            for i in range(n):
                extra = list(extra_callbacks(i)) if extra_callbacks else []
                self._add_replica(i, base_seed, extra, action if i == 0 else None)
            self.sync.check_shapes()
            self.graphs = [use_cuda_graphs(s, log) for s in self.solvers] if cuda_graphs else []
        except BaseException:
            self.close()
            raise

    def _add_replica(self, i: int, base_seed: int, extra: list[Any],
                     action: Callable[[], str] | None) -> None:
        """Replica i's Solver on its device, its params moved into flat buffers.

        The Solver (its fillers, Dropout: Caffe's worker seeds) gets ``base_seed + i``; its
        Data feeds get ``base_seed`` itself, since crop/mirror choices are a function of
        (seed, record position) and N replicas must draw what one replica with N x the batch
        draws for the same records."""
        kw: dict[str, Any] = {"action": action} if action else {}
        if i == 0 and not self.lead:  # another host's root: a worker that also updates
            kw.update(test_nets=False, verbose=False)
        try:
            solver = Solver(self.param, device=self.devices[i], replica=i,
                            seed=base_seed + self.replica_offset + i,
                            pool=self.pool, data_seed=base_seed,
                            callbacks=[self._sync_callback(i), *extra],
                            log=self.log, precision=self.options.precision, **kw)
            self.solvers.append(solver)
            solver.applies_updates = i == 0
            self.sync.setup(i, [lp.param for lp in solver.net.learnable_params()],
                            state_blobs(solver.net))
        except torch.cuda.OutOfMemoryError as exc:
            raise replica_error(Failure(i, self.devices[i], exc)) from None

    def _sync_callback(self, i: int) -> Any:
        if self.lockstep and i == 0:
            assert isinstance(self.sync, TreeSync)
            return LockstepRoot(self.sync, self.solvers)
        return self.sync.callback(i)

    @property
    def root(self) -> Solver:
        return self.solvers[0]

    def banner(self) -> list[str]:
        """The start-of-run lines: per-replica and effective batch, then the tree."""
        p, n = self.param, len(self.devices)
        batch = self.root.batch_size()
        names = [_name(d, i) for i, d in enumerate(self.devices)]
        lines = [f"Batch: {batch} per replica x {n} replicas x iter_size {p.iter_size} = "
                 f"{batch * n * p.iter_size} per update (effective batch {batch * n}; "
                 f"devices {', '.join(names)}; reduction {self.options.reduction}; precision "
                 f"{self.root.precision})"]
        if isinstance(self.sync, TreeSync):
            on_gpus = any(d.type == "cuda" for d in self.devices)
            lines += self.sync.tree.describe(names, links=on_gpus).splitlines()
        else:
            lines.append(f"NCCL ring all-reduce over {', '.join(names)}; root {names[0]}")
        return lines

    def prepare(self) -> None:
        """Fine-tune weights or resume on the root, then start the readers."""
        opts = self.options
        if opts.weights:
            self.root.load_weights(opts.weights)
        if opts.snapshot:
            self.root.restore(opts.snapshot)
            for worker in self.solvers[1:]:
                worker.iter, worker.current_step = self.root.iter, self.root.current_step
        self.pool.start()
        for solver in self.solvers:
            solver.start()

    def run(self) -> Solver:
        """Train every replica to max_iter; the root snapshots. Returns the root's Solver."""
        for line in self.banner():
            self.log(line)
        self.prepare()
        def steps(s: Solver) -> Callable[[], None]:
            return lambda: s.step(self.param.max_iter - s.iter)

        targets = ([self.root.solve] if self.lead else [steps(self.root)]) + [
            steps(s) for s in self.solvers[1:]]
        run_replicas(self.sync, targets[:1] if self.lockstep else targets)
        return self.root

    def close(self) -> None:
        for solver in self.solvers:
            solver.close()
        self.pool.close()

    def __enter__(self) -> ReplicatedRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def train_replicated(param: SolverParameter, devices: Sequence[torch.device | str | int],
                     options: TrainOptions | None = None, *, log: Log = stdout_log) -> Solver:
    """``cpy train`` on several devices; the root's Solver is returned when training ends."""
    options = options or TrainOptions()
    if options.weights and options.snapshot:
        raise SolverError("--weights and --snapshot are both given; --weights starts a new run "
                          "from those weights, --snapshot resumes one: give only one")
    if options.precision:
        param = copy.copy(param)
        param.precision = options.precision
    snap.check_writable(param.snapshot_prefix)
    with SignalHandler(options.sigint_effect, options.sighup_effect) as signals, \
            ReplicatedRun(param, devices, options, log=log,
                          action=signals.requested_action) as run:
        return run.run()


def train_with_graphs(param: SolverParameter, devices: Sequence[torch.device],
                      options: TrainOptions, *, log: Log = stdout_log) -> Solver | None:
    """``cpy train --cuda-graphs``. GPUs train through :class:`ReplicatedRun` (one replica on
    one GPU: the same Solver loop, its forward/backward captured); on CPU, where there is
    nothing to capture, the flag is ignored with a note and the usual path runs."""
    from ..solver.solver import train

    if any(d.type != "cuda" for d in devices):
        log("Note: --cuda-graphs applies to CUDA devices only; training on "
            f"{', '.join(sorted({d.type for d in devices}))} without graphs")
        return train(param, devices, dataclasses.replace(options, cuda_graphs=False), log=log)
    if len(devices) > 1:
        return train(param, devices, options, log=log)
    check_start_files(options)
    return train_replicated(param, devices, options, log=log)


def state_blobs(net: Any) -> list[torch.Tensor]:
    """Blobs that are not learnable but travel with the weights (BatchNorm's running sums).

    Only floating blobs of the learnable dtype go into the flat state buffer; shared blobs
    are listed once.
    """
    learnable = {id(lp.param) for lp in net.learnable_params()}
    dtypes = {lp.param.dtype for lp in net.learnable_params()} or {torch.float32}
    seen: set[int] = set()
    out = []
    for blobs in net.layer_blobs().values():
        for t in blobs:
            if id(t) in learnable or id(t) in seen or isinstance(t, torch.nn.Parameter):
                continue
            if t.dtype in dtypes and t.is_floating_point():
                seen.add(id(t))
                out.append(t)
    return out


def _name(device: torch.device, i: int) -> str:
    return f"cpu#{i}" if device.type == "cpu" else str(device)
