"""Data parallelism across hosts: the tree inside each host, torch.distributed between hosts.

Each host runs one process (``torchrun --nnodes H --nproc_per_node 1 ... cpy train --gpus
0,1,2,3``, or any launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) with the same
number N of local replicas, as mshadow-ps does it: fast links inside a host, the network
between hosts. Global replica ``rank * N + i`` is local replica i of process ``rank``; there
are G = H x N in all.

* **Data.** Each process's :class:`~caffe_py.io.ReaderPool` reads the whole database and keeps
  its own replicas' records (global replica g gets records g, g+G, ...; the others are read
  and skipped), so the G replicas read exactly what one process with G replicas would.
* **Seeds.** A replica's own RNG gets ``random_seed + g``; every Data feed the run's seed
  (rank 0's, when ``random_seed`` is -1). Rank 0's weights, state blobs and update history
  are broadcast to every root once, after any ``--weights`` / ``--snapshot``.
* **Gradients.** The local tree sums into the local root, unscaled; the roots all-reduce the
  flat gradient buffer (SUM, one collective), scale by 1/G and each apply the same Caffe
  update to the same weights, so every root holds identical weights without a weight
  broadcast; the weights then flow down each local tree as in one process.
* **Or models.** With ``host_average_period: K`` (or ``model_average_period`` > 0) the hosts
  exchange models, not gradients: every root updates on its own host's gradient (or its
  replicas average, :mod:`.averaging`), and at the host points of the
  :class:`~.schedule.Schedule` the roots average their models through :mod:`.hostavg`,
  synchronously or, with ``host_average_async``, overlapped with the next K iterations and
  folded in one period late; the signal codes ride in that exchange.
* **Stopping.** Only rank 0 tests, displays and snapshots. Every root polls its signal
  handler at the start of each iteration and the roots all-reduce (MAX) that one small code
  on the CPU (gloo) asynchronously, waiting for it only at the iteration's end, where Caffe
  acts on signals: no GPU sync and no extra round trip on the critical path. So a Ctrl-C on
  any host stops every host after the same iteration, and max_iter ends them together.
* **Failures.** Every collective is bounded by the process group's timeout (``--dist-timeout``);
  a process that fails exits, which breaks its peers' connections, so they fail at their next
  collective. Every error names the rank.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ..devices import world_size
from ..errors import CaffePyError, SolverError
from ..options import DEFAULT_DIST_TIMEOUT_S, TrainOptions
from ..solver.signals import NONE, SNAPSHOT, STOP, collective
from ..solver.solver import Solver
from ..spec.solver_spec import SolverParameter
from .averaging import Model
from .hostavg import DistCollective, HostExchange
from .replicated import HostSlice, ReplicatedRun, Tuning
from .schedule import Schedule

log = logging.getLogger(__name__)
_CODES = {NONE: 0, SNAPSHOT: 1, STOP: 2}
_ACTIONS = {v: k for k, v in _CODES.items()}


@dataclass
class Hosts:
    """This process's place in the world and the process groups it talks through."""

    rank: int
    world: int
    local: int
    """Replicas of every process (checked equal)."""
    backend: str
    timeout: float
    flags: Any = None
    """A gloo group for the per-iteration stop flag (None: the default group is gloo)."""

    @property
    def total(self) -> int:
        return self.world * self.local

    @property
    def offset(self) -> int:
        return self.rank * self.local

    def fail(self, what: str, exc: BaseException) -> SolverError:
        """A collective's failure as one line naming this rank."""
        return SolverError(f"rank {self.rank} of {self.world}: {what} failed ({type(exc).__name__}"
                           f": {str(exc).splitlines()[0] if str(exc) else ''}); another rank "
                           "failed, stopped or timed out: see its log")


def init_hosts(devices: Sequence[torch.device], backend: str | None,
               timeout: float = DEFAULT_DIST_TIMEOUT_S) -> Hosts:
    """torch.distributed from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; checks the counts."""
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise SolverError(f"WORLD_SIZE is {world_size()} but {', '.join(missing)} is not set; "
                          "start every host with torchrun (or set RANK, WORLD_SIZE, "
                          "MASTER_ADDR, MASTER_PORT)")
    on_cuda = devices[0].type == "cuda"
    backend = backend or ("nccl" if on_cuda else "gloo")
    if backend == "nccl" and not on_cuda:
        raise SolverError("--dist-backend nccl needs CUDA replicas; use gloo on CPU")
    if on_cuda:
        torch.cuda.set_device(devices[0])
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    except Exception as exc:  # noqa: BLE001 - no traceback for a host that never came
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise SolverError(
            f"rank {os.environ['RANK']} of {world_size()}: could not meet the other hosts at "
            f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']} within {timeout:g} s "
            f"({type(exc).__name__}: {first}); start every host, with the same MASTER_ADDR "
            "and MASTER_PORT") from None
    hosts = Hosts(dist.get_rank(), dist.get_world_size(), len(devices), backend, timeout)
    try:
        if backend != "gloo":
            hosts.flags = dist.new_group(backend="gloo")
        counts: list[Any] = [None] * hosts.world
        dist.all_gather_object(counts, len(devices), group=hosts.flags)
    except CaffePyError:
        raise
    except Exception as exc:  # noqa: BLE001 - the peers' failure, as one line
        raise hosts.fail("meeting the other hosts", exc) from None
    if len(set(counts)) != 1:
        listed = ", ".join(f"rank {r} has {c}" for r, c in enumerate(counts))
        raise SolverError(f"every host must run the same number of replicas: {listed}; give "
                          "each host's --gpus the same count")
    return hosts


