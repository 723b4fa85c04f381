"""Test passes replayed as CUDA graphs: a TEST net's forward captured once, several batches a
replay.

A test pass is a forward per batch and nothing else, so on a GPU its time is the device's
forward or the host's launches, whichever is longer. A net of many small layers (LeNet: a
0.1 ms forward) is bound by the launches, and so is a pass split over several GPUs whose one
thread launches every replica's forward (:class:`~caffe_py.parallel.captured.SplitTests`).
So a replay runs a *chunk* of up to :data:`CHUNK_MAX` batches, each read from a static slot of
its own: per batch the host only copies the feed's next batch into its slot, and per chunk it
replays once. What the pass sums is summed inside the graph too.

:class:`GraphedForward` is one net's captured forward. Each batch gives a *row*: the loss (as
float32) and every output flattened, in the net's output order (:class:`RowLayout`). A replay
either adds each batch's row to a running total on the device, in batch order (``"sum"``: the
float32 adds :func:`~caffe_py.solver.evaluate.run_batches` makes, so a pass prints the eager
pass's numbers), or writes the rows out (``"rows"``: a pass split over replicas sums every
replica's rows on the host, in the stream's batch order). The first batch's outputs are added
to a total of -0.0, the identity of float32 addition, where the eager pass copies them.

The graphs are captured before a pass's first batch, one per chunk length the pass needs,
under the pass's autocast, after warm-up forwards on the zero-filled slots (which consume no
records; BatchNorm's running sums and the layers' device generators are put back after them,
so the first replay sees what an eager forward would). Once captured, the net's Data layers
read the static slots: the net runs through this forward from then on. Before each pass the
net's blobs are checked to still be where the graphs read them (a shared weight re-pointed by a
load, a repack into flat buffers); if one moved the forward is captured again. A net that
cannot be captured (a Python layer, a host generator) or whose capture fails says why once and
runs eagerly. On the CPU, ``emulate`` runs the same chunks without a graph (the tests' stand-in
for the capture).

:class:`GraphedTests` is the Solver's ``test_batches`` on one GPU with graphs on (the
default): each TEST net's pass through its own :class:`GraphedForward`.
"""
from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..io.feed.gather import DeviceGather
from ..net import Net, NetOutput
from .evaluate import raise_device_problems, run_batches
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

CHUNK_MAX = 32
"""The most test batches one replay runs."""
CHUNK_SLOT_BYTES = 64 << 20
"""A chunk's static batch slots take at most this much device memory (a large batch, such as
ResNet-50's, runs a batch or two a replay: its forward outlasts the host's work anyway)."""

Autocast = Callable[[], AbstractContextManager[Any]]


@dataclass(frozen=True)
class RowLayout:
    """Where a batch's values lie in its row: the loss at 0, then each output flattened."""

    names: tuple[str, ...]
    slices: tuple[slice, ...]
    width: int

    @classmethod
    def of(cls, out: NetOutput) -> RowLayout:
        names, slices, at = [], [], 1
        for name, value in out.outputs.items():
            names.append(name)
            slices.append(slice(at, at + value.numel()))
            at += value.numel()
        return cls(tuple(names), tuple(slices), at)

    def means(self, total: torch.Tensor, iterations: int) -> dict[str, torch.Tensor]:
        """``run_batches``' result from the (width,) total of ``iterations`` rows."""
        mean = (total / iterations).cpu()
        means = {name: mean[part] for name, part in zip(self.names, self.slices, strict=True)}
        means["__loss__"] = mean[:1]
        return means

    def start(self, device: torch.device) -> torch.Tensor:
        """The total before the first row: +0.0 for the loss (the eager pass adds to zero),
        -0.0 for the outputs (it copies the first batch's; -0.0 + x is x, for x = -0.0 too)."""
        total = torch.full((self.width,), -0.0, device=device)
        total[0] = 0.0
        return total


def batch_row(out: NetOutput, into: torch.Tensor | None = None) -> torch.Tensor:
    """A batch's row: (width,) float32, the loss then every output flattened."""
    parts = [out.loss.detach().float().reshape(1),
             *(value.detach().float().reshape(-1) for value in out.outputs.values())]
    if into is None:
        return torch.cat(parts)
    return torch.cat(parts, out=into)


def chunk_lengths(iterations: int, slots: int) -> list[int]:
    """The replays of a pass of ``iterations`` batches, ``slots`` at most a replay."""
    full, rest = divmod(iterations, slots)
    return [slots] * full + ([rest] if rest else [])


