"""The Solver: Caffe's Solver::Solve / Step / Test / Snapshot / Restore on one device.

One Solver drives one replica: it builds the TRAIN net (and, when asked, the TEST nets, which
share the TRAIN net's weights), attaches the data readers, and runs iterations::

    test (every test_interval) -> callbacks.on_start -> iter_size x forward/backward ->
    smoothed loss -> display -> callbacks.on_gradient_ready -> update (rate -> clip ->
    normalize -> regularize -> rule) -> it += 1 -> signal action / snapshot

Parallel training builds one Solver per replica (``replica=i``; non-root replicas with
``applies_updates=False``, no test nets, no display) and drives each from its own thread with
:meth:`Solver.iteration`; the solver itself never knows how many devices exist.

Per-iteration cost is kept to the math: the loss is accumulated on the device, and the only
host syncs are at display, test and snapshot time (non-finite losses are recorded on the device
and reported there, naming the first bad iteration).
"""
from __future__ import annotations

import contextlib
import copy
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import SolverError
from ..net import Net, NetOutput
from ..spec.solver_spec import SolverParameter
from . import snapshot as snap
from .callbacks import Callback
from .evaluate import format_output_lines, run_batches
from .lr_policy import learning_rate
from .rules import Updater
from .signals import NONE, SNAPSHOT, STOP, SignalHandler, no_action

Log = Callable[[str], None]


@dataclass
class TrainOptions:
    """What ``cpy train`` passes to the single-device path or to parallel training."""

    weights: list[str] = field(default_factory=list)
    """Weights files to start from (fine-tuning), copied by layer name in order."""
    snapshot: str | None = None
    """A .solverstate file to resume from (exclusive with ``weights``)."""
    sigint_effect: str = STOP
    sighup_effect: str = SNAPSHOT
    precision: str | None = None
    """Overrides the solver's ``precision`` (FLOAT32 | BF16) when set."""
    reduction: str = "tree"
    """Multi-device gradient reduction: 'tree' (Caffe rc3's P2PSync) or 'nccl'."""
    cuda_graphs: bool = False
    """Run each GPU replica's forward/backward as one CUDA graph replay (caffe_py.parallel)."""


def resolve_seed(random_seed: int) -> int:
    """Caffe's random_seed: -1 means a seed from the clock."""
    return random_seed if random_seed >= 0 else time.time_ns() % (2**31)


def memory_format_for(name: str, device: torch.device) -> torch.memory_format:
    """The solver's ``memory_format`` field on ``device`` (AUTO: channels_last on CUDA)."""
    if name == "CHANNELS_LAST" or (name == "AUTO" and device.type == "cuda"):
        return torch.channels_last
    return torch.contiguous_format


def stdout_log(message: str) -> None:
    print(message, flush=True)


