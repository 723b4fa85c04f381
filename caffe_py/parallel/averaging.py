"""Model averaging through the tree (``model_average_period: K``): local SGD inside a host.

Every replica applies its own update to its own weights on its own records (role
``UPDATING_WORKER``; the root is still ROOT or HOST_ROOT). At each local point ``t`` of the
:class:`~.schedule.Schedule` (every K iterations, and before every test, snapshot and the end)
the replicas' models are averaged through the same tree that sums gradients otherwise:

``on_update_applied`` at a point (after the update of iteration t - 1)
    up the tree, unit by unit: ``avg = own model + each child's subtree sum`` (the tree's fixed
    order), pushed into the parent's inbox; the root divides by N, hands its local mean to the
    hosts' exchange when there is one (:mod:`.hostavg`), and copies it into its own weights,
    state blobs and history: what the root tests and snapshots at t is that average.
``on_start`` of iteration t
    the root posts its average; every other replica pulls its parent's average unit by unit
    (:mod:`.pull`: with layer waits, its forward of layer l waits only for layer l's units)
    into its own model and, for its children, into its own ``avg``.

A replica's *model* is its weights, its state blobs (BatchNorm's sums) and its update history
(momentum, Adam's moments): all three are averaged (``average_history``; keeping the history
per replica was measured against it, see docs/parallel.md), so at a point every replica holds
the same weights *and* history and a snapshot needs nothing per replica. Between points the
replicas meet nowhere; at a point a replica waits for its children's sums and, at its next
on_start, for its parent's average (published after the root's test and snapshot).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from .flat import FlatParams
from .pull import Unit
from .schedule import Actions, Schedule
from .sync import Signal, on_stream, record_event, wait_event

if TYPE_CHECKING:
    from ..solver.solver import Solver
    from .hostavg import HostExchange


class Model:
    """A replica's model as one vector: its weights, state blobs and (optionally) history,
    each a :class:`FlatParams`, with a contiguous ``avg`` buffer of their total size laid out
    part after part. A *unit* is one bucket of one part."""

    def __init__(self, parts: Sequence[FlatParams]):
        self.parts = list(parts)
        self.offsets, total = [], 0
        for part in self.parts:
            self.offsets.append(total)
            total += part.numel
        self.numel = total
        device = self.parts[0].device
        dtype = self.parts[0].data.dtype
        self.avg = torch.zeros(total, dtype=dtype, device=device)
        self.inbox: dict[int, torch.Tensor] = {}
        self.units = [(p, b) for p, part in enumerate(self.parts)
                      for b in range(len(part.buckets))]

    def own(self, u: int) -> torch.Tensor:
        """Unit ``u`` of this replica's live model (its weights, state or history)."""
        p, b = self.units[u]
        return self.parts[p].bucket(self.parts[p].data, b)

    def of(self, buffer: torch.Tensor, u: int) -> torch.Tensor:
        """Unit ``u`` of a model-sized ``buffer`` (``avg`` or an inbox)."""
        p, b = self.units[u]
        bucket = self.parts[p].buckets[b]
        start = self.offsets[p] + bucket.start
        return buffer[start:start + bucket.numel]

    def gather(self, into: torch.Tensor) -> None:
        """``into`` <- the live model, part after part."""
        for part, offset in zip(self.parts, self.offsets, strict=True):
            into[offset:offset + part.numel].copy_(part.data)

    def scatter(self, source: torch.Tensor) -> None:
        """The live model <- ``source``, part after part."""
        for part, offset in zip(self.parts, self.offsets, strict=True):
            part.data.copy_(source[offset:offset + part.numel])


