"""The hooks through which parallel training plugs into a Solver (Caffe's Solver::Callback).

The solver calls every callback's ``on_start`` before the forward passes of an iteration and
``on_gradient_ready`` after the iter_size backward passes, before the update. A replica that
must not update its own weights (a non-root replica that receives them from its parent) is
built with ``applies_updates=False``. The solver never knows how many devices exist.
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
