"""The solver: lr policies, the update rules, the training loop, snapshots and callbacks."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .callbacks import Callback
    from .lr_policy import learning_rate
    from .rules import RULES, Updater
    from .signals import SignalHandler
    from .snapshot import load_state, load_weights, snapshot_paths
    from .solver import Solver, TrainOptions, train

# name -> the submodule that defines it. Imported on first use, so that a torch-free submodule
# (signals, whose EFFECTS the CLI's help lists) does not pull torch in through this package.
_EXPORTS = {
    "Callback": "callbacks", "learning_rate": "lr_policy", "RULES": "rules", "Updater": "rules",
    "SignalHandler": "signals", "load_state": "snapshot", "load_weights": "snapshot",
    "snapshot_paths": "snapshot", "Solver": "solver", "TrainOptions": "solver", "train": "solver",
}

__all__ = ["Callback", "RULES", "SignalHandler", "Solver", "TrainOptions", "Updater",
           "learning_rate", "load_state", "load_weights", "snapshot_paths", "train"]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
