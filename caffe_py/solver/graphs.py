"""A step function that replays a replica's forward + backward as one CUDA graph.

Small nets are bound by the host's op launches, and replica threads in one process queue for
the GIL to launch theirs (docs/performance.md and docs/parallel.md give the numbers). A
captured step is one ``graph.replay()`` per pass: the per-iteration Python work per replica
drops to copying the next batch into static input buffers and a replay.

What makes a step capturable here:

* the gradients live at fixed addresses (made by the warm-up passes and zeroed in place, or
  views into a replica's flat gradient buffer), so the backward's in-place accumulation is
  captured and a tree/NCCL sync reads them as usual;
* every Data layer reads from a :class:`StaticFeed`: before each replay the real feed's next
  batches are copied into the static slots the graph was captured with;
* no host work inside: the loss layers check labels on the device, DummyData draws from a
  generator on the device (registered with the graph, so each replay draws anew); a layer
  that runs host code (a generator on the host, a Python layer) keeps the replica eager, and
  it says why.

Warm-up passes (needed before capture) use the zero-filled static batch and consume no
records; BatchNorm's running sums are restored after them and the gradients cleared, so the
captured run sees the same state as an eager one.

``Solver(param, step=GraphedStep())`` uses it; a step that cannot be captured says why in one
line and runs :func:`~caffe_py.solver.roles.eager_step` instead. The single-device loop that
captures whole iterations (:mod:`.graph_loop`) uses the same static feed and the same capture
check (:func:`capture_blocker`).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..errors import SolverError
from ..io.feed.feeds import feed_of, swap_feed
from .roles import eager_step

if TYPE_CHECKING:
    from ..net import Net, NetOutput
    from .solver import Solver

log = logging.getLogger(__name__)

WARMUP_PASSES = 3
_CAPTURE_LOCK = threading.Lock()   # one capture at a time: captures are rare, errors clearer


class StaticFeed:
    """What a Data layer reads inside a graph: ``slots`` static batches, filled from the real
    feed before each replay; the n-th ``next()`` of a capture returns slot n (mod slots)."""

    def __init__(self, real: Any, shapes: list[tuple[int, ...]], device: torch.device,
                 slots: int = 1):
        self.real = real
        self.data = torch.zeros((slots, *shapes[0]), dtype=torch.float32, device=device)
        label_shape = shapes[1] if len(shapes) > 1 else (shapes[0][0],)
        self.label = torch.zeros((slots, *label_shape), dtype=torch.int64, device=device)
        self.cursor = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        slot = self.cursor % len(self.data)
        self.cursor += 1
        return self.data[slot], self.label[slot]

    def fill(self, slots: int = 1) -> None:
        """Copy the real feed's next ``slots`` batches into slots 0 .. slots-1."""
        for k in range(slots):
            self.fill_slot(k)

    def fill_slot(self, k: int) -> None:
        """Copy the real feed's next batch into slot k."""
        data, label = self.real.next()
        self.data[k].copy_(data, non_blocking=True)
        self.label[k].copy_(label, non_blocking=True)


def install_static_feeds(net: Net, device: torch.device, slots: int = 1,
                         make: Callable[[Any, Any], Any] | None = None) -> list[Any]:
    """Every Data layer of ``net`` reading from static slots (its real feed behind): a
    :class:`StaticFeed`, or what ``make(real, layer)`` gives where it gives one."""
    feeds = []
    for layer in net.data_layers():
        real = feed_of(layer)
        feed = make(real, layer) if make is not None else None
        if feed is None:
            feed = StaticFeed(real, layer.top_shapes, device, slots)
        swap_feed(layer, feed)
        feeds.append(feed)
    return feeds


def restore_feeds(net: Net, feeds: Sequence[Any]) -> None:
    """The Data layers' real feeds back in place of the static ones."""
    for layer, feed in zip(net.data_layers(), feeds, strict=True):
        swap_feed(layer, feed.real)


def reinstall_feeds(net: Net, feeds: list[StaticFeed]) -> None:
    """The static feeds of :func:`install_static_feeds` in place again, after a restore."""
    for layer, feed in zip(net.data_layers(), feeds, strict=True):
        swap_feed(layer, feed)


def capture_blocker(s: Solver, *, whole_iteration: bool = False,
                    emulate: bool = False) -> str | None:
    """Why ``s``'s TRAIN passes (with ``whole_iteration``: also the update, with no callback
    between) cannot be captured; None when they can. ``emulate`` (the graph loop's CPU
    stand-in) asks about everything but the device."""
    if s.device.type != "cuda" and not emulate:
        return f"the net runs on {s.device}, not CUDA"
    if whole_iteration and s.callbacks:
        return "callbacks run between the forward and the update"
    return net_capture_blocker(s.net, s.device)


def net_capture_blocker(net: Net, device: torch.device) -> str | None:
    """Why ``net``'s forward cannot be captured on ``device`` (whose kind its generators must
    be on); None when it can."""
    for layer in net.layers:
        for name, gen in layer.generators().items():
            if gen.device.type != device.type:
                return f"layer '{layer.name}' draws from a host generator ({name})"
        if not layer.capturable:
            return f"layer '{layer.name}' ({layer.spec.type}) runs host code every forward"
        if layer.spec.type == "Data" and feed_of(layer) is None:
            return f"Data layer '{layer.name}' has no feed attached"
    return None


