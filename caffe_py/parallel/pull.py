"""Weights arriving from the parent, piece by piece, and a forward that waits only for its own
(mshadow-ps's Push / PullReq / PullWait on the weight path).

A replica's model is cut into *units*: the buckets of its flat weight buffer, then those of
its state blobs (BatchNorm's sums), then (when the model is averaged) those of its update
history. When new weights come down the tree, a :class:`Pull` copies each unit from the
parent's source (its weights, or its averaged model) into this replica, and posts the unit for
its own children, so a unit travels down the tree as soon as it is there, not after the whole
model.

:class:`LayerWaits` adds a forward pre-hook to the first layer (in forward order) that reads
each unit, so the forward of layer l waits only for the units layer l reads:

* on a GPU every copy is issued at once on the replica's copy stream (the thread waits only
  until the parent has *issued* its copy of that unit) and the hook makes the compute stream
  wait on that unit's CUDA event: layer 1 runs while later buckets are still copying;
* on a CPU the hook copies the unit itself, in the replica's thread, when the forward reaches
  it (units no forward reads, the history, are copied when the pull opens).

Either way a replica's thread first waits until its parent has issued every unit (the parent
has ended the iteration before), so no replica runs ahead into its next records while the
root tests or snapshots.

Without layer waits (or with a CUDA graph step, which runs no hooks) everything is pulled, and
waited for, when the pull opens (on a GPU on the compute stream itself, one event for all).
Either way the same values are copied, so the weights are the same bit for bit (tested).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..net import Net
    from .sync import Signal, SyncGroup


@dataclass
class Unit:
    """One piece of a replica's model: ``dst[0] <- src``, then ``dst[k] <- dst[0]``."""

    src: torch.Tensor
    """The parent's slice (its weights, or its averaged model); unused at the root."""
    dst: Sequence[torch.Tensor]
    forward: bool
    """True when some layer's forward reads it (weights, state blobs); False for history."""


@dataclass
class Pull:
    """Replica ``who``'s pulls from replica ``parent`` (None: the root, which only posts).

    ``posted[u]`` is this replica's signal "unit u of generation g is issued here" for its
    children; ``parent_posted[u]`` is the parent's. ``stream`` is the replica's compute stream
    and ``copy_stream`` its side stream for the copies (both None on CPU).
    """

    group: SyncGroup
    who: int
    parent: int | None
    units: list[Unit]
    posted: list[Signal]
    parent_posted: list[Signal] | None
    stream: Any = None
    copy_stream: Any = None
    lazy: bool = False
    """Pull the forward's units when a layer needs them (:class:`LayerWaits`), not at open."""
    gen: int = 0
    """The generation being pulled (0: none since the last close)."""
    done: list[bool] = field(default_factory=list)
    waited: list[bool] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.units)
        self.done, self.waited, self.events = [True] * n, [True] * n, [None] * n

    def publish(self, gen: int, event: Any = None) -> None:
        """At the root: every unit of generation ``gen`` is ready (``event``: after the ops
        that wrote it)."""
        for signal in self.posted:
            signal.post(gen, event)

    def open(self, gen: int) -> None:
        """Start pulling generation ``gen`` from the parent.

        The thread first waits until the parent has *issued* every unit of ``gen`` (so the
        parent has finished the iteration before: a root that snapshots or tests has done so,
        and no replica reads its next records before that); the copies follow at once (GPU,
        on the copy stream) or when a layer needs them (CPU with layer waits).
        """
        self.gen = gen
        n = len(self.units)
        self.done, self.waited = [False] * n, [False] * n
        assert self.parent_posted is not None and self.parent is not None
        parent = self.parent
        what = f"weights from replica {parent} ({self.group.devices[parent]})"
        self.events = [signal.wait(gen, self.group, self.who, what)
                       for signal in self.parent_posted]
        if self.copy_stream is not None and not self.lazy:
            self._pull_all_on_stream()
            return
        if self.copy_stream is not None:
            # the copies overwrite weights the previous iteration's passes may still read
            self.copy_stream.wait_stream(self.stream)
        for u, unit in enumerate(self.units):
            if self.copy_stream is not None or not (self.lazy and unit.forward):
                self._pull(u)
            if not self.lazy:
                self._wait(u)

    def _pull_all_on_stream(self) -> None:
        """GPU without layer waits (e.g. a CUDA graph step): every copy on the compute
        stream after the parent's events, one event for all (the fewest launches)."""
        for event in {id(e): e for e in self.events if e is not None}.values():
            self.stream.wait_event(event)
        for unit in self.units:
            _copy(unit)
        mine = torch.cuda.Event()
        mine.record(self.stream)
        n = len(self.units)
        self.events, self.done, self.waited = [mine] * n, [True] * n, [True] * n
        for signal in self.posted:
            signal.post(self.gen, mine)

    def need(self, u: int) -> None:
        """Before a layer's forward: unit ``u`` must be here (a no-op once it is)."""
        if not self.waited[u]:
            if not self.done[u]:
                self._pull(u)
            self._wait(u)

    def close(self) -> None:
        """Everything pulled and waited for (before backward's results leave or the update)."""
        if self.gen:
            for u in range(len(self.units)):
                self.need(u)
            self.gen = 0

    def _pull(self, u: int) -> None:
        """Copy unit ``u`` (its parent's event in ``self.events[u]``) and post it below."""
        unit, event = self.units[u], self.events[u]
        if self.copy_stream is None:
            _copy(unit)
            self.done[u] = True
            self.posted[u].post(self.gen)
            return
        with torch.cuda.stream(self.copy_stream):
            if event is not None:
                self.copy_stream.wait_event(event)
            _copy(unit)
            mine = torch.cuda.Event()
            mine.record(self.copy_stream)
        self.events[u], self.done[u] = mine, True
        self.posted[u].post(self.gen, mine)

    def _wait(self, u: int) -> None:
        if self.stream is not None and self.events[u] is not None:
            self.stream.wait_event(self.events[u])
        self.waited[u] = True


