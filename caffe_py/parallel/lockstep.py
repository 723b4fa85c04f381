"""All replicas driven from the root's thread, in lockstep (used with CUDA graphs).

With each replica's forward/backward one graph replay, what is left per iteration is a few
dozen small launches per replica. With one thread per replica that little work still pays a
thread handoff per tree edge per step (a Condition wake-up, then the GIL), and the handoffs are
in series: root -> children -> leaves for the weights, leaves -> root for the gradients. On a
small net (LeNet, 0.4 ms a step as a graph) those handoffs were most of the step on 4 GPUs.

Here the root's thread issues every replica's iteration itself, in an order where no wait can
block, through the Solver's Step seams (solver/solver.py), the same three calls a replica's
own iteration makes: at the root's ``on_start`` it takes its own weights, then for each worker
from the top of the tree down (parents first) ``begin_iteration()`` (its ``on_start``
callbacks: weights from its parent, whose copy is already issued) and ``passes()`` (zeroed
gradients, its forward/backward: a replay); at the root's ``on_gradient_ready`` each worker
from the bottom up (children first) ``end_iteration()`` (its loss recorded, its
``on_gradient_ready`` callbacks: the tree's add + push, issued on its own streams; its update
when its role applies one, as in model averaging; its ``on_update_applied`` callbacks, where the
model sums go up; its count), then the root reduces. Every GPU still waits for its peers only
through CUDA events, the host never waits for a GPU, and the arithmetic and its order are the
tree's, so the weights are bit-identical to the threaded run (tested on CPU replicas).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from .sync import ReplicaState, RunFinished, StopReplica, TreeSync

if TYPE_CHECKING:
    from ..net import NetOutput
    from ..solver.callbacks import Callback
    from ..solver.solver import Solver


def top_down(sync: TreeSync) -> list[int]:
    """The workers in breadth-first order from the root (every parent before its children)."""
    order, frontier = [], [sync.tree.root]
    while frontier:
        frontier = [c for p in frontier for c in sync.tree.children(p)]
        order += frontier
    return order


class LockstepRoot:
    """The root's sync callback when the root's thread drives every replica.

    ``inner`` is the root's own sync callback (the tree's, or model averaging's); ``solvers``
    is the run's list of Solvers (index = replica), filled after this callback is made;
    workers' own callbacks are in ``solver.callbacks`` (their sync callback first).
    """

    def __init__(self, sync: TreeSync, solvers: Sequence[Solver], inner: Callback | None = None):
        self.sync, self.solvers = sync, solvers
        self.inner = inner if inner is not None else sync.callback(sync.tree.root)
        self.down = top_down(sync)
        self.up = list(reversed(self.down))
        self._passes: dict[int, tuple[torch.Tensor, NetOutput]] = {}
        """Each worker's (loss, outputs) between its passes and the end of its iteration."""
        self._streams_ready = False

    def on_start(self, solver: Solver) -> None:
        self.inner.on_start(solver)
        self._first_use()
        for i in self.down:
            with self._as_worker(i) as worker:
                worker.begin_iteration()   # True: a worker runs no test a signal could stop
                self._passes[i] = worker.passes()

    def on_gradient_ready(self, solver: Solver) -> None:
        for i in self.up:
            with self._as_worker(i) as worker:
                worker.end_iteration(*self._passes.pop(i))
        self.inner.on_gradient_ready(solver)

    def on_update_applied(self, solver: Solver) -> None:
        hook = getattr(self.inner, "on_update_applied", None)
        if hook is not None:
            hook(solver)

    @contextlib.contextmanager
    def _as_worker(self, i: int) -> Iterator[Solver]:
        """Worker i's device and stream; its failure is reported as its own (it names the
        worker's replica and device) and unwinds the root's thread."""
        try:
            with on_replica(self.sync.replica(i)):
                yield self.solvers[i]
        except (StopReplica, RunFinished):
            raise
        except BaseException as exc:  # noqa: BLE001 - the worker's error, not the root's
            self.sync.fail(i, exc)
            raise StopReplica(f"replica {i} failed") from exc

    def _first_use(self) -> None:
        """The workers' nets and buffers were made on their default streams (as a replica's
        own thread does at its start)."""
        if self._streams_ready:
            return
        self._streams_ready = True
        for i in self.down:
            rep = self.sync.replica(i)
            if rep.stream is not None:
                rep.stream.wait_stream(torch.cuda.default_stream(rep.device))


@contextlib.contextmanager
def on_replica(rep: ReplicaState) -> Iterator[None]:
    """Replica ``rep``'s device and compute stream for the ops issued inside (CPU: nothing)."""
    if rep.stream is None:
        yield
        return
    with torch.cuda.device(rep.device), torch.cuda.stream(rep.stream):
        yield