class Solver:
    """Trains one replica's nets; see the module docstring for the loop."""

    def __init__(self, param: SolverParameter, *, device: str | torch.device = "cpu",
                 replica: int = 0, callbacks: Sequence[Callback] = (), seed: int | None = None,
                 test_nets: bool | None = None, verbose: bool | None = None,
                 pool: Any = None, action: Callable[[], str] = no_action,
                 log: Log = stdout_log, precision: str | None = None,
                 data_seed: int | None = None):
        self.param = param
        self.device = torch.device(device)
        self.replica = replica
        self.callbacks = list(callbacks)
        self.applies_updates = True
        self.verbose = replica == 0 if verbose is None else verbose
        self.action = action
        self.log = log
        self.precision = precision or param.precision
        self.seed = resolve_seed(param.random_seed) + replica if seed is None else seed
        self.data_seed = self.seed if data_seed is None else data_seed  # Data crops, mirrors
        if replica == 0:
            torch.manual_seed(self.seed)
        self.iter = 0
        self.current_step = 0
        self.stop_requested = False
        self.last_test: list[dict[str, torch.Tensor]] = []
        self._pools: list[Any] = []
        self._started = False
        self._bar = None

        spec, state = param.train_net_spec()
        if self.device.type == "cuda":  # the net's shapes are fixed: let cuDNN pick its kernels
            torch.backends.cudnn.benchmark = True
        self.net = self._build(spec, "TRAIN", state)
        self.memory_format = memory_format_for(param.memory_format, self.device)
        # Before the Updater exists, so its history takes the weights' layout; the TEST nets
        # share these Parameters.
        self.net.to(memory_format=self.memory_format)
        learnable = self.net.learnable_params()
        self.updater = Updater(param, [lp.param for lp in learnable],
                               [(lp.lr_mult, lp.decay_mult) for lp in learnable])
        self.pool = self._attach(self.net, pool)
        build_tests = (replica == 0) if test_nets is None else test_nets
        self.test_nets: list[Net] = []
        self._test_pool = self.pool if self.pool in self._pools else None
        if build_tests:
            for spec, state in param.test_net_specs():
                net = self._build(spec, "TEST", state)
                net.share_weights_with(self.net)
                self.test_nets.append(net)
                self._test_pool = self._attach(net, self._test_pool)
        window = max(param.average_loss, 1)
        self._losses = torch.zeros(window, device=self.device)
        self._n_losses = 0
        self._bad_iter = torch.full((), -1, dtype=torch.long, device=self.device)
        self._last_display = (time.perf_counter(), 0)

    # --- building -----------------------------------------------------------------------------
    def _build(self, spec, phase: str, state) -> Net:
        net = Net(spec, phase, stages=state.stage, level=state.level, device=self.device,
                  seed=self.seed)
        inputs = [layer.name for layer in net.layers if layer.spec.type == "Input"]
        if inputs:
            raise SolverError(f"the {phase} net '{net.name}' has Input layer '{inputs[0]}', "
                              "which nothing feeds during training; read data with a Data "
                              "(or DummyData) layer")
        return net

    def _attach(self, net: Net, pool: Any) -> Any:
        """The readers for ``net``'s Data layers: ``pool`` when given, else one we own.

        A shared pool (parallel training) serves this replica's TRAIN net; our own pool serves
        the TEST nets too, so a TRAIN and a TEST net may read one database.
        """
        if not net.data_layers():
            return pool
        if pool is None:
            from ..io import ReaderPool

            pool = ReaderPool(replicas=1)
            self._pools.append(pool)
        from ..io import attach_feeds

        replica = 0 if pool in self._pools else self.replica
        attach_feeds(net, pool, replica=replica, device=self.device, seed=self.data_seed)
        return pool

    def start(self) -> None:
        """Start the readers this solver owns (after any restore); idempotent."""
        if not self._started:
            self._started = True
            for pool in self._pools:
                pool.start()

    def close(self) -> None:
        for pool in self._pools:
            pool.close()

    def __enter__(self) -> Solver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the loop -----------------------------------------------------------------------------
    def solve(self, resume_file: str | None = None) -> None:
        """Caffe's Solver::Solve: train to max_iter, snapshot, and show the final numbers."""
        p = self.param
        if self.verbose:
            snap.check_writable(p.snapshot_prefix)
        self.log(f"Solving {self.net.name}")
        self.log(f"Learning Rate Policy: {p.lr_policy}")
        if resume_file:
            self.restore(resume_file)
        self.start()
        with self._progress():
            self.step(p.max_iter - self.iter)
        if p.snapshot_after_train and (not p.snapshot or self.iter % p.snapshot != 0):
            self.snapshot()
        if self.stop_requested:
            self.log("Optimization stopped early.")
            return
        self._check_finite()
        if p.display and self.iter % p.display == 0:
            with torch.no_grad(), self._autocast():
                loss = self.net().loss.detach().float()
            self._track_loss(loss)
            self.log(f"Iteration {self.iter}, loss = {self.smoothed_loss():g}")
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        self.log("Optimization Done.")

    def step(self, iters: int) -> None:
        """Run ``iters`` iterations (fewer when a stop is requested)."""
        stop_iter = self.iter + iters
        while self.iter < stop_iter and not self.stop_requested:
            self.iteration()

    def iteration(self) -> None:
        """One iteration of Caffe's Step loop (test if due, train, update, act, snapshot)."""
        p = self.param
        self.start()
        if (self.test_nets and p.test_interval and self.iter % p.test_interval == 0
                and (self.iter > 0 or p.test_initialization)):
            self.test_all()
            if self.stop_requested:
                return
        for cb in self.callbacks:
            cb.on_start(self)
        display = self.verbose and p.display > 0 and self.iter % p.display == 0
        self._zero_grads()
        loss, out = self._forward_backward()
        self._track_loss(loss)
        if display:
            self._display(out)
        for cb in self.callbacks:
            cb.on_gradient_ready(self)
        if self.applies_updates:
            rate = self._rate()
            self.updater.apply(rate, self.iter)
            if display:
                self.log(f"Iteration {self.iter}, lr = {rate:g}")
        self.iter += 1
        if self._bar is not None:
            self._bar.update(1)
        request = self.action()
        if (p.snapshot and self.iter % p.snapshot == 0 and self.verbose) or request == SNAPSHOT:
            self.snapshot()
        if request == STOP:
            self.stop_requested = True

    def _forward_backward(self) -> tuple[torch.Tensor, NetOutput]:
        """Mean loss (on the device) over iter_size passes; gradients accumulate."""
        total = torch.zeros((), device=self.device)
        out = None
        for _ in range(self.param.iter_size):
            with self._autocast():
                out = self.net()
            if out.loss.requires_grad:
                out.loss.backward()
            total += out.loss.detach().float()
        return total / self.param.iter_size, out

    def _zero_grads(self) -> None:
        # In place: gradients may be views into a parallel replica's flat buffer.
        grads = [w.grad for w in self.updater.params if w.grad is not None]
        if grads:
            torch._foreach_zero_(grads)

    def _rate(self) -> float:
        rate, self.current_step = learning_rate(self.param, self.iter, self.current_step)
        return rate

    def _autocast(self):
        if self.precision == "BF16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # --- loss tracking and display ------------------------------------------------------------
    def _track_loss(self, loss: torch.Tensor) -> None:
        """Caffe's UpdateSmoothedLoss as a ring buffer on the device (no host sync)."""
        self._losses[self._n_losses % self._losses.numel()] = loss
        self._n_losses += 1
        bad = ~torch.isfinite(loss) & (self._bad_iter < 0)
        self._bad_iter = torch.where(bad, self.iter, self._bad_iter)

    def smoothed_loss(self) -> float:
        """The mean of the last average_loss losses (a host sync)."""
        n = min(self._n_losses, self._losses.numel())
        return float(self._losses[:n].mean()) if n else 0.0

    def _display(self, out: NetOutput) -> None:
        self._check_finite()
        now = time.perf_counter()
        then, last_iter = self._last_display
        lapse = now - then
        per_s = (self.iter - last_iter) / lapse if lapse > 0 else 0.0
        self._last_display = (now, self.iter)
        self.log(f"Iteration {self.iter} ({per_s:g} iter/s, {lapse:.3f}s/{self.param.display} "
                 f"iters), loss = {self.smoothed_loss():g}")
        values = {name: t.detach().float().reshape(-1) for name, t in out.outputs.items()}
        for line in format_output_lines("Train net output", values, self.net.loss_weights):
            self.log(f"    {line}")

    def _check_finite(self) -> None:
        bad = int(self._bad_iter)
        if bad >= 0:
            raise SolverError(f"iteration {bad}: the loss is not finite (NaN or inf); training "
                              "stopped and no snapshot was written after it; lower base_lr, "
                              "set clip_gradients, or check the data")

    @contextlib.contextmanager
    def _progress(self) -> Iterator[None]:
        """A tqdm bar on a terminal (display lines go above it); plain lines otherwise."""
        if not (self.verbose and sys.stdout.isatty()):
            yield
            return
        from tqdm import tqdm

        log = self.log
        self._bar = tqdm(total=self.param.max_iter, initial=self.iter, unit="it",
                         dynamic_ncols=True, leave=False)
        self.log = lambda msg: self._bar.write(msg)
        try:
            yield
        finally:
            self._bar.close()
            self._bar, self.log = None, log

    # --- testing ------------------------------------------------------------------------------
    def test_all(self) -> list[dict[str, torch.Tensor]]:
        """Caffe's TestAll: every test net for its test_iter batches; the mean outputs."""
        self.start()
        self.last_test = []
        for k, net in enumerate(self.test_nets):
            self.log(f"Iteration {self.iter}, Testing net (#{k})")
            means = run_batches(net, self.param.test_iter[k], autocast=self._autocast,
                                between=self._test_action)
            if means is None:  # stopped by a signal
                return self.last_test
            self.last_test.append(means)
            for line in format_output_lines("Test net output", means, net.loss_weights):
                self.log(f"    {line}")
        return self.last_test

    def _test_action(self) -> bool:
        """Caffe checks signals between test batches; True means stop testing."""
        request = self.action()
        while request != NONE:
            if request == SNAPSHOT:
                self.snapshot()
            elif request == STOP:
                self.stop_requested = True
            request = self.action()
        return self.stop_requested

    # --- weights, snapshots, resume -----------------------------------------------------------
    def load_weights(self, paths: Sequence[str]) -> None:
        """Fine-tune: copy layers by name from each weights file in order (Caffe's CopyLayers)."""
        for path in paths:
            self.log(f"Finetuning from {path}")
            result = self.net.copy_from(snap.load_weights(path), source=path)
            for name in result.ignored:
                self.log(f"Ignoring source layer {name}")

    def snapshot(self) -> tuple[Path, Path]:
        """Write the weights and the solver state for the current iteration."""
        self._check_finite()
        if not all(bool(torch.isfinite(w).all()) for w in self.updater.params):
            raise SolverError(f"iteration {self.iter}: the weights are not finite; no snapshot "
                              "was written; lower base_lr or set clip_gradients")
        weights, state = snap.snapshot_paths(self.param.snapshot_prefix, self.iter,
                                             self.param.snapshot_format)
        self.log(f"Snapshotting to {weights}")
        types = {layer.name: layer.spec.type for layer in self.net.layers}
        snap.save_weights(self.net.layer_blobs(), weights, types, self.net.name)
        self.log(f"Snapshotting solver state to {state}")
        snap.save_state(self.state_dict(weights.name), state)
        return weights, state

    def state_dict(self, learned_net: str = "") -> dict[str, Any]:
        """Everything a resume needs, as tensors and plain values (see snapshot.py)."""
        return {
            "iter": self.iter,
            "current_step": self.current_step,
            "learned_net": learned_net,
            "type": self.param.type,
            "history": [h.detach().cpu() for h in self.updater.history],
            "rng": self._rng_state(),
            "data": self.pool.state_dict() if self.pool is not None else None,
            "test_data": (self._test_pool.state_dict() if self._test_pool not in (None, self.pool)
                          else None),
        }

    def restore(self, path: str) -> None:
        """Caffe's Restore: weights, iteration, current_step, history, RNGs, data positions."""
        if self._started:
            raise SolverError(f"{path}: restore before the first iteration")
        self.log(f"Restoring previous solver status from {path}")
        state = snap.load_state(path)
        weights = snap.weights_path_of(state, path)
        if not weights.is_file():
            raise SolverError(f"{path}: its weights file {weights} is missing; keep the "
                              "<prefix>_iter_<N> weights next to the solver state")
        if state.get("type") not in (None, self.param.type):  # None: written by Caffe
            raise SolverError(f"{path}: saved by a {state.get('type')} solver, this one is "
                              f"{self.param.type}; resume with the same solver type")
        self.net.copy_from(snap.load_weights(weights), source=weights)
        self.updater.load_history(state["history"], str(path))
        self.iter, self.current_step = state["iter"], state["current_step"]
        self._load_rng_state(state.get("rng") or {})
        if self.pool is not None and state.get("data"):
            self.pool.load_state_dict(state["data"])
        if self._test_pool not in (None, self.pool) and state.get("test_data"):
            self._test_pool.load_state_dict(state["test_data"])
        self._last_display = (time.perf_counter(), self.iter)

    def _generators(self) -> dict[str, torch.Generator]:
        """Every generator a layer keeps for itself (DummyData...), by net and layer."""
        nets = [("train", self.net)] + [(f"test{k}", n) for k, n in enumerate(self.test_nets)]
        return {f"{tag}/{layer.name}.{attr}": value
                for tag, net in nets for layer in net.layers
                for attr, value in vars(layer).items() if isinstance(value, torch.Generator)}

    def _rng_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"torch": torch.get_rng_state(),
                                 "layers": {k: g.get_state()
                                            for k, g in self._generators().items()}}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def _load_rng_state(self, state: dict[str, Any]) -> None:
        if "torch" in state:
            torch.set_rng_state(state["torch"])
        if "cuda" in state and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], self.device)
        generators = self._generators()
        for key, value in (state.get("layers") or {}).items():
            if key in generators:
                generators[key].set_state(value)

    # --- facts for the start-of-run banner ------------------------------------------------------
    def batch_size(self) -> int:
        """Records per forward pass of this replica: the first top of the first source layer."""
        for layer in self.net.layers:
            if not layer.spec.bottom and layer.top_shapes and layer.top_shapes[0]:
                return int(layer.top_shapes[0][0])
        return 0


