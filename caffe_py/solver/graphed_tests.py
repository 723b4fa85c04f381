"""Test passes replayed as CUDA graphs: a TEST net's forward captured once, one replay a batch.

A test pass is a forward per batch and nothing else, so on a GPU its time is the device's
forward or the host's launches, whichever is longer. A net of many small layers (LeNet: a
0.1 ms forward) is bound by the launches, and so is a pass split over several GPUs whose one
thread launches every replica's forward (:class:`~caffe_py.parallel.captured.SplitTests`). A
replay is one launch: what is left to the host per batch is the feed's next batch copied into
the static slots the graph reads, the replay, and the sums.

:class:`GraphedForward` is one net's captured forward, called where ``net()`` was:
its outputs are the graph's static tensors, overwritten by the next call, so a caller copies
or sums them before calling again (:func:`~caffe_py.solver.evaluate.run_batches` sums them as
it does the eager outputs). Once captured, the net's Data layers read the static slots: the
net runs through this forward from then on (an eager ``net()`` would read the last batch
again). The capture happens at the first call, under the caller's
``no_grad`` and autocast, after warm-up forwards on the zero-filled slots (which consume no
records; BatchNorm's running sums and the layers' device generators are put back after them,
so the first replay sees what an eager forward would). Before each pass the net's blobs are
checked to still be where the graph reads them (a shared weight re-pointed by a load, a
repack into flat buffers); if one moved the forward is captured again. A net that cannot be
captured (a Python layer, a host generator) or whose capture fails says why once and runs
eagerly.

:class:`GraphedTests` is the Solver's ``test_batches`` on one GPU with graphs on (the
default): each TEST net's pass through its own :class:`GraphedForward`.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from ..net import Net, NetOutput
from .evaluate import run_batches
from .graphs import (
    _CAPTURE_LOCK,
    StaticFeed,
    install_static_feeds,
    net_capture_blocker,
    register_generators,
    restore_feeds,
    restore_tensors,
    running_state,
    warm_up,
)

log = logging.getLogger(__name__)


class GraphedForward:
    """``net``'s forward as one CUDA graph replay per call (see the module's docstring);
    ``what`` names the net in the one line that says why it runs eagerly."""

    def __init__(self, net: Net, what: str) -> None:
        self.net, self.what = net, what
        self.graph: torch.cuda.CUDAGraph | None = None
        self.feeds: list[StaticFeed] = []
        self.out: NetOutput | None = None
        self.fallback: str | None = None
        """Why the forward runs eagerly (None: it is captured, or not yet tried)."""
        self._layout: list[int] = []

    def __call__(self) -> NetOutput:
        if self.fallback is None and self.graph is None:
            self._capture()
        if self.graph is None:
            return self.net()
        for feed in self.feeds:
            feed.fill()
        self.graph.replay()
        assert self.out is not None
        return self.out

    def check_layout(self) -> None:
        """Before a pass: drop the graph if a blob it reads has moved (captured anew at the
        next call)."""
        if self.graph is not None and self._addresses() != self._layout:
            log.debug(f"{self.what}: a blob moved since the capture; capturing again")
            restore_feeds(self.net, self.feeds)
            self.graph, self.out, self.feeds = None, None, []

    def _addresses(self) -> list[int]:
        return [t.data_ptr() for layer in self.net.layers for t in layer.blobs()]

    def _capture(self) -> None:
        net = self.net
        reason = ("it runs on the CPU" if net.device.type != "cuda"
                  else net_capture_blocker(net, net.device))
        if reason is not None:
            self._give_up(reason)
            return
        self.feeds = install_static_feeds(net, net.device)
        state, saved = running_state(net)
        generators = [g for layer in net.layers for g in layer.generators().values()]
        draws = [g.get_state() for g in generators]
        benchmark = torch.backends.cudnn.benchmark
        try:
            with _CAPTURE_LOCK, torch.cuda.device(net.device):
                # cuDNN's heuristics, not its timings, pick the forward's algorithms: the same
                # on every device of a kind, so a pass split over GPUs sums the numbers one
                # GPU computes (timed choices differ from device to device)
                torch.backends.cudnn.benchmark = False
                warm_up(net.device, net)
                restore_tensors(state, saved)
                for g, drawn in zip(generators, draws, strict=True):
                    g.set_state(drawn)
                graph = torch.cuda.CUDAGraph()
                register_generators(graph, generators)
                capture = torch.cuda.Stream(net.device)
                with torch.cuda.graph(graph, stream=capture, capture_error_mode="thread_local"):
                    self.out = net()
            self.graph = graph
            self._layout = self._addresses()
        except RuntimeError as exc:   # a layer did something a graph cannot hold
            torch.cuda.synchronize(net.device)
            restore_tensors(state, saved)
            restore_feeds(net, self.feeds)
            self.feeds, self.out = [], None
            self._give_up(f"capture failed: {str(exc).splitlines()[0]}")
        finally:
            torch.backends.cudnn.benchmark = benchmark

    def _give_up(self, reason: str) -> None:
        self.fallback = reason
        log.info(f"CUDA graphs off for {self.what} ({self.net.device}): {reason}; "
                 "testing eagerly")


class GraphedTests:
    """The Solver's ``test_batches`` with each TEST net's forward a :class:`GraphedForward`
    (on the CPU: the eager pass)."""

    def __init__(self) -> None:
        self.forwards: dict[int, GraphedForward] = {}

    def __call__(self, k: int, net: Net, iterations: int, *,
                 autocast: Callable[[], AbstractContextManager[Any]],
                 between: Callable[[], bool]) -> dict[str, torch.Tensor] | None:
        if net.device.type != "cuda":
            return run_batches(net, iterations, autocast=autocast, between=between)
        forward = self.forwards.get(k)
        if forward is None:
            forward = self.forwards[k] = GraphedForward(net, f"test net #{k}")
        forward.check_layout()
        return run_batches(net, iterations, autocast=autocast, between=between,
                           forward=forward)