def _copy(unit: Unit) -> None:
    first = unit.dst[0]
    first.copy_(unit.src, non_blocking=True)
    for other in unit.dst[1:]:
        other.copy_(first, non_blocking=True)


class LayerWaits:
    """Forward pre-hooks on a replica's TRAIN net: the first layer that reads a unit waits for
    it (see the module docstring). ``unit_of`` maps a tensor's data pointer to its unit."""

    def __init__(self, net: Net, unit_of: dict[int, int], pull_of: Any):
        """``pull_of()`` returns the replica's current :class:`Pull` (the mode may swap it)."""
        self.pull_of = pull_of
        self.first_needs = first_needs(net, unit_of)
        self.handles = [layer.register_forward_pre_hook(self._hook(units))
                        for layer, units in zip(net.layers, self.first_needs, strict=True)
                        if units]

    def _hook(self, units: list[int]) -> Any:
        def wait_for_weights(_module: Any, _args: Any) -> None:
            pull = self.pull_of()
            if pull.gen and not _capturing(pull):
                for u in units:
                    pull.need(u)
        return wait_for_weights

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def first_needs(net: Net, unit_of: dict[int, int]) -> list[list[int]]:
    """Per layer (forward order): the units it is the first to read.

    A layer reads its own blobs and, when a build-time pass folded two layers together
    (``net.fused``, ``net.fused_norm``), its partner's: a BatchNorm applies the Scale's blobs
    that come after it.
    """
    by_name = {layer.name: layer for layer in net.layers}
    partners: dict[str, list[str]] = {}
    for a, b in [*getattr(net, "fused", []), *getattr(net, "fused_norm", [])]:
        partners.setdefault(a, []).append(b)
        partners.setdefault(b, []).append(a)
    seen: set[int] = set()
    out = []
    for layer in net.layers:
        names = [layer.name, *partners.get(layer.name, [])]
        tensors = [t for name in names for t in by_name[name].blobs()]
        units = sorted({unit_of[t.data_ptr()] for t in tensors
                        if t.numel() and t.data_ptr() in unit_of} - seen)
        seen.update(units)
        out.append(units)
    return out


def _capturing(pull: Pull) -> bool:
    return pull.stream is not None and torch.cuda.is_current_stream_capturing()
