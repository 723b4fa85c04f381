"""Every replica's whole iterations as CUDA graph replays, issued by one thread (the default for
several GPUs of one host).

The one-device loop (:class:`~caffe_py.solver.graph_loop.GraphedLoop`) captures a Solver's whole
iteration: its batch slots, forward and backward passes, loss and Caffe's update. Here its
members are all the replicas of a run, each captured in a graph on its own device (the
captures open at once in the root's thread), and between the passes and the updates the
replicas' flat gradients are summed by an all-reduce: NCCL's, one group call over the devices'
capture streams, which a graph holds because its kernels meet their peers through device
memory, not through the host. Every replica then divides the sum by N and applies the same
update (its own copy of the history), so the replicas' weights stay equal bit for bit without
a broadcast (NCCL hands every device the same sum). Several iterations go into one replay when
the step is short, as on one device; per chunk the host fills each replica's batch slots,
copies the rates, replays N graphs and does the Solvers' Step bookkeeping.

On CPU replicas (tests) the same host sequence runs unrecorded (``emulate``) and the all-reduce
is a sum on the host: two replicas give the tree's numbers bit for bit (its root adds its
child's gradient to its own, the same two operands). Where a replica's iteration cannot be
captured (a Python layer, a generator on the host) the loop says why in one line and runs the
same sequence eagerly.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch

from ..errors import CaffePyError
from ..io import feed_of, swap_feed
from ..net import Net
from ..solver.evaluate import raise_device_problems, run_batches
from ..solver.graph_loop import GraphedLoop
from .sync import StopReplica, SyncGroup

if TYPE_CHECKING:
    from ..solver.solver import Solver

log = logging.getLogger(__name__)


class AllReduceGroup(SyncGroup):
    """The replicas' flat parameter and gradient buffers, and the all-reduce of the gradients
    that :class:`CapturedReplicas` runs between the passes and the updates."""

    def __init__(self, devices: Sequence[torch.device], **kw: object):
        super().__init__(devices, **kw)  # type: ignore[arg-type]
        self.collectives = None
        if all(d.type == "cuda" for d in self.devices):
            import torch.cuda.nccl as nccl

            self.collectives = nccl

    def all_reduce(self, streams: Sequence[torch.cuda.Stream] | None) -> None:
        """Sum every replica's flat gradient into each, then divide by N, in each replica's
        stream order (``streams``: the capture streams while recording; None: the current
        streams)."""
        grads = [g for g in (self.replica(i).flat.grad for i in range(self.n)) if g is not None]
        if self.collectives is None:   # CPU replicas: the sum on the host, in replica order
            total = grads[0].clone()
            for g in grads[1:]:
                total.add_(g)
            for g in grads:
                g.copy_(total).mul_(1.0 / self.n)
            return
        current = [torch.cuda.current_stream(g.device) for g in grads]
        use = list(streams) if streams is not None else current
        self.collectives.all_reduce(grads, streams=use)
        for g, stream in zip(grads, use, strict=True):
            with torch.cuda.device(g.device), torch.cuda.stream(stream):
                g.mul_(1.0 / self.n)

    def spread_state(self) -> None:
        """Every replica takes the root's state blobs (BatchNorm's running sums: each replica
        gathers its own while training; a test pass uses the root's, as Caffe's does)."""
        root = self.replica(0)
        if root.state.numel:
            with torch.no_grad():
                for i in range(1, self.n):
                    self.replica(i).state.data.copy_(root.state.data)

    def spread_root(self, solvers: Sequence[Solver]) -> None:
        """Every replica takes the root's weights, state blobs and update history (at the
        start, after --weights or a resume: each replica updates its own copy from then on)."""
        root = self.replica(0)
        for i, solver in enumerate(solvers[1:], start=1):
            rep = self.replica(i)
            with torch.no_grad():
                rep.flat.data.copy_(root.flat.data)
                if rep.state.numel:
                    rep.state.data.copy_(root.state.data)
                for mine, theirs in zip(solver.updater.history, solvers[0].updater.history,
                                        strict=True):
                    mine.copy_(theirs)
        for i in range(self.n):
            if self.devices[i].type == "cuda":
                torch.cuda.synchronize(self.devices[i])


class CapturedReplicas(GraphedLoop):
    """The root's runner: every replica a member of one graph loop (module docstring).
    ``solvers`` is the run's list (index = replica), filled after the root is made."""

    def __init__(self, group: AllReduceGroup, solvers: Sequence[Solver], *,
                 chunk: int | None = None, required: bool = False):
        super().__init__(chunk=chunk, emulate=group.collectives is None, required=required)
        self.group, self.solvers = group, solvers

    def members(self, s: Solver) -> list[Solver]:
        return list(self.solvers)

    def between(self, streams: list[torch.cuda.Stream] | None) -> None:
        self.group.all_reduce(streams)

    @contextlib.contextmanager
    def on_member(self, i: int, s: Solver) -> Iterator[None]:
        """Replica i's device and stream; a worker's own failure (its data, its memory) is
        reported as its own, naming its replica and device, and unwinds the root's thread."""
        try:
            with super().on_member(i, s):
                yield
        except (CaffePyError, torch.cuda.OutOfMemoryError) as exc:
            if i == 0:
                raise
            self.group.fail(i, exc)
            raise StopReplica(f"replica {i} failed") from exc