def check_start_files(options: TrainOptions) -> None:
    """--weights must name weights and --snapshot a solver state, both existing files."""
    for path in options.weights:
        if snap.is_state_path(path):
            raise SolverError(f"{path} is a solver state, not weights; pass it to --snapshot "
                              "to resume training")
    if options.snapshot and not snap.is_state_path(options.snapshot):
        raise SolverError(f"{options.snapshot} is not a solver state (its name has no "
                          "'.solverstate'); pass weights to --weights, or give the "
                          "<prefix>_iter_<N>.solverstate.pt file to --snapshot")
    for path in [*options.weights, *([options.snapshot] if options.snapshot else [])]:
        if not Path(path).is_file():
            raise SolverError(f"{path}: file not found; check the path")


def train(param: SolverParameter, devices: Sequence[torch.device], options: TrainOptions,
          log: Log = stdout_log) -> Solver | None:
    """The single-device path of ``cpy train`` (several devices go to caffe_py.parallel)."""
    if options.weights and options.snapshot:
        raise SolverError("--weights and --snapshot are both given; --weights starts a new run "
                          "from those weights, --snapshot resumes one: give only one")
    if options.precision:
        param = copy.copy(param)
        param.precision = options.precision
    check_start_files(options)
    snap.check_writable(param.snapshot_prefix)
    if len(devices) > 1:
        try:
            from ..parallel import train_replicated
        except ImportError:
            raise SolverError("multi-device training needs caffe_py.parallel") from None
        return train_replicated(param, list(devices), options)
    with SignalHandler(options.sigint_effect, options.sighup_effect) as signals, \
            Solver(param, device=devices[0], action=signals.requested_action,
                   log=log) as solver:
        batch = solver.batch_size()
        log(f"Batch: {batch} per replica x 1 replica x iter_size {param.iter_size} = "
            f"{batch * param.iter_size} per update (device {devices[0]}, precision "
            f"{solver.precision})")
        if options.weights:
            solver.load_weights(options.weights)
        solver.solve(options.snapshot)
        return solver