class HostSync:
    """The root's callback between hosts (after the local tree's), and its action source.

    ``on_start`` polls this host's signals and starts the flag all-reduce; ``on_gradient_ready``
    all-reduces the root's flat gradient and scales it; :meth:`action` (the root Solver's
    ``action``) waits for the flags and returns what every root does after this iteration.
    """

    def __init__(self, hosts: Hosts, run_sync: Any, local_action: Callable[[], str],
                 scale: float):
        self.hosts, self.run_sync, self.local_action = hosts, run_sync, local_action
        self.scale = scale
        self._flag = torch.zeros(1, dtype=torch.int32)
        self._work: Any = None
        self._deferred = NONE
        self.iteration = 0

    def on_start(self, solver: Solver | None = None) -> None:
        code = max(_CODES[self._deferred], _CODES[self._poll()])
        self._deferred = NONE
        self._flag.fill_(code)
        try:
            self._work = dist.all_reduce(self._flag, op=dist.ReduceOp.MAX,
                                         group=self.hosts.flags, async_op=True)
        except Exception as exc:  # noqa: BLE001
            raise self.hosts.fail(f"the stop flag of iteration {self.iteration}", exc) from None

    def on_gradient_ready(self, solver: Solver | None = None) -> None:
        grad = self.run_sync.replica(0).flat.grad
        try:
            dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        except Exception as exc:  # noqa: BLE001
            raise self.hosts.fail(f"the gradient all-reduce of iteration {self.iteration}",
                                  exc) from None
        grad.mul_(self.scale)

    def action(self) -> str:
        """Inside an iteration: the agreed action. Between iterations (rank 0's test phase): a
        snapshot is taken now, a stop waits for the next iteration's flags."""
        if self._work is None:
            request = self._poll()
            if request == STOP:
                self._deferred = STOP
                return NONE
            return request
        try:
            self._work.wait()
        except Exception as exc:  # noqa: BLE001
            raise self.hosts.fail(f"the stop flag of iteration {self.iteration}", exc) from None
        finally:
            self._work = None
        self.iteration += 1
        agreed = _ACTIONS[int(self._flag.item())]
        return NONE if agreed == SNAPSHOT and self.hosts.rank != 0 else agreed

    def _poll(self) -> str:
        request = collective(self.local_action())
        return request if request in _CODES else NONE


