"""The hosts' exchange of their models (``host_average_period``, ``host_average_async``).

At each host point ``t`` (:class:`~.schedule.Schedule`) every host's root hands in its model
``x`` (weights, state blobs and history, one vector: its local average when the replicas
average too) and the H hosts all-reduce it. The two signal codes of the hosts (a snapshot or a
stop asked for, see :class:`~.schedule.Actions`) ride in the same all-reduce, two slots after
the model, so agreeing on them costs no extra round trip.

**Synchronous** (``host_average_async: false``, and at every sync point): the root waits for
the all-reduce and every host continues from ``x = sum / H``, bit-identical on every host.

**Asynchronous** (``host_average_async: true``): the root copies ``x`` into a send buffer,
keeps it as the *anchor* ``a = x``, starts the all-reduce and goes on training at once; the
exchange overlaps the next K iterations. At the next host point, before anything else, it
waits for that all-reduce (long done on any link slower than K iterations of compute) and
folds its result in **as a delta**, one period late::

    x <- x + (sum / H - a)

that is, the host keeps the progress it made since it sent ``a`` and takes the average's
correction of ``a``. Then the new ``x`` is sent in turn. One host alone gets a zero delta; two
hosts that made the same progress end at the average plus that progress. At sync points
(tests, snapshots, the end) and when the codes that arrive say a host asked for a snapshot or
a stop, the pending exchange is folded in and then a synchronous one follows, so the model
that is tested, saved or left at the end is the one average every host holds, and a resume
needs no exchange in flight.
"""
from __future__ import annotations

import time
from typing import Any, Protocol

import torch
import torch.distributed as dist

from .schedule import CODES, SNAPSHOT, STOP, Schedule

FLAGS = 2
"""Slots after the model in the send buffer: [a snapshot asked for, a stop asked for]."""


class Collective(Protocol):
    """A SUM all-reduce of one tensor over the hosts (torch.distributed; tests use a fake)."""

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False) -> Any: ...


class DistCollective:
    """The default process group's all-reduce, errors named by :meth:`Hosts.fail`."""

    def __init__(self, hosts: Any):
        self.hosts = hosts

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False) -> Any:
        try:
            return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, async_op=async_op)
        except Exception as exc:  # noqa: BLE001 - the peers' failure, as one line
            raise self.hosts.fail("the hosts' model exchange", exc) from None


class HostExchange:
    """One host root's side of the model exchange (see the module docstring)."""

    def __init__(self, world: int, schedule: Schedule, numel: int, like: torch.Tensor,
                 collective: Collective, fail: Any = None):
        self.world, self.schedule, self.numel = world, schedule, numel
        self.collective, self.fail = collective, fail
        self.send = torch.zeros(numel + FLAGS, dtype=like.dtype, device=like.device)
        self.anchor = torch.zeros(numel, dtype=like.dtype, device=like.device)
        self.work: Any = None
        """The asynchronous all-reduce in flight (None: none)."""
        self.exchanges = 0
        self.waited = 0
        """Exchanges the root waited for (synchronous ones), for the run's summary."""
        self.wait_s = 0.0
        """Seconds the root spent waiting for exchanges (a benchmark diagnostic)."""

    def exchange(self, model: torch.Tensor, t: int, code: int) -> int:
        """At host point ``t``: fold in the exchange in flight, then start the next (or, at a
        sync point, when asked to, or in synchronous mode, run it to the end). ``code`` is
        this host's signal code; returns the code every host agreed on to act on now."""
        agreed = self._fold(model) if self.work is not None else 0
        self._fill(model, code)
        self.exchanges += 1
        if self.schedule.blocking(t) or agreed:
            self._wait(self.collective.all_reduce(self.send, async_op=True))
            self.waited += 1
            model.copy_(self.send[:self.numel]).mul_(1.0 / self.world)
            return max(agreed, self._codes())
        self.anchor.copy_(model)
        self.work = self.collective.all_reduce(self.send, async_op=True)
        return 0

    def _fill(self, model: torch.Tensor, code: int) -> None:
        self.send[:self.numel].copy_(model)
        self.send[self.numel] = float(code == CODES[SNAPSHOT])
        self.send[self.numel + 1] = float(code == CODES[STOP])

    def _fold(self, model: torch.Tensor) -> int:
        """model += sum / H - anchor; returns the codes that came with the sum."""
        work, self.work = self.work, None
        self._wait(work)
        delta = self.send[:self.numel]
        delta.mul_(1.0 / self.world).sub_(self.anchor)
        model.add_(delta)
        return self._codes()

    def _codes(self) -> int:
        snapshot, stop = (float(v) for v in self.send[self.numel:].cpu())
        return CODES[STOP] if stop > 0 else CODES[SNAPSHOT] if snapshot > 0 else 0

    def _wait(self, work: Any) -> None:
        if work is None:
            return
        started = time.perf_counter()
        try:
            work.wait()
        except Exception as exc:  # noqa: BLE001 - the peers' failure, as one line
            if self.fail is None:
                raise
            raise self.fail("the hosts' model exchange", exc) from None
        finally:
            self.wait_s += time.perf_counter() - started
