"""The Solver: Caffe's Solver::Solve / Step / Test / Snapshot / Restore for one replica.

One Solver drives one replica on one device: it builds the TRAIN net (and, when its role
tests, the TEST nets, which share the TRAIN net's weights), attaches the data feeds, and runs
Caffe's Step. The Step is one composition of public seams, which every loop calls: the eager
:meth:`Solver.iteration`, the CUDA-graph loop (:mod:`.graph_loop`, whose replay holds the passes
and the update of several iterations) and a driver that issues several replicas' iterations
from one thread (parallel/lockstep.py)::

    begin_iteration()                 readers started; test_all() when due (role.tests);
                                      callbacks.on_start (weights flow down)
    passes()                          zero_grads(), then the step function's iter_size forward
                                      and backward passes: (mean loss, outputs)
    end_iteration(loss, outputs)      record the loss (on the device); display when due;
                                      callbacks.on_gradient_ready (gradients flow up);
                                      the update (role.applies_updates: rate -> clip ->
                                      normalize -> regularize -> rule), or the one a replay
                                      applied (``planned``); callbacks.on_update_applied;
                                      finish_iteration(): it += count, signals, snapshot

The solver never knows how many devices exist: parallel training builds one Solver per replica
with a :class:`~caffe_py.solver.roles.Role` and plugs in through the callbacks.

Per-iteration cost is kept to the math: the loss is accumulated on the device, and the only
host syncs are at display, test and snapshot time (non-finite losses are recorded on the device
and reported there, naming the first bad iteration).
"""
from __future__ import annotations

import contextlib
import logging
import os
import shlex
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from .. import interrupts
from ..errors import CaffePyError, SolverError, WriteError, one_line_reason
from ..net import Net, NetOutput
from ..spec.lr_policy import learning_rate
from ..spec.solver_spec import SolverParameter
from . import snapshot as snap
from .callbacks import Callback
from .detection_eval import detection_outputs, run_detection_batches
from .evaluate import format_output_lines, output_means, run_batches
from .loss_scale import LossScale
from .metrics import FIXED, MetricsFile, metrics_path, output_columns, seconds_at
from .monitor import Monitor
from .roles import ROOT, Role, Seeds, StepFn, eager_step
from .rules import Updater
from .signals import NONE, SNAPSHOT, SNAPSHOT_STOP, STOP, no_action

log = logging.getLogger(__name__)


class Runner(Protocol):
    """Something that runs a Solver's iterations instead of :meth:`Solver.iteration` (the
    CUDA-graph loop), through the same Step seams."""

    def run(self, solver: Solver, stop_iter: int) -> None:
        """Run at least one iteration (none past ``stop_iter``), with Caffe's bookkeeping."""
        ...

    def pause(self, solver: Solver) -> None:
        """The iterations stop for now (a ``step`` call ends): put back what the runner
        swapped in, so that the nets outside it (the final forward, a user's) read the real
        data; the next ``run`` swaps it in again."""
        ...


@dataclass(frozen=True)
class RatePlan:
    """The learning rates of the updates of ``len(rates)`` iterations from ``first_iter``,
    worked out before they run (a replay applies several updates at once), and Caffe's
    ``current_step`` after them (GetLearningRate moves it at each multistep boundary)."""

    first_iter: int
    rates: list[float]
    current_step: int


class TestBatches(Protocol):
    """Runs TEST net ``k`` (``net``, the root's) for ``iterations`` batches; the mean of
    every output (``__loss__`` too), or None when ``between`` stopped it (a signal). The
    default is :func:`~caffe_py.solver.evaluate.run_batches` on ``net`` itself; parallel
    training may spread the batches over its replicas (parallel/captured.py)."""

    def __call__(self, k: int, net: Net, iterations: int, *,
                 autocast: Callable[[], AbstractContextManager[Any]],
                 between: Callable[[], bool]) -> dict[str, torch.Tensor] | None: ...


def own_test_batches(k: int, net: Net, iterations: int, *,
                     autocast: Callable[[], AbstractContextManager[Any]],
                     between: Callable[[], bool]) -> dict[str, torch.Tensor] | None:
    """Every test batch on this replica's own net (Caffe: the root tests alone)."""
    return run_batches(net, iterations, autocast=autocast, between=between)


class Progress(Protocol):
    """A progress display the command supplies (e.g. a tqdm bar on a terminal)."""

    def update(self, n: int) -> None: ...


