"""The solver: lr policies, the update rules, the training loop, snapshots and callbacks."""
from .callbacks import Callback, UpdateCallback
from .lr_policy import learning_rate
from .roles import AVERAGING_WORKER, HOST_ROOT, ROOT, WORKER, Role, Seeds, StepFn, eager_step
from .rules import RULES, Updater
from .signals import SignalHandler
from .snapshot import load_state, load_weights, snapshot_paths
from .solver import Solver

__all__ = ["AVERAGING_WORKER", "Callback", "HOST_ROOT", "ROOT", "RULES", "Role", "Seeds",
           "SignalHandler", "Solver", "StepFn", "UpdateCallback", "Updater", "WORKER",
           "eager_step", "learning_rate", "load_state", "load_weights", "snapshot_paths"]
