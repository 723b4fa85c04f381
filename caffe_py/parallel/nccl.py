"""Ring reduction with NCCL, one process, many devices (``--reduction nccl``).

The replicas' threads meet at a barrier after backward; the last to arrive calls
``torch.cuda.nccl.all_reduce`` over every replica's flat gradient buffer (one NCCL group call
over all devices, each on its replica's compute stream); the root then scales by 1/N and applies
the update as in the tree. Before the next forward a second barrier broadcasts the root's flat
weights (and state blobs) with ``torch.cuda.nccl.broadcast``. The barrier waits are bounded and
broken at once when any replica fails.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import SolverError
from .sync import ReplicaState, StopReplica, SyncGroup

if TYPE_CHECKING:
    from ..solver.solver import Solver


def nccl_available() -> bool:
    """True when torch was built with NCCL and CUDA is usable."""
    try:
        import torch.cuda.nccl as nccl
        return torch.cuda.is_available() and nccl.version() is not None
    except (ImportError, RuntimeError, AttributeError):
        return False


class NcclCallback:
    """The solver callback of replica ``index`` in an NCCL-synchronised run."""

    def __init__(self, sync: NcclSync, index: int):
        self.sync, self.index = sync, index

    def on_start(self, solver: Solver | None = None) -> None:
        self.sync.weights_down(self.index)

    def on_gradient_ready(self, solver: Solver | None = None) -> None:
        self.sync.grads_up(self.index)


class NcclSync(SyncGroup):
    """All-reduce the gradients and broadcast the weights with NCCL collectives."""

    def __init__(self, devices: Sequence[torch.device], *, collectives: Any = None,
                 **kw: Any):
        """``collectives`` stands in for ``torch.cuda.nccl`` (all_reduce and broadcast over
        one tensor per replica); tests pass a CPU one."""
        super().__init__(devices, **kw)
        if collectives is None:
            self._check_cuda()
            import torch.cuda.nccl as collectives
        self.nccl = collectives
        self._reduce = threading.Barrier(self.n, action=self._all_reduce)
        self._broadcast = threading.Barrier(self.n, action=self._broadcast_weights)

    def _check_cuda(self) -> None:
        bad = [str(d) for d in self.devices if d.type != "cuda"]
        if bad:
            raise SolverError(f"reduction 'nccl' needs CUDA devices, got {', '.join(bad)}; "
                              f"use reduction 'tree' (the default) on CPU")
        if len({d.index for d in self.devices}) != self.n:
            raise SolverError("reduction 'nccl' needs distinct GPUs; a GPU id is listed twice")
        if not nccl_available():
            raise SolverError("this torch build has no NCCL; use reduction 'tree'")

    def callback(self, i: int) -> NcclCallback:
        return NcclCallback(self, i)

    def fail(self, i: int, error: BaseException) -> None:
        super().fail(i, error)
        self._reduce.abort()
        self._broadcast.abort()

    def finish(self) -> None:
        super().finish()
        self._broadcast.abort()

    def weights_down(self, i: int) -> None:
        self.replica(i).iteration += 1
        self._meet(self._broadcast, i, "the weight broadcast")

    def grads_up(self, i: int) -> None:
        self.replica(i).flat.rebind_grads()
        self._meet(self._reduce, i, "the gradient all-reduce")

    def _meet(self, barrier: threading.Barrier, i: int, what: str) -> None:
        started = time.perf_counter()
        try:
            barrier.wait(self.timeout)
        except threading.BrokenBarrierError:
            self.check(i)
            if self.stop.is_set():
                raise StopReplica(f"replica {i} stops") from None
            raise SolverError(
                f"replica {i} ({self.devices[i]}) waited {self.timeout:.0f} s at {what} "
                f"(iteration {self.replica(i).iteration - 1}); another replica is stuck"
            ) from None
        finally:
            self.replica(i).wait_s += time.perf_counter() - started

    def _reps(self) -> list[ReplicaState]:
        return [self.replica(i) for i in range(self.n)]

    def _all_reduce(self) -> None:
        reps = self._reps()
        grads = [r.flat.grad for r in reps if r.flat.grad is not None]
        self.nccl.all_reduce(grads, streams=[r.stream for r in reps])
        root = reps[0]
        if root.stream is None:
            grads[0].mul_(1.0 / self.n)
            return
        with torch.cuda.device(root.device), torch.cuda.stream(root.stream):
            grads[0].mul_(1.0 / self.n)

    def _broadcast_weights(self) -> None:
        reps = self._reps()
        streams = [r.stream for r in reps]
        self.nccl.broadcast([r.flat.data for r in reps], root=0, streams=streams)
        if reps[0].state.numel:
            self.nccl.broadcast([r.state.data for r in reps], root=0, streams=streams)