class GraphedStep:
    """A :class:`~caffe_py.solver.roles.StepFn`: iter_size replays of one captured pass.

    Made before its Solver; the capture happens on the first call, in the replica's own thread
    (its device and stream), after that iteration's weights have arrived.
    """

    def __init__(self, required: bool = False) -> None:
        self.required = required
        """A step that cannot be captured is an error (``--graphs on``), not a note."""
        self.graph: torch.cuda.CUDAGraph | None = None
        self.feeds: list[StaticFeed] = []
        self.static_loss: torch.Tensor | None = None
        self.static_out: Any = None
        self.fallback: str | None = None

    def __call__(self, solver: Solver) -> tuple[torch.Tensor, NetOutput]:
        if self.fallback is not None:
            return eager_step(solver)
        if self.graph is None:
            self._capture(solver)
            if self.graph is None:
                return eager_step(solver)
        assert self.static_loss is not None
        if solver.param.iter_size == 1:
            # the static loss is read (copied into the solver's loss ring) in stream order
            # before the next replay overwrites it: no per-step allocation or sum
            for feed in self.feeds:
                feed.fill()
            self.graph.replay()
            return self.static_loss, self.static_out
        total = torch.zeros((), device=solver.device)
        for _ in range(solver.param.iter_size):
            for feed in self.feeds:
                feed.fill()
            self.graph.replay()
            total += self.static_loss
        return total / solver.param.iter_size, self.static_out

    # --- capture ------------------------------------------------------------------------------
    def _capture(self, s: Solver) -> None:
        reason = capture_blocker(s)
        if reason is not None:
            self._give_up(s, reason)
            return
        net = s.net
        s.grads_in_place = True   # the captured backward accumulates into fixed tensors
        self.feeds = install_static_feeds(net, s.device)
        state, saved = running_state(net)
        try:
            with _CAPTURE_LOCK:
                warm_up(s.device, lambda: _pass(s))
                restore_tensors(state, saved)
                s.zero_grads()
                graph = torch.cuda.CUDAGraph()
                register_generators(graph, [g for layer in net.layers   # DummyData
                                            for g in layer.generators().values()])
                # torch's default capture stream is one per process, made on whichever device
                # captured first: each replica captures on a stream of its own device
                capture = torch.cuda.Stream(s.device)
                with torch.cuda.graph(graph, stream=capture, capture_error_mode="thread_local"):
                    self.static_loss, self.static_out = _pass(s)
                s.zero_grads()
            self.graph = graph
        except RuntimeError as exc:   # a layer did something a graph cannot hold
            torch.cuda.synchronize(s.device)
            restore_tensors(state, saved)      # the eager step starts from where capture began
            s.zero_grads()
            restore_feeds(net, self.feeds)
            self.feeds = []
            self._give_up(s, f"capture failed: {str(exc).splitlines()[0]}")

    def _give_up(self, s: Solver, reason: str) -> None:
        if self.required:
            raise SolverError(f"--graphs on: replica {s.replica} ({s.device}) cannot be "
                              f"captured: {reason}; use --graphs auto to run it eagerly")
        self.fallback = reason
        log.info(f"CUDA graphs off for replica {s.replica} ({s.device}): {reason}; "
                 "running eagerly")


def _pass(s: Solver) -> tuple[torch.Tensor, NetOutput]:
    """One forward and backward, as captured (the loss as float32)."""
    with s.autocast():
        out = s.net()
    if out.loss.requires_grad:
        s.backward(out.loss)
    return out.loss.detach().float(), out


def warm_up(device: torch.device, run: Callable[[], object]) -> None:
    """The WARMUP_PASSES runs capture needs first, on a side stream of ``device`` (cuDNN and
    allocator warm-up)."""
    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        for _ in range(WARMUP_PASSES):
            run()
    current.wait_stream(side)


def running_state(net: Net) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The net's blobs that are no Parameter (BatchNorm's running sums), and copies of them
    to put back after the warm-up passes moved them (:func:`restore_tensors`)."""
    state = [t for blobs in net.layer_blobs().values() for t in blobs
             if not isinstance(t, torch.nn.Parameter)]
    return state, [t.detach().clone() for t in state]


def register_generators(graph: torch.cuda.CUDAGraph, generators: list[torch.Generator]) -> None:
    """Make each replay of ``graph`` draw anew from these device generators."""
    if generators and not hasattr(graph, "register_generator_state"):
        raise RuntimeError("this torch cannot replay a layer's own generator in a graph")
    for gen in generators:
        # the graph-safe seed and offset are made on the current device: on the generator's
        # own, or a replica's kernels read them from another GPU (an illegal address where
        # the two GPUs have no peer access: 4 replicas captured from one thread crashed)
        with torch.cuda.device(gen.device):
            graph.register_generator_state(gen)


@torch.no_grad()
def restore_tensors(tensors: list[torch.Tensor], saved: list[torch.Tensor]) -> None:
    for t, v in zip(tensors, saved, strict=True):
        t.copy_(v)
