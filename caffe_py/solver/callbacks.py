"""The hooks through which parallel training plugs into a Solver (Caffe's Solver::Callback).

The solver calls every callback's ``on_start`` before the forward passes of an iteration and
``on_gradient_ready`` after the iter_size backward passes, before the update; a callback that
also has ``on_update_applied`` is called after the update (or, on a replica that applies none,
after ``on_gradient_ready``), before the iteration is counted, snapshotted or tested (model
averaging plugs in there). A replica that must not update its own weights (a non-root replica
that receives them from its parent) is built with a role whose ``applies_updates`` is False.
The solver never knows how many devices exist.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .solver import Solver


class Callback(Protocol):
    """What a callback implements; both hooks run on the thread driving the solver."""

    def on_start(self, solver: Solver) -> None:
        """Before forward: e.g. wait for the parent's weights, then pass them to children."""

    def on_gradient_ready(self, solver: Solver) -> None:
        """After backward: e.g. add the children's gradients, send the sum to the parent."""


class UpdateCallback(Callback, Protocol):
    """A callback that also acts after the update (its ``on_update_applied`` is optional)."""

    def on_update_applied(self, solver: Solver) -> None:
        """After the update: e.g. average the replicas' weights every K iterations."""