class GraphedForward:
    """``net``'s forward as one CUDA graph replay per chunk of batches (see the module's
    docstring); ``what`` names the net in the one line that says why it runs eagerly."""

    def __init__(self, net: Net, what: str, *, emulate: bool = False) -> None:
        self.net, self.what, self.emulate = net, what, emulate
        self.graphs: dict[tuple[int, str], torch.cuda.CUDAGraph] = {}
        self.feeds: list[StaticFeed | GatherFeed] = []
        self.slots = 0
        """Batches a replay can run (0: not set up yet)."""
        self.layout: RowLayout | None = None
        self.rows: torch.Tensor | None = None
        """(slots, width): the rows a ``"rows"`` replay wrote (made with its first capture:
        a forward of large outputs that only sums keeps no rows)."""
        self.total: torch.Tensor | None = None
        """(width,): the running total a ``"sum"`` replay adds to."""
        self.fallback: str | None = None
        """Why the forward runs eagerly (None: it is captured, or not yet tried)."""
        self._layout: list[int] = []
        self._pool: Any = None

    def check_layout(self) -> None:
        """Before a pass: drop the graphs if a blob they read has moved, or if a feed copied
        into a slot can now be gathered inside the graph (captured anew either way)."""
        if self.graphs and self._addresses() != self._layout:
            log.debug(f"{self.what}: a blob moved since the capture; capturing again")
            self.graphs, self._pool = {}, None
        if self.slots and any(isinstance(feed, StaticFeed)
                              and device_gather(feed.real, self.net.device) is not None
                              for feed in self.feeds):
            log.debug(f"{self.what}: its database is on the device now; gathering in the graph")
            restore_feeds(self.net, self.feeds)
            self.feeds = install_feeds(self.net, self.slots)
            self.graphs, self._pool = {}, None

    def ready(self, autocast: Autocast) -> bool:
        """Set up the slots (once); False when the forward runs eagerly."""
        if self.fallback is None and not self.slots:
            self._set_up(autocast)
        return self.fallback is None

    def capture(self, lengths: Iterable[int], mode: str, autocast: Autocast) -> bool:
        """A graph for each chunk length a pass needs (before its clock starts); False when
        the forward runs eagerly (a capture failed)."""
        if mode == "rows" and self.rows is None and self.layout is not None:
            self.rows = torch.zeros((self.slots, self.layout.width), device=self.net.device)
        for length in sorted(set(lengths)):
            if (length, mode) not in self.graphs and not self.emulate:
                self._capture(length, mode, autocast)
                if self.fallback is not None:
                    return False
        return self.fallback is None

    @property
    def fills_on_host(self) -> bool:
        """Whether a fill is host work only (every feed gathered inside the graph): no device
        need be current for it."""
        return all(isinstance(feed, GatherFeed) for feed in self.feeds)

    def fill(self, k: int) -> None:
        """The real feeds' next batch into slot k."""
        for feed in self.feeds:
            feed.fill_slot(k)

    def start(self) -> None:
        """A pass's total back to its start."""
        assert self.layout is not None and self.total is not None
        self.total.copy_(self.layout.start(self.total.device))

    def replay(self, length: int, mode: str, autocast: Autocast) -> None:
        """Run slots 0 .. length-1 (filled): add their rows to :attr:`total` (``"sum"``) or
        write them to :attr:`rows` (``"rows"``)."""
        for feed in self.feeds:
            if isinstance(feed, GatherFeed):
                feed.flush(length)
        if self.emulate:
            with autocast():
                self._chunk(length, mode)
            return
        self.graphs[length, mode].replay()

    # --- set-up and capture -------------------------------------------------------------------
    def _addresses(self) -> list[int]:
        return [t.data_ptr() for layer in self.net.layers for t in layer.blobs()]

    def _set_up(self, autocast: Autocast) -> None:
        """Choose the chunk, install the static slots, and find the row layout from a forward
        on the zero-filled slots (its moves undone)."""
        net = self.net
        reason = ("it runs on the CPU" if net.device.type != "cuda" and not self.emulate
                  else net_capture_blocker(net, net.device))
        if reason is not None:
            self._give_up(reason)
            return
        slots = chunk_slots(net)
        self.feeds = install_feeds(net, slots)
        state, saved = running_state(net)
        generators = [g for layer in net.layers for g in layer.generators().values()]
        draws = [g.get_state() for g in generators]
        try:
            with torch.no_grad(), autocast():
                if self.emulate:
                    out = net()
                else:
                    with _CAPTURE_LOCK, torch.cuda.device(net.device), _heuristic_algorithms():
                        outs: list[NetOutput] = []
                        warm_up(net.device, lambda: outs.append(net()))
                        out = outs[-1]
        except RuntimeError as exc:   # a layer failed on the zero-filled slots
            self._undo(state, saved, generators, draws)
            restore_feeds(net, self.feeds)
            self.feeds = []
            self._give_up(f"a forward on the static slots failed: {str(exc).splitlines()[0]}")
            return
        self._undo(state, saved, generators, draws)
        self.layout = RowLayout.of(out)
        self.slots = slots
        self.total = self.layout.start(net.device)

    def _undo(self, state: list[torch.Tensor], saved: list[torch.Tensor],
              generators: list[torch.Generator], draws: list[torch.Tensor]) -> None:
        if self.net.device.type == "cuda":
            torch.cuda.synchronize(self.net.device)
        restore_tensors(state, saved)
        for g, drawn in zip(generators, draws, strict=True):
            g.set_state(drawn)

    def _chunk(self, length: int, mode: str) -> None:
        """What a replay runs: ``length`` forwards, each reading its own slot."""
        assert self.total is not None
        for feed in self.feeds:
            feed.cursor = 0
        with torch.no_grad():
            for k in range(length):
                out = self.net()
                if mode == "rows":
                    assert self.rows is not None   # made by capture()
                    batch_row(out, into=self.rows[k])
                else:
                    self.total += batch_row(out)

    def _capture(self, length: int, mode: str, autocast: Autocast) -> None:
        net = self.net
        graph = torch.cuda.CUDAGraph()
        generators = [g for layer in net.layers for g in layer.generators().values()]
        try:
            with _CAPTURE_LOCK, torch.cuda.device(net.device), _heuristic_algorithms(), \
                    torch.no_grad(), autocast():
                register_generators(graph, generators)
                capture = torch.cuda.Stream(net.device)
                with torch.cuda.graph(graph, pool=self._pool, stream=capture,
                                      capture_error_mode="thread_local"):
                    self._chunk(length, mode)
        except RuntimeError as exc:   # a layer did something a graph cannot hold
            torch.cuda.synchronize(net.device)
            restore_feeds(net, self.feeds)
            self.feeds, self.graphs = [], {}
            self._give_up(f"capture failed: {str(exc).splitlines()[0]}")
            return
        self._pool = graph.pool()
        self.graphs[length, mode] = graph
        self._layout = self._addresses()

    def _give_up(self, reason: str) -> None:
        self.fallback = reason
        log.info(f"CUDA graphs off for {self.what} ({self.net.device}): {reason}; "
                 "testing eagerly")