class _Handoff:
    """A worker's TEST Data layer feed: the batch the root's feed gave for it."""

    def __init__(self) -> None:
        self.batch: tuple[torch.Tensor, torch.Tensor] | None = None

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.batch is not None
        batch, self.batch = self.batch, None
        return batch


class SplitTests:
    """The root's test passes spread over every replica (the root's ``test_batches``; every
    replica holds the root's weights when whole iterations are captured). Batch b of a test
    pass runs on replica b mod N: the root's feed reads the batches in order, as on one device,
    and hands each worker's batch to its TEST net on its device; every batch's outputs are
    summed in batch order on the root, as one device sums them, so the pass prints the one
    device's numbers while the N devices compute at once. A TEST net with a source the root's
    feed cannot hand over (DummyData, a Python layer, an Input) tests on the root alone, and
    says so once."""

    def __init__(self, group: AllReduceGroup, solvers: Sequence[Solver]):
        self.group, self.solvers = group, solvers
        self._nets: dict[int, list[Net] | None] = {}
        """Per TEST net: every replica's copy (the root's first), or None: the root alone."""
        self._handoffs: dict[int, list[list[_Handoff]]] = {}

    def __call__(self, k: int, net: Net, iterations: int, *,
                 autocast: Callable[[], AbstractContextManager[Any]],
                 between: Callable[[], bool]) -> dict[str, torch.Tensor] | None:
        nets = self._replica_nets(k, net)
        if nets is None:
            return run_batches(net, iterations, autocast=autocast, between=between)
        self.group.spread_state()
        n, root_feeds = len(nets), [feed_of(layer) for layer in net.data_layers()]
        sums: dict[str, torch.Tensor] = {}
        loss_sum = torch.zeros((), device=net.device)
        with torch.no_grad():
            for b in range(iterations):
                if between():
                    return None
                r = b % n
                if r:
                    for feed, hand in zip(root_feeds, self._handoffs[k][r], strict=True):
                        assert feed is not None
                        data, label = feed.next()
                        hand.batch = (data.to(nets[r].device, non_blocking=True),
                                      label.to(nets[r].device, non_blocking=True))
                with _on_device(nets[r].device), autocast():
                    out = nets[r]()
                loss_sum += out.loss.detach().float().to(net.device)
                for name, value in out.outputs.items():
                    flat = value.detach().float().reshape(-1).to(net.device)
                    sums[name] = sums[name] + flat if name in sums else flat.clone()
        means = {name: (s / iterations).cpu() for name, s in sums.items()}
        means["__loss__"] = (loss_sum / iterations).cpu().reshape(1)
        for replica_net in nets:
            raise_device_problems(replica_net)
        return means

    def _replica_nets(self, k: int, net: Net) -> list[Net] | None:
        if k in self._nets:
            return self._nets[k]
        root = self.solvers[0]
        fed = {id(layer) for layer in net.data_layers()}
        own = [layer for layer in net.layers if not layer.spec.bottom and id(layer) not in fed]
        if own:
            log.info(f"Note: test net #{k} runs on the root alone: layer '{own[0].name}' "
                     f"({own[0].spec.type}) makes its own data, which the root's feed cannot "
                     "hand to the other replicas")
            self._nets[k] = None
            return None
        spec, state = root.param.test_net_specs()[k]
        nets: list[Net] = [net]
        handoffs: list[list[_Handoff]] = [[]]
        for worker in self.solvers[1:]:
            copy = Net(spec, state.phase, stages=state.stage, level=state.level,
                       device=worker.device, seed=worker.seeds.model)
            copy.share_weights_with(worker.net)
            hands = [_Handoff() for _ in copy.data_layers()]
            for layer, hand in zip(copy.data_layers(), hands, strict=True):
                swap_feed(layer, hand)
            nets.append(copy)
            handoffs.append(hands)
        self._nets[k], self._handoffs[k] = nets, handoffs
        return nets


def _on_device(device: torch.device) -> AbstractContextManager[Any]:
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
