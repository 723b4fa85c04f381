"""When the replicas and the hosts average their models, and when the run acts on signals.

``model_average_period`` (level 1, the replicas of a host) and ``host_average_period`` (level 2,
between hosts) name the periods; a *point* is the iteration count ``t`` after an update
(``solver.iter + 1``), at which the weights are averaged before anything reads them:

* a **sync point** is every ``t`` where the run tests (``test_interval``), snapshots
  (``snapshot``) or ends (``max_iter``): every level averages there, synchronously, so what
  the root tests and saves is the one model every replica and host continues from, and a
  snapshot is complete without anything per replica or per host;
* a **host point** is every multiple of ``host_average_period`` and every sync point; with
  ``host_average_period: 0`` the hosts join every local point instead (and, when the
  replicas sum gradients, every iteration's gradient: no host points at all);
* a **local point** is every multiple of ``model_average_period``, every sync point and every
  host point (a host's model is its replicas' average).

Signals (:class:`Actions`) are acted on only where every replica holds that one model: at
the local points (one host) or host points (several), or at once between iterations (the
root's test phase, which runs at a sync point).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..solver.signals import NONE, SNAPSHOT, STOP, collective

CODES = {NONE: 0, SNAPSHOT: 1, STOP: 2}
ACTIONS = {v: k for k, v in CODES.items()}


@dataclass(frozen=True)
class Schedule:
    """The averaging points of one run (see the module docstring)."""

    local: int = 0
    """model_average_period (0: the replicas sum gradients every iteration)."""
    host: int = 0
    """host_average_period (0: the hosts join every reduction of the level below)."""
    host_async: bool = False
    hosts: int = 1
    test_interval: int = 0
    snapshot: int = 0
    max_iter: int = 0

    @classmethod
    def of(cls, param: Any, hosts: int = 1) -> Schedule:
        return cls(param.model_average_period, param.host_average_period,
                   param.host_average_async, hosts, param.test_interval, param.snapshot,
                   param.max_iter)

    @property
    def averages_replicas(self) -> bool:
        """The replicas of a host average weights (else they sum gradients)."""
        return self.local > 0

    @property
    def averages_hosts(self) -> bool:
        """The hosts average weights (else, with several, they sum gradients)."""
        return self.hosts > 1 and (self.host > 0 or self.local > 0)

    def sync_point(self, t: int) -> bool:
        return (t == self.max_iter or bool(self.test_interval and t % self.test_interval == 0)
                or bool(self.snapshot and t % self.snapshot == 0))

    def host_point(self, t: int) -> bool:
        if not self.averages_hosts:
            return False
        period = self.host or self.local
        return t % period == 0 or self.sync_point(t)

    def local_point(self, t: int) -> bool:
        return self.averages_replicas and (
            t % self.local == 0 or self.sync_point(t) or self.host_point(t))

    def blocking(self, t: int) -> bool:
        """Whether the hosts' exchange at host point ``t`` is waited for at once."""
        return not self.host_async or self.sync_point(t)


class Actions:
    """The root Solver's ``action`` when the model is averaged: a signal is acted on at the
    next point where every replica (and host) holds the averaged model.

    The averaging callback tells it, at the end of each iteration, whether that iteration
    ended at a point (:meth:`at_point`, with the code the hosts agreed on) or not
    (:meth:`between_points`); the Solver's call that follows (in ``finish_iteration``)
    returns the agreed action at a point and NONE elsewhere. Between iterations (the test
    phase, at a sync point) a snapshot is taken at once on rank 0, and a stop waits for the
    next point. ``rank`` other than 0 never snapshots.
    """

    def __init__(self, local: Callable[[], str], rank: int = 0):
        self.local, self.rank = local, rank
        self._pending = 0
        self._agreed: int | None = None
        """The code to act on after this iteration (None: no iteration has just ended)."""

    def poll(self) -> None:
        request = collective(self.local())
        self._pending = max(self._pending, CODES.get(request, 0))

    def take(self) -> int:
        """This host's requests since the last take, as a code to send to the other hosts."""
        self.poll()
        code, self._pending = self._pending, 0
        return code

    def at_point(self, agreed: int) -> None:
        self._agreed = agreed

    def between_points(self) -> None:
        self._agreed = 0

    def __call__(self) -> str:
        if self._agreed is None:            # between iterations: the root's test phase
            self.poll()
            if self._pending == CODES[SNAPSHOT]:
                self._pending = 0
                return SNAPSHOT if self.rank == 0 else NONE
            return NONE                     # a stop waits for the next point's agreement
        self.poll()
        agreed, self._agreed = ACTIONS[self._agreed], None
        return NONE if agreed == SNAPSHOT and self.rank != 0 else agreed
