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
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from ..errors import CaffePyError
from ..solver.graph_loop import GraphedLoop
from .sync import StopReplica, SyncGroup

if TYPE_CHECKING:
    from ..solver.solver import Solver


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