class GatherFeed:
    """What a Data layer reads inside a test graph when its feed gathers from a database kept
    on the device (:class:`~caffe_py.io.feed.gather.DeviceGather`): per slot, the host writes
    the batch's record indices (the feed's own position arithmetic, its records marked
    consumed as its ``next()`` marks them), one copy a chunk takes them to the device, and the
    graph gathers and transforms the batch there, the ops ``DeviceGather.next`` runs. So a
    batch costs the host no launch. ``real`` is the layer's feed: a feed, or the root's turns
    over every replica's feed of one stream (``feeds``), each batch from the one whose turn it
    is, all gathered from the first one's copy of the database."""

    def __init__(self, real: Any, gather: DeviceGather, slots: int):
        self.real, self.gather = real, gather
        self.sources: list[Any] = list(getattr(real, "feeds", [real]))
        self.batch = gather.batch_size
        self.index = torch.zeros((slots, self.batch), dtype=torch.int64,
                                 device=gather.pixels.device)
        self.host = np.zeros((slots, self.batch), dtype=np.int64)
        self.cursor = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of the next slot, gathered on the device (inside the capture)."""
        slot = self.cursor % len(self.index)
        self.cursor += 1
        gather, index = self.gather, self.index[slot]
        pixels = gather.pixels.index_select(0, index)
        if gather.crops:
            pixels = gather.transformer.device_crop(pixels, gather.choices_all)
        data = gather.transformer.device(pixels, gather.choices_all, gather.mean)
        return data, gather.labels.index_select(0, index)

    def fill_slot(self, k: int) -> None:
        """Slot k: the record indices of the next batch of the feed whose turn it is."""
        source = self.sources[self.real.turn() if len(self.sources) > 1 else 0]
        loop = source.gatherer
        _, index = loop.positions(source.records.consumed)
        self.host[k] = index
        source.records.mark_consumed(self.batch)
        source.delivered += 1

    def flush(self, length: int) -> None:
        """Slots 0 .. length-1's indices to the device (before the replay; a pinned copy, kept
        by torch's host allocator until the device has read it)."""
        host = torch.from_numpy(self.host[:length])
        self.index[:length].copy_(host.pin_memory() if self.index.is_cuda else host,
                                  non_blocking=True)