class AveragingSync:
    """Model averaging over a :class:`TreeSync`'s replicas (see the module docstring).

    ``history(i)`` gives replica i's update history tensors (its Solver's
    ``updater.history``); they move into a flat buffer as the weights did. ``exchange`` is
    the hosts' exchange of the root's local average (several hosts), ``actions`` the root
    Solver's action (it acts on signals only at points).
    """

    def __init__(self, tree: Any, schedule: Schedule, actions: Actions, *,
                 exchange: HostExchange | None = None, average_history: bool = True):
        """``tree`` is the run's :class:`TreeSync` (or, when only the hosts average, any
        sync group: then only the root's model is used)."""
        self.tree, self.schedule, self.actions = tree, schedule, actions
        self.exchange = exchange
        self.average_history = average_history
        self.models: list[Model | None] = [None] * tree.n
        self.pending = [0] * tree.n
        """Per replica: the point whose average it takes at its next on_start (0: none)."""

    def setup(self, i: int, history: Sequence[torch.Tensor]) -> Model:
        """Replica ``i``'s model (after ``tree.setup(i, ...)``): its weights, state blobs and
        history, the units its weights come down in, and its inboxes."""
        rep = self.tree.replica(i)
        parts = [rep.flat, rep.state]
        if self.average_history:
            parts.append(FlatParams(history, with_grad=False, bucket_bytes=self.tree.bucket_bytes))
        model = self.models[i] = Model(parts)
        if not self.schedule.averages_replicas:
            return model           # the root's model for the hosts' exchange; the tree as is
        for child in self.tree.tree.children(i):
            model.inbox[child] = torch.zeros_like(model.avg)
        rep.sums = [Signal() for _ in model.units]
        rep.weights = [Signal() for _ in model.units]
        parent = self.tree.tree.parent(i)
        source = self.model(i if parent is None else parent)
        has_children = bool(self.tree.tree.children(i))
        rep.pull = self.tree.weight_pull(rep, [
            Unit(source.of(source.avg, u),
                 [model.of(model.avg, u), model.own(u)] if has_children else [model.own(u)],
                 forward=model.units[u][0] < 2) for u in range(len(model.units))])
        return model

    def model(self, i: int) -> Model:
        model = self.models[i]
        if model is None:
            raise RuntimeError(f"replica {i}'s model was not set up")
        return model

    def callback(self, i: int) -> AveragingCallback:
        return AveragingCallback(self, i)

    def spread(self) -> None:
        """Every replica starts from the root's model (its weights, after any --weights or
        --snapshot, its state blobs and history); run before the threads start."""
        root = self.model(0)
        root.gather(root.avg)
        for i in range(1, self.tree.n):
            model = self.model(i)
            model.avg.copy_(root.avg)
            model.scatter(model.avg)
        for rep in self.tree.replicas:
            if rep is not None and rep.stream is not None:
                torch.cuda.synchronize(rep.device)

    # --- one replica's steps ----------------------------------------------------------------
    def start(self, i: int) -> None:
        """on_start: the root posts the last point's average; the others pull it."""
        gen, rep = self.pending[i], self.tree.replica(i)
        if not gen or not self.schedule.averages_replicas:
            return
        self.pending[i] = 0
        assert rep.pull is not None
        with on_stream(rep.stream):
            if self.tree.tree.parent(i) is None:
                rep.pull.publish(gen, record_event(rep.stream))
            else:
                rep.pull.open(gen)

    def gradient_ready(self, i: int) -> None:
        """on_gradient_ready: every unit of the average is in before the update reads it."""
        rep = self.tree.replica(i)
        if self.schedule.averages_replicas:
            assert rep.pull is not None
            with on_stream(rep.stream):
                rep.pull.close()

    def update_applied(self, i: int, t: int) -> None:
        """on_update_applied of the iteration that makes the count ``t``: average at a point.

        When only the hosts average (the replicas sum gradients), this runs at the root alone:
        its model goes through the hosts' exchange at host points, and the tree brings the
        result to the workers at the next on_start, as it does every update."""
        root = i == 0
        local = self.schedule.averages_replicas
        if not (self.schedule.local_point(t) if local else self.schedule.host_point(t)):
            if root:
                self.actions.between_points()
            return
        rep, model = self.tree.replica(i), self.model(i)
        if local:
            self.reduce(i, t)
            self.pending[i] = t
        if not root:
            return
        agreed = self.actions.take()
        with on_stream(rep.stream):
            if not local:
                model.gather(model.avg)
            if self.exchange is not None and self.schedule.host_point(t):
                agreed = self.exchange.exchange(model.avg, t, agreed)
            model.scatter(model.avg)
        self.actions.at_point(agreed)

    def reduce(self, i: int, t: int) -> None:
        """Up the tree, unit by unit: avg = own + children's sums (tree order); the root
        divides by N, the others push into their parent's inbox."""
        rep, model = self.tree.replica(i), self.model(i)
        kids = self.tree.tree.children(i)
        parent = self.tree.tree.parent(i)
        with on_stream(rep.stream):
            for u in range(len(model.units)):
                # the children's sums first: a child sends its sum only after it has pulled
                # the last average out of this replica's avg, which the copy overwrites
                for c in kids:
                    what = f"the model sum (unit {u}) of replica {c} ({self.tree.devices[c]})"
                    event = self.tree.replica(c).sums[u].wait(t, self.tree, i, what)
                    wait_event(rep.stream, event)
                total = model.of(model.avg, u)
                total.copy_(model.own(u))
                for c in kids:
                    total.add_(model.of(model.inbox[c], u))
                if parent is None:
                    if self.tree.n > 1:
                        total.mul_(1.0 / self.tree.n)
                    continue
                target = self.model(parent)
                target.of(target.inbox[i], u).copy_(total, non_blocking=True)
                rep.sums[u].post(t, record_event(rep.stream))


class AveragingCallback:
    """Replica ``index``'s solver callback when the replicas average their models."""

    def __init__(self, sync: AveragingSync, index: int):
        self.sync, self.index = sync, index

    def on_start(self, solver: Solver | None = None) -> None:
        self.sync.start(self.index)

    def on_gradient_ready(self, solver: Solver | None = None) -> None:
        self.sync.gradient_ready(self.index)

    def on_update_applied(self, solver: Solver) -> None:
        self.sync.update_applied(self.index, solver.iter + 1)