ProgressFactory = Callable[[int, int], AbstractContextManager[Progress]]
"""``factory(total, initial)``: a context manager giving the progress display of one solve."""


def resolve_seed(random_seed: int) -> int:
    """Caffe's random_seed: -1 means a seed from the clock."""
    return random_seed if random_seed >= 0 else time.time_ns() % (2**31)


CHANNELS_LAST_MIN_CHANNELS = 64
"""On CUDA, AUTO lays a net out channels_last when one of its convolutions reads at least this
many channels (see :func:`memory_format_for`)."""


def memory_format_for(name: str, device: torch.device | str = "cpu",
                      net: Net | None = None) -> torch.memory_format:
    """The solver's ``memory_format`` field for ``net`` on ``device``.

    AUTO is channels_last on CPUs (oneDNN's convolutions and the poolings run up to 1.7x
    faster in it, AlexNet at parity; docs/solver.md has the table). On CUDA it is
    channels_last where cuDNN's fastest convolutions want it, nets with a convolution at
    least CHANNELS_LAST_MIN_CHANNELS wide (ResNet-50 runs far faster in it), and NCHW for
    narrow nets: LeNet's CUDA graphs run at the same rate in both, and its eager steps 4-10%
    faster in NCHW (an H200, 2026-11-26: the flatten before an InnerProduct copies a
    channels_last blob, and cuDNN's NHWC calls cost more host time)."""
    if name == "CONTIGUOUS":
        return torch.contiguous_format
    if name == "CHANNELS_LAST" or torch.device(device).type != "cuda" or net is None:
        return torch.channels_last
    return torch.channels_last if _widest_convolution(net) >= CHANNELS_LAST_MIN_CHANNELS \
        else torch.contiguous_format


def _widest_convolution(net: Net) -> int:
    """The most channels a (de)convolution of ``net`` reads (0: it has none)."""
    widths = [0]
    for layer in net.layers:
        if layer.spec.type in ("Convolution", "Deconvolution") and layer.bottom_shapes:
            shape, axis = layer.bottom_shapes[0], getattr(layer, "axis", 1)
            if axis < len(shape):
                widths.append(shape[axis])
    return max(widths)