class MultiHostRun(ReplicatedRun):
    """One host's :class:`ReplicatedRun`: global replicas ``rank * N ..``, rank 0 leads."""

    def __init__(self, param: SolverParameter, devices: Sequence[torch.device], hosts: Hosts,
                 options: TrainOptions | None = None, *, action: Callable[[], str] | None = None,
                 tuning: Tuning = Tuning()):
        self.host_sync: HostSync | None = None
        self.cluster = hosts
        slice_ = HostSlice(hosts.offset, hosts.total, lead=hosts.rank == 0)
        if Schedule.of(param, hosts.world).averages_hosts:   # models, not gradients
            super().__init__(param, devices, options, action=action, hosts=slice_,
                             tuning=tuning)
            self._check_same_net_or_close()
            return
        local_scale = 1.0 / hosts.world if (options and options.reduction == "nccl") else None
        extra = tuning.extra_callbacks

        def callbacks(i: int) -> list[Any]:
            more = list(extra(i)) if extra else []
            if i != 0:
                return more
            # the local ring divides by N already; the tree leaves the sum to us
            scale = local_scale if local_scale is not None else 1.0 / hosts.total
            self.host_sync = HostSync(hosts, self.sync, action or _no_action, scale)
            return [self.host_sync, *more]

        super().__init__(param, devices, options, action=lambda: self._host_sync().action(),
                         hosts=slice_,
                         tuning=dataclasses.replace(tuning, extra_callbacks=callbacks))
        self._check_same_net_or_close()

    def _host_sync(self) -> HostSync:
        """The hosts' sync (made with the root's callbacks, before the first iteration)."""
        assert self.host_sync is not None
        return self.host_sync

    def _check_same_net_or_close(self) -> None:
        try:
            self._check_same_net()
        except BaseException:
            self.close()
            raise

    def _host_exchange(self, model: Model) -> HostExchange:
        h = self.cluster
        return HostExchange(h.world, self.schedule, model.numel, model.avg, DistCollective(h),
                            fail=h.fail)

    def _check_same_net(self) -> None:
        """Every root's learnable and state tensors have rank 0's shapes, in rank 0's order
        (equal buffer sizes are not enough: each tensor is padded to 64 bytes)."""
        root = self.sync.replica(0)
        mine = [[tuple(t.shape) for t in root.flat.tensors],
                [tuple(t.shape) for t in root.state.tensors]]
        nets: list[Any] = [None] * self.cluster.world
        try:
            dist.all_gather_object(nets, mine, group=self.cluster.flags)
        except Exception as exc:  # noqa: BLE001
            raise self.cluster.fail("comparing the nets", exc) from None
        for rank, other in enumerate(nets):
            for kind, theirs, ours in zip(("learnable", "state"), other, nets[0], strict=True):
                if theirs != ours:
                    raise SolverError(f"rank {rank}'s net differs from rank 0's: {kind} blobs "
                                      f"{_first_difference(theirs, ours)}; every host must "
                                      "train the same net")

    def banner(self) -> list[str]:
        h, p = self.cluster, self.param
        batch = self.root.batch_size()
        devices = ", ".join(str(d) for d in self.devices)
        if not self.hosts.lead:
            return [f"rank {h.rank} of {h.world}: global replicas {h.offset}.."
                    f"{h.offset + h.local - 1} on {devices}"]
        per_host = f"{h.local} replica{'s' if h.local != 1 else ''} per host"
        world = (f"World: {h.world} hosts x {per_host} = {h.total} replicas "
                 f"(backend {h.backend}, rank 0 leads); effective batch {batch} x {h.total} "
                 f"replicas x iter_size {p.iter_size} = {batch * h.total * p.iter_size}")
        local = super().banner()  # "Batch: ... (effective batch ...)" of this host alone
        local[0] = local[0].replace("Batch: ", "This host: batch ", 1)
        return [world, *local, *self._hosts_line()]

    def _hosts_line(self) -> list[str]:
        s = self.schedule
        if not s.averages_hosts:
            return []
        every = (f"every {s.host} iterations" if s.host
                 else f"with the replicas, every {s.local} iterations")
        how = ("asynchronously: each exchange overlaps the next period and is folded in one "
               "period late, as a delta" if s.host_async else "synchronously")
        return [f"hosts: models averaged {every} and at every test, snapshot and the end, "
                f"{how}"]

    def share_root_model(self) -> None:
        """Every rank has resumed (its data positions, iteration); rank 0's weights, state
        blobs and update history now go to every root."""
        root = self.sync.replica(0)
        tensors = [root.flat.data, root.state.data, *self.root.updater.history]
        try:
            for t in tensors:
                if t.numel():
                    dist.broadcast(t, src=0)
        except Exception as exc:  # noqa: BLE001
            raise self.cluster.fail("the broadcast of rank 0's weights", exc) from None


def _first_difference(theirs: list[tuple[int, ...]], ours: list[tuple[int, ...]]) -> str:
    for k, (a, b) in enumerate(zip(theirs, ours, strict=False)):
        if a != b:
            return f"#{k} is {list(a)} there, {list(b)} on rank 0"
    return f"{len(theirs)} there, {len(ours)} on rank 0"


def _no_action() -> str:
    return NONE


def run_host(param: SolverParameter, devices: Sequence[torch.device], options: TrainOptions,
             action: Callable[[], str]) -> Solver:
    """This host's part of a run of several (the MultiHost strategy): join the others, agree on
    the solver, train this host's replicas; every error names the rank."""
    try:
        hosts = init_hosts(devices, options.dist_backend, options.dist_timeout)
        param = _agreed_param(param, hosts)
        with MultiHostRun(param, devices, hosts, options, action=action,
                          tuning=Tuning(timeout=options.dist_timeout)) as run:
            return run.run()
    except CaffePyError as exc:
        where = f"rank {_rank()} of {_world()}"
        msg = str(exc)
        if msg.startswith(where):
            raise
        raise SolverError(f"{where}: {msg.replace(f'{where}: ', '', 1)}") from exc
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _rank() -> int | str:
    return dist.get_rank() if dist.is_initialized() else os.environ.get("RANK", "?")


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else world_size()


def _agreed_param(param: SolverParameter, hosts: Hosts) -> SolverParameter:
    """The solver with rank 0's seed (one seed for all, also when it came from the clock)."""
    seed = [param.random_seed]
    try:
        dist.broadcast_object_list(seed, src=0, group=hosts.flags)
    except Exception as exc:  # noqa: BLE001
        raise hosts.fail("the broadcast of the seed", exc) from None
    return dataclasses.replace(param, random_seed=int(seed[0]))
