"""Data-parallel training in one process: one Solver and one thread per device.

:class:`ReplicatedRun` is what the Replicated strategy (caffe_py/strategies.py) of ``cpy train
--gpus 0,1,2,3`` (or ``--gpus cpu:N``) runs.
Every replica builds the full TRAIN net on its device and reads its own share of each database
(a shared :class:`~caffe_py.io.ReaderPool`: replica i of N gets records i, i+N, ...), so each
device runs the net's batch size and the effective batch is batch x N, as in Caffe. Replica 0
is the root (role ROOT: it alone applies updates, runs the test nets, displays and snapshots);
the others are Caffe's WorkerSolvers (role WORKER, seeds random_seed + replica index; their
Data feeds all use random_seed itself, see :class:`~caffe_py.solver.roles.Seeds`). Weights and
gradients move through :mod:`.sync` (the tree) or :mod:`.nccl` (the ring), plugged in as
solver callbacks. With ``model_average_period: K`` every replica updates its own weights
(role UPDATING_WORKER) and :mod:`.averaging` averages the replicas' models through the tree
at the points of the :class:`~.schedule.Schedule`.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..devices import check_devices
from ..errors import SolverError
from ..options import TrainOptions
from ..solver.callbacks import Callback
from ..solver.graphed_tests import GraphedTests
from ..solver.graphs import GraphedStep
from ..solver.roles import HOST_ROOT, ROOT, UPDATING_WORKER, WORKER, Seeds, StepFn, eager_step
from ..solver.signals import no_action
from ..solver.solver import Solver, resolve_seed
from ..spec.solver_spec import SolverParameter
from .averaging import AveragingSync, Model
from .captured import AllReduceGroup, CapturedReplicas, SplitTests
from .flat import DEFAULT_BUCKET_BYTES
from .hostavg import HostExchange
from .lockstep import LockstepRoot
from .nccl import NcclSync, nccl_available
from .schedule import Actions, Schedule
from .sync import (
    DEFAULT_TIMEOUT_S,
    Failure,
    SyncGroup,
    TreeSync,
    replica_error,
    run_replicas,
)

if TYPE_CHECKING:
    from ..net import Net

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostSlice:
    """The replicas of this process within a larger run (several hosts, :mod:`.multihost`).

    This run holds global replicas ``offset`` .. of ``total`` (None: this run's own count);
    seeds and the reader's round-robin are global, the tree's root leaves the sum unscaled
    (the hosts' roots sum and scale it next), and with ``lead`` False the root neither tests,
    displays nor snapshots (role HOST_ROOT)."""

    offset: int = 0
    total: int | None = None
    lead: bool = True


@dataclass(frozen=True)
class Tuning:
    """Settings tests and benchmarks change; the defaults are what ``cpy train`` runs.

    ``overlap=False`` reduces only after backward, as the solver's ``layer_wise_reduce:
    false`` does (the tree: no Python hooks in backward's thread; captured iterations: the
    whole gradient in one all-reduce); ``lockstep`` has the root's thread issue every
    replica's iteration (:mod:`.lockstep`; None: on with CUDA graphs on GPUs, tree reduction
    only); ``extra_callbacks(i)`` gives replica i more callbacks after the sync one
    (benchmarks time and profile steps with it);
    ``layer_waits=False`` makes a replica's forward wait for all of its weights at on_start
    instead of layer by layer (:mod:`.pull`; always so with CUDA graphs, which run no hooks);
    ``average_history=False`` keeps each replica's update history out of model averaging (the
    variant measured against averaging it, docs/parallel.md; a resume then restarts every
    replica from the root's history); ``bucket_bytes`` is the size the flat buffers are cut
    into buckets at (the units weights travel and are waited for in); ``captured`` has the
    root's thread replay every replica's whole iterations as CUDA graphs (:mod:`.captured`;
    None: so on GPUs of one host with graphs, reduction auto or nccl and no model averaging;
    True on CPU replicas runs that sequence unrecorded, as the tests do); ``split_tests``
    spreads the captured runs' test passes over the replicas, each computing the batches its
    feed reads, always (True), never (False: the root tests alone, reading every batch), or
    where a pass measured so is the shorter (None; :class:`~.captured.SplitTests`);
    ``graphed_tests`` replays the root's test passes in chunks of batches as CUDA graphs
    (solver/graphed_tests.py; None: so on GPUs with graphs on; True on CPU replicas runs the
    same chunks unrecorded, as the tests do)."""

    timeout: float = DEFAULT_TIMEOUT_S
    overlap: bool = True
    lockstep: bool | None = None
    extra_callbacks: Callable[[int], Sequence[Callback]] | None = None
    layer_waits: bool = True
    average_history: bool = True
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    captured: bool | None = None
    split_tests: bool | None = None
    graphed_tests: bool | None = None


class ReplicatedRun:
    """N Solvers (one per device) wired to one sync group and one reader pool.

    Build it, then :meth:`run`; :meth:`close` stops the readers (also done by ``with``). The
    solver's ``memory_format`` field lays out each net before its weights move into the flat
    buffers; ``options.graphs`` (on GPUs) runs each replica's forward/backward as one CUDA graph
    replay (:class:`~caffe_py.solver.graphs.GraphedStep`); ``action`` is the root's signal
    source.
    """

    def __init__(self, param: SolverParameter, devices: Sequence[torch.device | str | int],
                 options: TrainOptions | None = None, *, action: Callable[[], str] | None = None,
                 hosts: HostSlice = HostSlice(), tuning: Tuning = Tuning()):
        from ..io import ReaderPool

        self.options = options or TrainOptions()
        self.devices = check_devices(devices)
        self.param = param
        self.hosts, self.tuning = hosts, tuning
        n = len(self.devices)
        self.total_replicas = n if hosts.total is None else hosts.total
        self.schedule = Schedule.of(param, hosts=self.total_replicas // n)
        local = self.schedule.averages_replicas
        if local and self.options.reduction == "nccl":
            raise SolverError("model_average_period averages the replicas through the tree; "
                              "use --reduction tree (or model_average_period: 0 with nccl)")
        cuda = all(d.type == "cuda" for d in self.devices)
        graphs = self.options.graphs != "off" and cuda
        self.graphed_tests = graphs if tuning.graphed_tests is None else tuning.graphed_tests
        """The root's test passes as CUDA graph replays (solver/graphed_tests.py)."""
        self.emulated_tests = self.graphed_tests and not cuda
        """... run unrecorded on CPU replicas (the tests' stand-in)."""
        captured = tuning.captured
        if captured is None:
            captured = graphs and self.options.reduction != "tree" and nccl_available()
        self.captured = bool(captured) and not local and hosts.total is None
        """Every replica's whole iterations replayed from the root's thread (.captured)."""
        # a graph replay runs no hooks: with graphs the tree reduces after backward; the root
        # divides the sum by N unless the hosts' roots sum theirs next
        overlap = tuning.overlap and param.layer_wise_reduce
        self.sync: SyncGroup = (AllReduceGroup(self.devices, timeout=tuning.timeout,
                                               bucket_bytes=tuning.bucket_bytes,
                                               overlap=overlap)
                                if self.captured
                                else NcclSync(self.devices, timeout=tuning.timeout,
                                              bucket_bytes=tuning.bucket_bytes)
                                if self.options.reduction == "nccl"
                                else TreeSync(self.devices, timeout=tuning.timeout,
                                              bucket_bytes=tuning.bucket_bytes,
                                              overlap=overlap and not graphs,
                                              gradients=not local,
                                              root_scale=(hosts.total is None
                                                          or self.schedule.averages_hosts)))
        self.actions: Actions | None = None
        self.averaging: AveragingSync | None = None
        if local or self.schedule.averages_hosts:
            self.actions = Actions(action or no_action, rank=0 if hosts.lead else 1)
            action = self.actions
            self.averaging = AveragingSync(self.sync, self.schedule, self.actions,
                                           average_history=tuning.average_history)
        # with graphs on GPUs one thread issues every replica's step (see .lockstep)
        lockstep = tuning.lockstep
        if lockstep is None:
            lockstep = graphs and all(d.type == "cuda" for d in self.devices)
        self.lockstep = bool(lockstep) and isinstance(self.sync, TreeSync)
        self.pool = ReaderPool(replicas=n, replica_offset=hosts.offset,
                               total_replicas=self.total_replicas)
        self.solvers: list[Solver] = []
        self.graphs: list[GraphedStep] = []
        self.split_tests: SplitTests | None = None
        """The captured runs' test passes (their replicas' TEST nets attached once all
        replicas are made)."""
        base_seed = resolve_seed(param.random_seed)
        try:
            for i in range(n):
                step: StepFn = eager_step
                if graphs and not self.captured:
                    self.graphs.append(GraphedStep(required=self.options.graphs == "on"))
                    step = self.graphs[-1]
                self._add_replica(i, base_seed, step, action if i == 0 else None)
            self.sync.check_shapes()
            if self.split_tests is not None:
                self.split_tests.attach()
        except BaseException:
            self.close()
            raise

    def _add_replica(self, i: int, base_seed: int, step: StepFn,
                     action: Callable[[], str] | None) -> None:
        """Replica i's Solver on its device, its params moved into flat buffers."""
        updating = self.schedule.averages_replicas or self.captured
        role = (UPDATING_WORKER if updating else WORKER) if i else (
            ROOT if self.hosts.lead else HOST_ROOT)
        extra = list(self.tuning.extra_callbacks(i)) if self.tuning.extra_callbacks else []
        kw: dict[str, Any] = {"action": action} if action else {}
        if self.captured and i == 0:
            assert isinstance(self.sync, AllReduceGroup)
            kw["runner"] = CapturedReplicas(self.sync, self.solvers,
                                            required=self.options.graphs == "on")
            self.split_tests = SplitTests(self.sync, self.solvers, graphed=self.graphed_tests,
                                          emulate=self.emulated_tests,
                                          split=self.tuning.split_tests)
            kw["test_batches"] = self.split_tests
            if self.tuning.split_tests is not False:
                kw["test_replicas"] = len(self.devices)
        elif self.graphed_tests and i == 0:
            kw["test_batches"] = GraphedTests(emulate=self.emulated_tests)
        try:
            solver = Solver(self.param, device=self.devices[i], replica=i, role=role,
                            seeds=Seeds(model=base_seed + self.hosts.offset + i, data=base_seed),
                            pool=self.pool, callbacks=[*self._sync_callbacks(i), *extra],
                            step=step, inputs=self.options.inputs,
                            test_inputs=self.options.test_inputs if i == 0 else None, **kw)
            self.solvers.append(solver)
            # sources that read by themselves: replica i's share of the one global order
            solver.net.bind_sources(base_seed, self.hosts.offset + i,
                                    self.hosts.total or len(self.devices))
            scale = solver.loss_scale.tensors() if solver.loss_scale is not None else []
            self.sync.setup(i, [lp.param for lp in solver.net.learnable_params()],
                            [*state_blobs(solver.net), *scale])   # the root's flows down
            solver.grads_in_place = True   # views into the flat gradient buffer
            if isinstance(self.sync, AllReduceGroup):
                self.sync.hand_mean(i, solver)
            # a sync's gradient hooks keep the engine's threads; captured iterations have none
            solver.backward_in_caller = self.captured
            if isinstance(self.sync, TreeSync) and self.tuning.layer_waits and not self.graphs:
                self.sync.watch_layers(i, solver.net)
            if self.averaging is not None and (self.schedule.averages_replicas or i == 0):
                model = self.averaging.setup(i, solver.updater.history)
                if i == 0 and self.schedule.averages_hosts:
                    self.averaging.exchange = self._host_exchange(model)
        except torch.cuda.OutOfMemoryError as exc:
            raise replica_error(Failure(i, self.devices[i], exc)) from None

    def _sync_callbacks(self, i: int) -> list[Callback]:
        """Replica i's sync callbacks: the tree's (or ring's), or model averaging's; the root
        of a run where only the hosts average also hands its model to the hosts' exchange."""
        if self.captured:   # the sum happens inside the captured iterations
            return []
        averaging = self.averaging
        inner: Callback
        if averaging is not None and self.schedule.averages_replicas:
            inner = averaging.callback(i)
        else:
            inner = self.sync.callback(i)
        if self.lockstep and i == 0:
            assert isinstance(self.sync, TreeSync)
            inner = LockstepRoot(self.sync, self.solvers, inner)
        if averaging is not None and not self.schedule.averages_replicas and i == 0:
            return [inner, averaging.callback(0)]
        return [inner]

    def _host_exchange(self, model: Model) -> HostExchange | None:
        """The hosts' exchange of the root's model (several hosts: :mod:`.multihost`)."""
        return None

    @property
    def reduction(self) -> str:
        """The reduction the run uses (the ``auto`` option resolved)."""
        if isinstance(self.sync, AllReduceGroup):
            return "all-reduce, captured"
        return "nccl" if isinstance(self.sync, NcclSync) else "tree"

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
                 f"devices {', '.join(names)}; reduction {self.reduction}; precision "
                 f"{p.precision})"]
        if isinstance(self.sync, TreeSync):
            on_gpus = any(d.type == "cuda" for d in self.devices)
            lines += self.sync.tree.describe(names, links=on_gpus).splitlines()
        elif isinstance(self.sync, AllReduceGroup):
            lines.append(f"whole iterations captured on every replica ({', '.join(names)}), "
                         f"issued by one thread; {self.sync.describe()}; every replica "
                         "applies the update")
        else:
            lines.append(f"NCCL ring all-reduce over {', '.join(names)}; root {names[0]}")
        if self.schedule.averages_replicas:
            history = "history" if self.tuning.average_history else "history kept per replica"
            lines.append(f"model averaging: each replica updates on its own records; weights, "
                         f"state blobs and {history} averaged through the tree every "
                         f"{self.schedule.local} iterations and at every test, snapshot "
                         "and the end")
        return lines

    def prepare(self) -> None:
        """Fine-tune weights or resume on the root, then start the readers."""
        opts = self.options
        if opts.weights:
            self.root.load_weights(opts.weights)
        if opts.snapshot:
            self.root.restore(opts.snapshot)
            sources = self.root.net.source_states()  # every replica read as many records
            for worker in self.solvers[1:]:
                worker.iter, worker.current_step = self.root.iter, self.root.current_step
                worker.net.load_source_states(sources)
        self.share_root_model()
        if self.averaging is not None and self.schedule.averages_replicas:
            self.averaging.spread()
        if isinstance(self.sync, AllReduceGroup):   # each replica updates its own copy
            self.sync.spread_root(self.solvers)
        self.pool.start()
        for solver in self.solvers:
            solver.start()

    def share_root_model(self) -> None:
        """After the root's --weights or --snapshot, before the replicas start: one host has
        nothing to share (several hosts: rank 0's model goes to every root)."""

    def run(self) -> Solver:
        """Train every replica to max_iter; the root snapshots. Returns the root's Solver."""
        for line in self.banner():
            log.info(line)
        self.prepare()

        def steps(s: Solver) -> Callable[[], None]:
            return lambda: s.step(self.param.max_iter - s.iter)

        def solve() -> None:
            self.root.solve(progress=self.options.progress,
                            tensorboard=self.options.tensorboard)

        targets = ([solve] if self.hosts.lead else [steps(self.root)]) + [
            steps(s) for s in self.solvers[1:]]
        one_thread = self.lockstep or self.captured
        run_replicas(self.sync, targets[:1] if one_thread else targets)
        return self.root

    def close(self) -> None:
        for solver in self.solvers:
            solver.close()
        self.pool.close()

    def __enter__(self) -> ReplicatedRun:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def state_blobs(net: Net) -> list[torch.Tensor]:
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