class Solver:
    """Trains one replica's nets; see the module docstring for the loop.

    ``seeds`` default to the solver's random_seed (the clock when -1) plus ``replica`` for the
    model and the seed itself for the data; ``pool`` is a shared reader pool (parallel
    training) for the TRAIN net, else the solver reads through a pool of its own; ``action``
    returns what a signal asks for after each iteration (see signals.py); ``step`` computes the
    forward and backward passes (default: :func:`~caffe_py.solver.roles.eager_step`);
    ``runner`` runs the iterations in place of :meth:`iteration` (the CUDA-graph loop);
    ``test_batches`` runs a TEST net's batches (default: on this replica's net);
    ``test_replicas`` > 1 makes the TEST nets' data readers serve that many replicas in turns
    of a batch (a test pass split over the replicas: the others' TEST nets are attached to
    :attr:`test_pool` by :class:`~caffe_py.parallel.captured.SplitTests`);
    ``inputs`` / ``test_inputs`` are arrays by top name for the nets' in-memory sources
    (:meth:`feed`).
    """

    def __init__(self, param: SolverParameter, *, device: str | torch.device = "cpu",
                 replica: int = 0, role: Role = ROOT, seeds: Seeds | None = None,
                 callbacks: Sequence[Callback] = (), pool: Any = None,
                 action: Callable[[], str] = no_action, step: StepFn = eager_step,
                 runner: Runner | None = None, test_batches: TestBatches = own_test_batches,
                 test_replicas: int = 1, inputs: Mapping[str, Any] | None = None,
                 test_inputs: Mapping[str, Any] | None = None):
        self.param = param
        self.device = torch.device(device)
        self.replica = replica
        self.role = role
        self.callbacks = list(callbacks)
        self.action = action
        self.step_fn = step
        """The passes' step function; the graph loop's automatic compile swaps it once."""
        self.runner = runner
        """Runs iterations in place of :meth:`iteration` (e.g. a CUDA-graph loop), if set."""
        self.test_batches = test_batches
        self.grads_in_place = False
        """Gradients keep their tensors between iterations (set by whoever binds them: a
        parallel sync's flat buffers, a CUDA graph's capture)."""
        self.backward_in_caller = True
        """The eager step's backward passes run on the calling thread
        (``torch.autograd.set_multithreading_enabled(False)``, thread-local), not on the
        autograd engine's thread for the device: in a launch-bound step the hand-off to that
        thread and back cost more than the backward's own host work saved (docs/performance.md).
        A parallel run's replicas keep the engine's threads, where their gradient hooks run."""
        if seeds is None:
            base = resolve_seed(param.random_seed)
            seeds = Seeds(model=base + replica, data=base)
        self.seeds = seeds
        if role.seeds_rng:
            torch.manual_seed(seeds.model)
        self.iter = 0
        self.current_step = 0
        self.stop_requested = False
        self.snapshot_on_stop = False  # a snapshot-stop signal: the end writes a snapshot
        self.last_snapshot: Path | str | None = None  # the newest whole solver state
        self.metrics: MetricsFile | None = None  # the run's CSV table (the reporting solver's)
        self.seconds_before = 0.0
        """The seconds the run had trained when its restored state was written (0 for a new
        run): the metrics table's clock goes on from there."""
        self.last_test: list[dict[str, torch.Tensor]] = []
        self._pools: list[Any] = []
        self._started = False
        self._progress: Progress | None = None

        spec, state = param.train_net_spec()
        if self.device.type == "cuda" and not torch.backends.cudnn.deterministic:
            torch.backends.cudnn.benchmark = True  # the shapes are fixed: let cuDNN pick
        self.net = self._build(spec, state.phase, state)
        self.memory_format = memory_format_for(param.memory_format, self.device, self.net)
        # Before the Updater exists, so its history takes the weights' layout; the TEST nets
        # share these Parameters.
        # Module.to takes memory_format; its stubs do not say so
        self.net.to(memory_format=self.memory_format)  # type: ignore[call-overload]
        learnable = self.net.learnable_params()
        self.updater = Updater(param, [lp.param for lp in learnable],
                               [(lp.lr_mult, lp.decay_mult) for lp in learnable])
        self.loss_scale = (LossScale(param.loss_scale, param.loss_scale_window, self.device)
                           if param.precision == "FLOAT16" else None)
        """float16's dynamic loss scale (loss_scale.py); None for other precisions."""
        self.pool = self._attach(self.net, pool)
        self.test_nets: list[Net] = []
        self._test_pool = self.pool if self.pool in self._pools else None
        if role.tests:
            for spec, state in param.test_net_specs():
                net = self._build(spec, state.phase, state)
                net.share_weights_with(self.net)
                self.test_nets.append(net)
                self._test_pool = self._attach(net, self._test_pool, test_replicas)
        for net in (self.net, *self.test_nets):
            net.bind_sources(self.seeds.data)  # a run of several replicas shards them later
        checks = [c for net in (self.net, *self.test_nets) for c in net.device_checks()]
        self.monitor = Monitor(self.device, param.average_loss, checks)
        self._last_display = (time.perf_counter(), 0)
        if role.reports:
            for note in param.inert_notes():
                log.info(f"Note: {note}")
        if param.weights:  # Caffe 1.0's SolverParameter.weights: loaded as the net is made
            self.load_weights(param.weights)
        if inputs is not None or test_inputs is not None:
            self.feed(inputs, test_inputs)

    # --- building -----------------------------------------------------------------------------
    def _build(self, spec, phase: str, state) -> Net:
        net = Net(spec, phase, stages=state.stage, level=state.level, device=self.device,
                  seed=self.seeds.model)
        inputs = [layer.name for layer in net.layers if layer.spec.type == "Input"]
        if inputs:
            raise SolverError(f"the {phase} net '{net.name}' has Input layer '{inputs[0]}', "
                              "which nothing feeds during training; read data with a Data "
                              "(or DummyData) layer")
        return net

    def _attach(self, net: Net, pool: Any, test_replicas: int = 1) -> Any:
        """The readers for ``net``'s Data layers: ``pool`` when given, else one we own (for
        the TEST nets of ``test_replicas`` > 1 replicas, in turns of a batch).

        A shared pool (parallel training) serves this replica's TRAIN net; our own pool serves
        the TEST nets too, so a TRAIN and a TEST net may read one database.
        """
        if not net.data_layers():
            return pool
        if pool is None:
            from ..io import ReaderPool

            pool = ReaderPool(replicas=test_replicas)
            self._pools.append(pool)
        from ..io import attach_feeds

        replica = 0 if pool in self._pools else self.replica
        attach_feeds(net, pool, replica=replica, device=self.device, seed=self.seeds.data,
                     by_batch=test_replicas > 1)
        return pool

    @property
    def test_pool(self) -> Any:
        """The readers of the TEST nets' Data layers (None when they have none)."""
        return self._test_pool

    def feed(self, inputs: Mapping[str, Any] | None,
             test_inputs: Mapping[str, Any] | None = None) -> None:
        """Arrays by top name (numpy arrays or tensors, N rows each) for the TRAIN net's
        in-memory source, a MemoryData layer whose tops they name (``{"data": x, "label":
        y}``), and ``test_inputs`` for the TEST nets' (each net that has such a layer)."""
        if inputs is not None:
            self._feed_net(self.net, inputs, "inputs")
        if test_inputs is not None and self.test_nets:
            fed = [self._feed_net(net, test_inputs, "test_inputs", required=False)
                   for net in self.test_nets]
            if not any(fed):
                raise SolverError(f"test_inputs {', '.join(test_inputs)}: no TEST net has a "
                                  "MemoryData layer with those tops; name the tops of one")

    @staticmethod
    def _feed_net(net: Net, arrays: Mapping[str, Any], what: str, required: bool = True) -> bool:
        """Hand ``arrays`` to the MemoryData layer of ``net`` whose tops they name."""
        names = set(arrays)
        for layer in net.layers:
            if layer.spec.type == "MemoryData" and set(layer.spec.top) == names:
                data, labels = (arrays[top] for top in layer.spec.top)
                memory: Any = layer  # a MemoryData (the layer library is not imported here)
                memory.reset(data, labels)
                return True
        if not required:
            return False
        layers = [f"'{layer.name}' ({', '.join(layer.spec.top)})" for layer in net.layers
                  if layer.spec.type == "MemoryData"]
        have = f"its MemoryData layers: {'; '.join(layers)}" if layers else \
            "it has none: give it one, e.g. {name: data, type: MemoryData, top: [data, label], " \
            "memory_data_param: {batch_size: 64, channels: 1, height: 28, width: 28}}"
        raise SolverError(f"{what} {', '.join(arrays)}: the {net.phase} net '{net.name}' has no "
                          f"MemoryData layer with exactly those tops; {have}")

    def start(self) -> None:
        """Start the readers this solver owns (after any restore); idempotent."""
        if not self._started:
            self._started = True
            for pool in self._pools:
                pool.start()

    def close(self) -> None:
        for pool in self._pools:
            pool.close()
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    def _open_metrics(self, resume: bool, tensorboard: str | None = None) -> MetricsFile:
        """``<snapshot_prefix>_metrics.csv``, with a column per output value of every net."""
        columns = FIXED + output_columns(self.net, "train")
        for k, net in enumerate(self.test_nets):
            columns += output_columns(net, f"test{k}")
        return MetricsFile(metrics_path(self.param.snapshot_prefix), columns, resume=resume,
                           tensorboard=tensorboard, seconds=self.seconds_before)

    def seconds(self) -> float:
        """Seconds of training so far, over every resume: the metrics table's clock."""
        if self.metrics is not None:
            return self.metrics.seconds()
        return self.seconds_before

    def current_rate(self) -> float:
        """The learning rate this iteration's update uses."""
        return learning_rate(self.param, self.iter, self.current_step)[0]

    def __enter__(self) -> Solver:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the loop -----------------------------------------------------------------------------
    def solve(self, resume_file: str | None = None,
              progress: ProgressFactory | None = None, tensorboard: str | None = None) -> None:
        """Caffe's Solver::Solve: train to max_iter, snapshot, and show the final numbers.

        ``progress`` (the command's, e.g. a terminal bar) is advanced once per iteration."""
        p = self.param
        log.info(f"Solving {self.net.name}")
        log.info(f"Learning Rate Policy: {p.lr_policy}")
        if resume_file:
            self.restore(resume_file)
        self.start()
        if self.role.reports:
            self.metrics = self._open_metrics(resume=bool(resume_file), tensorboard=tensorboard)
        with self._progress_of(progress):
            self.step(p.max_iter - self.iter)
        if (p.snapshot_after_train or self.snapshot_on_stop) and \
                (not p.snapshot or self.iter % p.snapshot != 0):
            self.snapshot()
        if self.stop_requested:
            log.info("Optimization stopped early.")
            return
        self.check_finite()
        if p.display and self.iter % p.display == 0:
            with torch.no_grad(), self.autocast():
                out = self.net()
            self.record_loss(out.loss.detach().float())
            log.info(f"Iteration {self.iter}, loss = {self.smoothed_loss():g}")
            if self.metrics is not None:  # the final iteration's row
                values = {name: t.detach().float().reshape(-1)
                          for name, t in out.outputs.items()}
                self.metrics.row(self.iter, "train", self.current_rate(), self.smoothed_loss(),
                                 output_means(values))
        if p.test_interval and self.iter % p.test_interval == 0:
            self.test_all()
        log.info("Optimization Done.")

    def step(self, iters: int) -> None:
        """Caffe's Step: run ``iters`` iterations (fewer when a stop is requested)."""
        stop_iter = self.iter + iters
        while self.iter < stop_iter and not self.stop_requested:
            try:
                if self.runner is None:
                    self.iteration()
                else:
                    self.runner.run(self, stop_iter)
            except interrupts.Interrupted as stop:  # a signal cut a stalled input wait short
                log.info(f"Iteration {self.iter}: the input stalled and a signal asked to "
                         f"{stop.effect.replace('-', ' then ')}; stopping as of this iteration")
                self.stop_requested = True
                self.snapshot_on_stop = self.snapshot_on_stop or stop.effect == SNAPSHOT_STOP
        if self.runner is not None:
            self.runner.pause(self)

    def iteration(self) -> None:
        """One iteration of Caffe's Step: the module docstring's three seams, eagerly."""
        if self.begin_iteration():
            self.end_iteration(*self.passes())

    # --- the Step, as seams ---------------------------------------------------------------------
    def begin_iteration(self) -> bool:
        """Caffe's Step before the passes: the readers started, the TEST nets when due, every
        callback's ``on_start``. False when a signal during the test stopped the run (the
        iteration does not happen)."""
        self.start()
        if self.test_due():
            self.test_all()
            if self.stop_requested:
                return False
        for cb in self.callbacks:
            cb.on_start(self)
        return True

    def passes(self) -> tuple[torch.Tensor, NetOutput]:
        """The gradients cleared, then this iteration's forward and backward passes."""
        self.zero_grads()
        return self.forward_backward()

    def end_iteration(self, loss: torch.Tensor, out: NetOutput, *, count: int = 1,
                      planned: RatePlan | None = None) -> None:
        """Caffe's Step after the passes, for ``count`` iterations whose passes ran: their
        losses recorded (a scalar, or one per iteration), the display of the first when due,
        ``on_gradient_ready``, the update (``planned``: the one a replay applied with those
        rates), ``on_update_applied`` and the count, signals and snapshot of
        :meth:`finish_iteration`."""
        display = self.display_due()
        if loss.dim() == 0:
            self.record_loss(loss)
        else:
            self.monitor.record_many(self.iter, loss)
        if display:
            self.display(out)
        for cb in self.callbacks:
            cb.on_gradient_ready(self)
        rate = None
        if planned is not None:
            self.current_step, rate = planned.current_step, planned.rates[0]
        elif self.role.applies_updates:
            rate = self.apply_update()
        if display and rate is not None:
            self.show_rate(rate)
        self.update_applied()
        self.finish_iteration(count)

    def test_due(self) -> bool:
        """Whether the TEST nets run before this iteration (Caffe: every test_interval)."""
        p = self.param
        return bool(self.test_nets and p.test_interval and self.iter % p.test_interval == 0
                    and (self.iter > 0 or p.test_initialization))

    def display_due(self) -> bool:
        return self.role.reports and self.param.display > 0 and self.iter % self.param.display == 0

    def zero_grads(self) -> None:
        """Clear the gradients: dropped, so that backward writes them afresh (no zeroing and
        no accumulation kernels), or zeroed in place when :attr:`grads_in_place` (they are
        views into a flat reduction buffer, or a CUDA graph accumulates into them)."""
        if not self.grads_in_place:
            for w in self.updater.params:
                w.grad = None
            return
        grads = [w.grad for w in self.updater.params if w.grad is not None]
        if grads:
            torch._foreach_zero_(grads)

    def forward_backward(self) -> tuple[torch.Tensor, NetOutput]:
        """This iteration's passes through the step function: (mean loss on the device, the
        last pass's outputs); the gradients accumulate."""
        return self.step_fn(self)

    def record_loss(self, loss: torch.Tensor) -> None:
        """Caffe's UpdateSmoothedLoss: this iteration's loss into the monitor's ring on the
        device (no host sync; a non-finite one stops the run within a few iterations)."""
        self.monitor.record(self.iter, loss)

    def apply_update(self) -> float:
        """Caffe's ApplyUpdate on the current gradients; returns the learning rate used."""
        plan = self.plan_rates(1)
        self.apply_scales(self.updater.scales(plan.rates[0], self.iter))
        self.current_step = plan.current_step
        return plan.rates[0]

    def apply_scales(self, scales: Sequence[float] | torch.Tensor) -> None:
        """The update with each parameter group's multiplier given (host floats, or a device
        row a CUDA graph reads); with FLOAT16 the gradients are unscaled first and an
        overflowing iteration changes nothing but the loss scale (no host sync)."""
        scale = self.loss_scale
        if scale is None:
            self.updater.apply_scales(scales)
            return
        skip = scale.unscale(self.updater.gradients())
        self.updater.apply_scales(scales, skip=skip)
        scale.update()

    def can_take_mean(self) -> bool:
        """Whether this replica's update can divide gradients summed over the replicas by
        their count itself (:meth:`~caffe_py.solver.rules.Updater.can_take_mean`; not with
        FLOAT16, whose unscaling comes between the sum and the update)."""
        return self.loss_scale is None and self.updater.can_take_mean()

    def backward(self, loss: torch.Tensor) -> None:
        """Backward from a pass's loss (scaled first with FLOAT16)."""
        (loss if self.loss_scale is None else self.loss_scale.scaled(loss)).backward()

    def plan_rates(self, count: int) -> RatePlan:
        """The learning rates of the next ``count`` updates, from this iteration on; nothing
        changes until :meth:`end_iteration` is told they were applied."""
        rates, step = [], self.current_step
        for j in range(count):
            rate, step = learning_rate(self.param, self.iter + j, step)
            rates.append(rate)
        return RatePlan(self.iter, rates, step)

    def update_applied(self) -> None:
        """Call every callback's optional ``on_update_applied`` (after the update, before the
        iteration is counted: e.g. the replicas' weights are averaged here)."""
        for cb in self.callbacks:
            hook = getattr(cb, "on_update_applied", None)
            if hook is not None:
                hook(self)

    def finish_iteration(self, count: int = 1) -> None:
        """Count the iteration (or the ``count`` a runner ran at once), then act on a signal
        and snapshot when due."""
        p = self.param
        self.iter += count
        if self._progress is not None:
            self._progress.update(count)
        self.monitor.poll(self.iter)
        request = self._stop_with_snapshot(self.action())
        if (p.snapshot and self.iter % p.snapshot == 0 and self.role.reports) or \
                request == SNAPSHOT:
            self.snapshot()
        if request == STOP:
            self.stop_requested = True

    def autocast(self) -> AbstractContextManager[Any]:
        """The forward passes' precision context (autocast for BF16 and FLOAT16)."""
        dtype = {"BF16": torch.bfloat16, "FLOAT16": torch.float16}.get(self.param.precision)
        if dtype is not None:  # no weight-cast cache: a CUDA graph cannot hold one
            return torch.autocast(device_type=self.device.type, dtype=dtype,
                                  cache_enabled=False)
        return contextlib.nullcontext()

    # --- loss tracking and display ------------------------------------------------------------
    def smoothed_loss(self) -> float:
        """The mean of the last average_loss losses (a host sync)."""
        return self.monitor.smoothed()

    def display(self, out: NetOutput) -> None:
        """Caffe's display lines: the rate, the smoothed loss and every TRAIN output."""
        self.check_finite()
        now = time.perf_counter()
        then, last_iter = self._last_display
        lapse = now - then
        per_s = (self.iter - last_iter) / lapse if lapse > 0 else 0.0
        self._last_display = (now, self.iter)
        log.info(f"Iteration {self.iter} ({per_s:g} iter/s, {lapse:.3f}s/{self.param.display} "
                 f"iters), loss = {self.smoothed_loss():g}")
        values = {name: t.detach().float().reshape(-1) for name, t in out.outputs.items()}
        for line in format_output_lines("Train net output", values, self.net.loss_weights):
            log.info(f"    {line}")
        if self.loss_scale is not None:
            log.info(f"    {self.loss_scale.describe()}")
        if self.metrics is not None:
            self.metrics.row(self.iter, "train", self.current_rate(), self.smoothed_loss(),
                             output_means(values))

    def show_rate(self, rate: float) -> None:
        """Caffe's display line of the learning rate used by this iteration's update."""
        log.info(f"Iteration {self.iter}, lr = {rate:g}")

    def check_finite(self) -> None:
        """Stop the run (a one-line error) if a recorded loss was NaN or inf or a layer's device
        check failed (a host sync)."""
        self.monitor.check_now()

    @contextlib.contextmanager
    def _progress_of(self, factory: ProgressFactory | None) -> Iterator[None]:
        if factory is None or not self.role.reports:
            yield
            return
        with factory(self.param.max_iter, self.iter) as bar:
            self._progress = bar
            try:
                yield
            finally:
                self._progress = None

    # --- testing ------------------------------------------------------------------------------
    def test_all(self) -> list[dict[str, torch.Tensor]]:
        """Caffe's TestAll: every test net for its test_iter batches; the mean outputs."""
        self.start()
        self.last_test = []
        if self.test_nets and self.device.type == "cuda":
            # the training iterations still queued on the device finish first (they would
            # hold back the pass's first batch anyway): the line's clock is the pass's start
            torch.cuda.synchronize(self.device)
        for k, net in enumerate(self.test_nets):
            log.info(f"Iteration {self.iter}, Testing net (#{k})")
            if self.param.eval_type != "detection" and detection_outputs(net):
                raise SolverError(f"test net #{k} outputs DetectionEvaluate rows "
                                  f"({', '.join(detection_outputs(net))}), which only "
                                  "eval_type: detection turns into a score; set eval_type: "
                                  "detection in the solver")
            if self.param.eval_type == "detection":  # every batch's rows, on this net
                means = run_detection_batches(
                    net, self.param.test_iter[k], self.param.ap_version,
                    per_class=self.param.show_per_class_result, autocast=self.autocast,
                    between=self._test_action)
            else:
                means = self.test_batches(k, net, self.param.test_iter[k],
                                          autocast=self.autocast, between=self._test_action)
            if means is None:  # stopped by a signal
                return self.last_test
            self.last_test.append(means)
            if self.param.test_compute_loss:
                log.info(f"Test loss: {float(means['__loss__'][0]):g}")
            for line in format_output_lines("Test net output", means, net.loss_weights):
                log.info(f"    {line}")
            if self.metrics is not None:
                self.metrics.row(self.iter, f"test{k}", self.current_rate(), None,
                                 output_means(means))
        return self.last_test

    def _test_action(self) -> bool:
        """Caffe checks signals between test batches; True means stop testing."""
        request = self._stop_with_snapshot(self.action())
        while request != NONE:
            if request == SNAPSHOT:
                self.snapshot()
            elif request == STOP:
                self.stop_requested = True
            request = self._stop_with_snapshot(self.action())
        return self.stop_requested

    def _stop_with_snapshot(self, request: str) -> str:
        """snapshot-stop (SIGTERM's default): a stop whose end writes the final snapshot."""
        if request == SNAPSHOT_STOP:
            self.snapshot_on_stop = True
            return STOP
        return request

    # --- weights, snapshots, resume -----------------------------------------------------------
    def load_weights(self, paths: Sequence[str]) -> None:
        """Fine-tune: copy layers by name from each weights file in order (Caffe's CopyLayers)."""
        for path in paths:
            log.info(f"Finetuning from {path}")
            result = self.net.copy_from(snap.load_weights(path), source=path)
            for name in result.ignored:
                log.info(f"Ignoring source layer {name}")

    def snapshot(self) -> tuple[Path, Path]:
        """Write the weights and the solver state for the current iteration."""
        self.check_finite()
        if not all(bool(torch.isfinite(w).all()) for w in self.updater.params):
            raise SolverError(f"iteration {self.iter}: the weights are not finite; no snapshot "
                              "was written; lower base_lr or set clip_gradients")
        weights, state = snap.snapshot_paths(self.param.snapshot_prefix, self.iter,
                                             self.param.snapshot_format)
        try:
            self._write_snapshot(weights, state)
        except WriteError as exc:  # a full disk or an unwritable place: the run stops
            previous = self.last_snapshot
            intact = f"the previous snapshot {previous} is intact (resume with --snapshot " \
                     f"{shlex.quote(str(previous))})" if previous else \
                "no earlier snapshot of this run exists"
            raise SolverError(f"{exc}; {intact}") from None
        self.last_snapshot = state
        return weights, state

    def _write_snapshot(self, weights: Path, state: Path) -> None:
        # Caffe's own words for its formats (solver.cpp, sgd_solver.cpp)
        kind = {"caffemodel": "binary proto file ", "HDF5": "HDF5 file "}.get(
            self.param.snapshot_format, "")
        log.info(f"Snapshotting to {kind}{weights}")
        types = {layer.name: layer.spec.type for layer in self.net.layers}
        snap.save_weights(self.net.layer_blobs(), weights, types, self.net.name)
        log.info(f"Snapshotting solver state to {kind}{state}")
        # Caffe's formats name the weights relative to the current directory, as Caffe writes
        # them (Caffe opens that path on --snapshot); caffe-py looks for the name next to the
        # state whatever the path says
        learned = weights.name if self.param.snapshot_format == "pt" else \
            os.path.relpath(weights)
        snap.save_state({**self.state_dict(learned), snap.PAIRED: snap.fingerprint(weights)},
                        state)

    def state_dict(self, learned_net: str = "") -> dict[str, Any]:
        """Everything a resume needs, as tensors and plain values (see snapshot.py)."""
        return {
            "iter": self.iter,
            "current_step": self.current_step,
            "random_seed": self.seeds.data,
            "seconds": self.seconds(),
            "learned_net": learned_net,
            "type": self.param.type,
            "history": [h.detach().cpu() for h in self.updater.history],
            "rng": self._rng_state(),
            "data": self.pool.state_dict() if self.pool is not None else None,
            "loss_scale": (self.loss_scale.state_dict() if self.loss_scale is not None
                           else None),
            "test_data": (self._test_pool.state_dict() if self._test_pool not in (None, self.pool)
                          else None),
            "sources": {tag: net.source_states() for tag, net in self._nets()},
        }

    def _nets(self) -> list[tuple[str, Net]]:
        """The nets by the tag a solver state keys them with: train, test0, test1..."""
        return [("train", self.net)] + [(f"test{k}", n) for k, n in enumerate(self.test_nets)]

    def restore(self, path: str) -> None:
        """Caffe's Restore: weights, iteration, current_step, history, RNGs, data positions."""
        if self._started:
            raise SolverError(f"{path}: restore before the first iteration")
        log.info(f"Restoring previous solver status from {path}")
        state = snap.load_state(path)
        self.last_snapshot = path
        weights = snap.paired_weights(state, path)
        if state.get("type") not in (None, self.param.type):  # None: written by Caffe
            raise SolverError(f"{path}: saved by a {state.get('type')} solver, this one is "
                              f"{self.param.type}; resume with the same solver type")
        self.net.copy_from(snap.load_weights(weights), source=weights)
        self.updater.load_history(state["history"], str(path))
        self.iter, self.current_step = state["iter"], state["current_step"]
        seconds = state.get("seconds")  # none in Caffe's states: the table's own record
        self.seconds_before = float(seconds) if isinstance(seconds, (int, float)) else \
            seconds_at(metrics_path(self.param.snapshot_prefix), self.iter)
        with _damaged_entry(path, "rng"):
            self._load_rng_state(state.get("rng") or {})
        if self.loss_scale is not None and state.get("loss_scale"):
            with _damaged_entry(path, "loss_scale"):
                self.loss_scale.load_state_dict(state["loss_scale"])
        if self.pool is not None and state.get("data"):
            with _damaged_entry(path, "data"):
                self.pool.load_state_dict(state["data"])
        if self._test_pool not in (None, self.pool) and state.get("test_data"):
            self._test_pool.load_state_dict(state["test_data"])
        with _damaged_entry(path, "sources"):
            sources = state.get("sources") or {}
            for tag, net in self._nets():
                net.load_source_states(sources.get(tag) or {})
        self._last_display = (time.perf_counter(), self.iter)

    def _generators(self) -> dict[str, torch.Generator]:
        """Every generator a layer keeps for itself (DummyData...), by net and layer."""
        return {f"{tag}/{layer.name}.{attr}": value
                for tag, net in self._nets() for layer in net.layers
                for attr, value in layer.generators().items()}

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


@contextlib.contextmanager
def _damaged_entry(path: str, key: str) -> Iterator[None]:
    """A solver state entry of the wrong shape or type: one line naming it (what a damaged or
    hand-edited file gets; nothing in it ran: the safe loader builds plain values only)."""
    try:
        yield
    except (TypeError, AttributeError, KeyError, ValueError, IndexError, RuntimeError) as exc:
        if isinstance(exc, CaffePyError):
            raise
        raise SolverError(f"{path}: the solver state's '{key}' entry is damaged "
                          f"({one_line_reason(exc)}); "
                          "use an earlier snapshot") from None
