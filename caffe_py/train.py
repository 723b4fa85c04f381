"""The run layer: :func:`train`, what ``cpy train`` and ``caffe_py.train_solver`` both call
(Caffe's tools/caffe.cpp ``train()``). Every run policy lives here, once:

1. the start files: ``--weights`` xor ``--snapshot``, each of the right kind and existing
   (``--snapshot latest`` is resolved later, under the prefix's lock);
2. the solver: loaded with its ``--set`` overrides (or taken as given), the devices it runs on;
3. the snapshot prefix (:class:`RunFiles`, the leading process only: the one process of a
   run, or rank 0 of several hosts): writable, locked for the life of the run (a second run
   on it is refused, naming the live one's pid), temporaries of an interrupted snapshot
   removed, ``--snapshot latest`` resolved to the newest state that loads, a new run over
   existing snapshots refused unless ``overwrite``;
4. the seed (a clock seed drawn once for every replica; a resume keeps the one its state
   was trained with) and the precision override;
5. the announcement: the seed and the resolved solver and net printed, and written as
   ``<prefix>_solver.yaml`` / ``_net.yaml`` (a resume writes ``<prefix>_resume_<N>_...``, so
   the first run's files keep its settings);
6. the strategy for the devices (caffe_py/strategies.py), run under the signal handler; a run
   that fails before its first snapshot takes away what it made (files without rows,
   directories it created).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch

from .devices import DeviceLike, check_devices, describe, parse_devices, prepare_host
from .errors import CaffePyError, SolverError
from .fileio import PathLock, atomic_write_bytes, exists, remove_stale_temporaries
from .limits import one_line_limits
from .options import TrainOptions
from .solver import snapshot as snap
from .solver.metrics import metrics_path
from .solver.signals import SignalHandler
from .solver.solver import Solver, resolve_seed
from .spec.overrides import Resolved, load_with_overrides, resolved_of, resolved_specs
from .spec.solver_spec import SolverParameter
from .strategies import choose_strategy, leads

log = logging.getLogger(__name__)

SolverSource = str | os.PathLike | SolverParameter | Resolved
"""A solver file (YAML or prototxt), a parsed SolverParameter, or one with its overrides."""


def train(solver: SolverSource, devices: str | Sequence[DeviceLike] | None = None,
          options: TrainOptions | None = None, *, sets: Sequence[str] = ()) -> Solver:
    """Train ``solver`` (with ``sets``, ``--set`` overrides) on ``devices`` (``--gpus`` text,
    a list of devices, or None: the solver's solver_mode and device_id) as ``cpy train``
    does; returns the root's Solver when training ends (see the module docstring)."""
    options = options or TrainOptions()
    check_start_files(options)
    resolved = resolve(solver, sets)
    devices = run_devices(devices, resolved.param)
    log.info(f"Using {describe(devices)}")
    files = RunFiles(resolved.param.snapshot_prefix, leads=leads())
    with files.claimed(), one_line_limits():
        options = files.start_point(options)
        param = prepared(resolved.param, options)
        files.announce(resolved, param, options)
        strategy = choose_strategy(devices, options)
        if options.deterministic:
            make_deterministic()
        prepare_host(devices)
        with SignalHandler(options.sigint_effect, options.sighup_effect,
                           options.sigterm_effect) as signals:
            return strategy.run(param, signals.requested_action)


def check_start_files(options: TrainOptions) -> None:
    """--weights must name weights and --snapshot a solver state (or 'latest'), both existing
    files, and not both at once."""
    if options.weights and options.snapshot:
        raise SolverError("--weights and --snapshot are exclusive: --weights starts a new run "
                          "from those weights, --snapshot resumes one; give only one")
    for path in options.weights:
        if snap.is_state_path(path):
            raise SolverError(f"{path} is a solver state, not weights; pass it to --snapshot "
                              "to resume training")
    if options.snapshot == "latest":
        return
    if options.snapshot and not snap.is_state_path(options.snapshot):
        raise SolverError(f"{options.snapshot} is not a solver state (its name has no "
                          "'.solverstate'); pass weights to --weights, or give the "
                          "<prefix>_iter_<N>.solverstate.pt file to --snapshot")
    for path in [*options.weights, *([options.snapshot] if options.snapshot else [])]:
        if not exists(path):
            raise snap.not_found(path)
        snap.require_regular(Path(path), "weights" if path in options.weights else
                             "a solver state")


def resolve(solver: SolverSource, sets: Sequence[str] = ()) -> Resolved:
    """The solver with its overrides, and the YAML data of it and its net."""
    if isinstance(solver, Resolved):
        resolved = solver
    elif isinstance(solver, SolverParameter):
        resolved = resolved_of(solver)
    else:
        return load_with_overrides(os.fspath(solver), sets)
    if sets:
        raise SolverError("--set overrides apply to a solver file; this solver is already "
                          "parsed: change its fields instead")
    return resolved


def run_devices(devices: str | Sequence[DeviceLike] | None,
                param: SolverParameter) -> list[torch.device]:
    """The devices of the run: ``--gpus`` text or None (parse_devices, the solver's
    solver_mode/device_id by default), or a list (checked)."""
    if devices is None or isinstance(devices, str):
        return parse_devices(devices, solver_mode=param.solver_mode, device_id=param.device_id)
    return check_devices(devices)


def prepared(param: SolverParameter, options: TrainOptions) -> SolverParameter:
    """The solver as the run uses it: the precision override applied, and a seed drawn from
    the clock (random_seed -1) fixed once for every replica, or, on a resume, the seed the
    state was trained with (its crops and mirrors go on as they were)."""
    seed = param.random_seed
    if seed < 0 and options.snapshot:
        saved = snap.state_seed(options.snapshot)
        seed = seed if saved is None else saved
    return dataclasses.replace(param, random_seed=resolve_seed(seed),
                               precision=options.precision or param.precision)


def make_deterministic() -> None:
    """Deterministic cuDNN algorithms (no benchmark search) and PyTorch kernels; an op that has
    none warns once instead of failing."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True, warn_only=True)


class RunFiles:
    """What a run does with its snapshot prefix, before and after training (module docstring,
    points 3, 5 and 6). Only the leading process touches the files; the others only log."""

    def __init__(self, prefix: str, leads: bool = True):
        self.prefix, self.leads = prefix, leads
        self.lock = PathLock(prefix, f"snapshot_prefix {prefix}",
                             "wait for that run to end, or change snapshot_prefix")
        self.made: list[Path] = []
        """Directories the run creates (innermost first), removed after a failed start."""
        self.written: list[Path] = []
        """Files written at the start, removed after a failed start when they hold no rows."""
        self.states_before: list[tuple[int, Path]] = []

    @contextlib.contextmanager
    def claimed(self) -> Iterator[RunFiles]:
        """The prefix locked for the run (leading process); after a failure before the first
        snapshot, what the start made is taken away."""
        if not self.leads:
            yield self
            return
        self.made = [d for d in Path(self.prefix).parents if not d.exists()]
        snap.check_writable(self.prefix)
        try:
            with self.lock:
                self.states_before = snap.states_of(self.prefix)
                metrics = metrics_path(self.prefix)
                if not metrics.exists():
                    self.written.append(metrics)
                for stale in remove_stale_temporaries(f"{self.prefix}_iter_"):
                    log.info(f"Removed {stale.name}, left by an interrupted snapshot")
                try:
                    yield self
                except CaffePyError:
                    self._tidy_failed_start()
                    raise
        except CaffePyError:
            self._remove_made_directories()   # after the lock file went
            raise

    def start_point(self, options: TrainOptions) -> TrainOptions:
        """The options with ``--snapshot latest`` resolved to the newest state that loads; a
        new run over a prefix that has states is refused unless ``overwrite``."""
        if options.snapshot == "latest":
            path, skipped = snap.latest_state(self.prefix)
            for line in skipped:
                log.warning(line)
            log.info(f"--snapshot latest: {path}")
            return dataclasses.replace(options, snapshot=str(path))
        if self.leads and self.states_before and not options.snapshot and \
                not options.overwrite:
            raise SolverError(f"snapshot_prefix {self.prefix} already has snapshots (the "
                              f"newest: {self.states_before[0][1].name}); resume with "
                              "--snapshot latest, start over with --overwrite, or change "
                              "snapshot_prefix")
        return options

    def announce(self, resolved: Resolved, param: SolverParameter,
                 options: TrainOptions) -> None:
        """Print the seed and the resolved solver and net (as Caffe prints the parameters it
        starts from), and write them beside the snapshots: ``cpy train --solver
        <prefix>_solver.yaml`` repeats the run."""
        stem = self.prefix
        if options.snapshot:   # a resume keeps the first run's files as they are
            stem = f"{self.prefix}_resume_{snap.iteration_of(options.snapshot)}"
        solver_text, net_text = resolved_specs(resolved, param, stem)
        log.info(f"Random seed: {param.random_seed}")
        log.info("Initializing solver from parameters:\n" + solver_text.rstrip())
        if net_text is not None:
            log.info("Initializing net from parameters:\n" + net_text.rstrip())
        if not self.leads:
            return
        for path, text in ((Path(f"{stem}_solver.yaml"), solver_text),
                           (Path(f"{stem}_net.yaml"), net_text)):
            if text is not None:
                atomic_write_bytes(path, text.encode())
                self.written.append(path)

    def _tidy_failed_start(self) -> None:
        """A run that failed before writing a snapshot takes away what its start made: its
        resolved specs, a metrics table with no rows, directories left empty. Files that
        hold rows stay: they are the evidence of what went wrong."""
        if snap.states_of(self.prefix) != self.states_before:
            return
        for path in self.written:
            if path.suffix == ".csv" and _holds_rows(path):
                continue
            path.unlink(missing_ok=True)

    def _remove_made_directories(self) -> None:
        for directory in self.made:  # innermost first; only those the run left empty
            if directory.is_dir() and not any(directory.iterdir()):
                directory.rmdir()


def _holds_rows(path: Path) -> bool:
    """Whether a CSV table has a row below its header."""
    try:
        with path.open("rb") as f:
            return len(f.read(1 << 16).splitlines()) > 1
    except OSError:
        return False
