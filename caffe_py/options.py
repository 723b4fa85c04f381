"""The options of one training run besides the solver and the devices (``cpy train``'s
flags), shared by the run layer (caffe_py/train.py) and the strategies in caffe_py/parallel/."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .errors import SolverError
from .solver.signals import EFFECTS, SNAPSHOT, SNAPSHOT_STOP, STOP

if TYPE_CHECKING:
    from .solver.solver import ProgressFactory

REDUCTIONS = ("auto", "tree", "nccl")
GRAPHS = ("auto", "on", "off")
COMPILES = ("auto", "on", "off")
DIST_BACKENDS = ("nccl", "gloo")
DEFAULT_DIST_TIMEOUT_S = 900.0
"""Long enough for rank 0's test phase, during which the other hosts' roots wait."""


@dataclass
class TrainOptions:
    """What ``cpy train`` passes to :func:`train` besides the solver and the devices."""

    weights: list[str] = field(default_factory=list)
    """Weights files to start from (fine-tuning), copied by layer name in order."""
    snapshot: str | None = None
    """A .solverstate file to resume from (exclusive with ``weights``), or 'latest': the
    newest state of the solver's snapshot_prefix that loads."""
    overwrite: bool = False
    """Start a new run over a snapshot_prefix that already has snapshots (refused without)."""
    sigint_effect: str = STOP
    sighup_effect: str = SNAPSHOT
    sigterm_effect: str = SNAPSHOT_STOP
    """What SIGTERM (a cluster's preemption) does: by default a snapshot, then the end."""
    precision: str | None = None
    """Overrides the solver's ``precision`` (FLOAT32 | BF16) when set."""
    reduction: str = "auto"
    """Multi-device gradient reduction: 'tree' (Caffe rc3's P2PSync: the root sums, updates
    and sends the weights down), 'nccl' (NCCL's all-reduce), or 'auto': on GPUs of one host
    with CUDA graphs, every replica's whole iteration captured with NCCL's all-reduce inside
    (parallel/captured.py), else the tree."""
    graphs: str = "auto"
    """CUDA graphs: 'auto' (capture whenever the net allows it, else say why and run eagerly),
    'on' (as auto, but a net that cannot be captured is an error), 'off' (eager)."""
    deterministic: bool = False
    """Bit-identical runs on GPUs too: deterministic cuDNN algorithms and PyTorch kernels
    (slower on some nets; docs/performance.md says which step breaks it otherwise); on the
    CPU, the thread count sized at the start is kept, not changed with other processes' load
    (a CPU run's sums follow its thread count: caffe_py/cpu_threads.py)."""
    compile: str = "auto"
    """torch.compile (inductor) for the TRAIN net's forward and backward: 'on' (before the
    first iteration), 'off', or 'auto': on one GPU with graphs, once the step time is
    measured, when the iterations left would take more than half an hour
    (:class:`~caffe_py.solver.roles.AutoCompile`). The compiled step is captured as a CUDA
    graph as usual. ``True``/``False`` are read as 'on'/'off'."""
    dist_backend: str | None = None
    """Between hosts (WORLD_SIZE > 1): nccl or gloo (default: nccl on GPUs, gloo on CPUs)."""
    dist_timeout: float = DEFAULT_DIST_TIMEOUT_S
    """Between hosts: seconds any wait for another host may take."""
    tensorboard: str | None = None
    """A directory for TensorBoard event files (the metrics table's values as scalars)."""
    progress: ProgressFactory | None = None
    """The command's progress display (a terminal bar), advanced once per iteration."""
    inputs: Mapping[str, Any] | None = None
    """From Python (``train_solver(..., inputs={"data": x, "label": y})``): arrays by top name
    for the TRAIN net's in-memory source, a MemoryData layer with those tops (see
    :meth:`~caffe_py.solver.solver.Solver.feed`)."""
    test_inputs: Mapping[str, Any] | None = None
    """The same for the TEST nets' MemoryData layers."""

    def __post_init__(self) -> None:
        if isinstance(self.compile, bool):
            self.compile = "on" if self.compile else "off"
        for name, value, allowed in (("reduction", self.reduction, REDUCTIONS),
                                     ("graphs", self.graphs, GRAPHS),
                                     ("compile", self.compile, COMPILES),
                                     ("sigint_effect", self.sigint_effect, EFFECTS),
                                     ("sighup_effect", self.sighup_effect, EFFECTS),
                                     ("sigterm_effect", self.sigterm_effect, EFFECTS)):
            if value not in allowed:
                raise SolverError(f"{name} '{value}' is not one of {', '.join(allowed)}")
        if self.dist_backend not in (None, *DIST_BACKENDS):
            raise SolverError(f"dist_backend '{self.dist_backend}' is not one of "
                              f"{', '.join(DIST_BACKENDS)}")
