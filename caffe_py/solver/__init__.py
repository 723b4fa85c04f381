"""The solver: lr policies, the update rules, the training loop, snapshots and callbacks."""
from .callbacks import Callback
from .lr_policy import learning_rate
from .rules import RULES, Updater
from .signals import SignalHandler
from .snapshot import load_state, load_weights, snapshot_paths
from .solver import Solver, TrainOptions, train

__all__ = ["Callback", "RULES", "SignalHandler", "Solver", "TrainOptions", "Updater",
           "learning_rate", "load_state", "load_weights", "snapshot_paths", "train"]