def device_gather(real: Any, device: torch.device) -> DeviceGather | None:
    """The database copy on ``device`` a test graph can gather ``real``'s batches from: its
    feed's (the first's, for the root's turns over several) where that feed gathers from a
    database kept on ``device`` and every feed gathers from the same database in the same
    batches; None otherwise (the batches are copied into slots)."""
    sources = list(getattr(real, "feeds", [real]))
    loops = [getattr(source, "gatherer", None) for source in sources]
    first = loops[0]
    if not isinstance(first, DeviceGather) or first.pixels.device != device:
        return None
    if any(loop is None or loop.view.pixels is not first.view.pixels
           or loop.batch_size != first.batch_size or loop.step != first.step
           or loop.fixed is None for loop in loops):
        return None
    return first


def install_feeds(net: Net, slots: int) -> list[StaticFeed | GatherFeed]:
    """Every Data layer of ``net`` reading ``slots`` slots inside the graph: gathered there
    (:class:`GatherFeed`) where its database is on the device, else copied in
    (:class:`~.graphs.StaticFeed`)."""
    def gathered(real: Any, layer: Any) -> GatherFeed | None:
        gather = device_gather(real, net.device)
        return None if gather is None else GatherFeed(real, gather, slots)

    return install_static_feeds(net, net.device, slots, make=gathered)


def chunk_slots(net: Net) -> int:
    """Batches a replay of ``net``'s forward runs: :data:`CHUNK_MAX`, fewer where their static
    slots would pass :data:`CHUNK_SLOT_BYTES`."""
    batch = sum(4 * math.prod(layer.top_shapes[0])
                + 8 * math.prod(layer.top_shapes[1] if len(layer.top_shapes) > 1
                                else layer.top_shapes[0][:1])
                for layer in net.data_layers())
    return max(1, min(CHUNK_MAX, CHUNK_SLOT_BYTES // max(1, batch)))


@contextlib.contextmanager
def _heuristic_algorithms() -> Iterator[None]:
    """cuDNN's heuristics, not its timings, pick the forward's algorithms: the same on every
    device of a kind, so a pass split over GPUs sums the numbers one GPU computes (timed
    choices differ from device to device)."""
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = saved


def graphed_pass(forward: GraphedForward, iterations: int, *, autocast: Autocast,
                 between: Callable[[], bool]) -> dict[str, torch.Tensor] | None:
    """A test pass of ``iterations`` batches through ``forward``: ``run_batches``' means (the
    eager pass where the forward runs eagerly); ``between`` runs before each chunk and True
    stops the pass (None)."""
    forward.check_layout()
    lengths = chunk_lengths(iterations, forward.slots) if forward.ready(autocast) else []
    if not lengths or not forward.capture(lengths, "sum", autocast):
        return run_batches(forward.net, iterations, autocast=autocast, between=between)
    forward.start()
    for length in lengths:
        if between():
            return None
        for k in range(length):
            forward.fill(k)
        forward.replay(length, "sum", autocast)
    assert forward.layout is not None and forward.total is not None
    means = forward.layout.means(forward.total, iterations)
    raise_device_problems(forward.net)
    return means


class GraphedTests:
    """The Solver's ``test_batches`` with each TEST net's forward a :class:`GraphedForward`
    (on the CPU: the eager pass, unless ``emulate``)."""

    def __init__(self, *, emulate: bool = False) -> None:
        self.emulate = emulate
        self.forwards: dict[int, GraphedForward] = {}

    def __call__(self, k: int, net: Net, iterations: int, *, autocast: Autocast,
                 between: Callable[[], bool]) -> dict[str, torch.Tensor] | None:
        if net.device.type != "cuda" and not self.emulate:
            return run_batches(net, iterations, autocast=autocast, between=between)
        forward = self.forwards.get(k)
        if forward is None:
            forward = self.forwards[k] = GraphedForward(net, f"test net #{k}",
                                                        emulate=self.emulate)
        return graphed_pass(forward, iterations, autocast=autocast, between=between)
