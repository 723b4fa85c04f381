"""Caffe's SignalHandler: SIGINT / SIGHUP only set a flag; the solver acts between iterations.

One exception: a stopping effect that arrives while the main thread waits for input (an
interruptible wait, caffe_py.interrupts) is raised there as ``Interrupted``, and the solver
stops as of the last finished iteration (a stalled read would otherwise hold it forever).

Each signal maps to an effect (``stop``, ``snapshot`` or ``none``; Caffe's defaults are
SIGINT -> stop and SIGHUP -> snapshot). :meth:`SignalHandler.requested_action` is the
solver's action callback: it returns (and clears) the pending effect, SIGINT first.
"""
from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

from .. import interrupts

EFFECTS = ("stop", "snapshot", "snapshot-stop", "none")
NONE, STOP, SNAPSHOT, SNAPSHOT_STOP = "none", "stop", "snapshot", "snapshot-stop"


def collective(effect: str) -> str:
    """The effect as the levels that agree on actions across replicas or hosts know it
    (none, snapshot, stop): snapshot-stop is a stop there (the final snapshot then follows
    snapshot_after_train)."""
    return STOP if effect == SNAPSHOT_STOP else effect


class SignalHandler:
    """Install with ``with SignalHandler(sigint, sighup) as h:``; old handlers come back after."""

    def __init__(self, sigint_effect: str = STOP, sighup_effect: str = SNAPSHOT,
                 sigterm_effect: str = SNAPSHOT_STOP):
        for effect in (sigint_effect, sighup_effect, sigterm_effect):
            if effect not in EFFECTS:
                raise ValueError(f"signal effect {effect!r} is not one of {EFFECTS}")
        self.effects = {signal.SIGINT: sigint_effect, signal.SIGTERM: sigterm_effect}
        if hasattr(signal, "SIGHUP"):
            self.effects[signal.SIGHUP] = sighup_effect
        self._pending: dict[int, bool] = {s: False for s in self.effects}
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalHandler:
        if threading.current_thread() is threading.main_thread():
            for sig in self.effects:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        effect = self.effects[signal.Signals(signum)]
        if effect in (STOP, SNAPSHOT_STOP) and interrupts.waiting():
            # the main thread waits for a read that may never come (a stalled input): stop
            # now, as of the last finished iteration, instead of at the end of this one
            raise interrupts.Interrupted(effect)
        self._pending[signum] = True

    def requested_action(self) -> str:
        """The pending effect (SIGINT's, then SIGTERM's, then SIGHUP's), cleared once
        returned."""
        for sig, effect in self.effects.items():
            if self._pending[sig]:
                self._pending[sig] = False
                return effect
        return NONE


def no_action() -> str:
    """The action callback when no handler is installed."""
    return NONE
