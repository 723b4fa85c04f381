"""Batches gathered in the training thread from a decoded database (no feed or reader thread).

Once the reader keeps a stream's database decoded (a small database, after its first pass), a feed
with a small batch stops its thread and makes each batch here, from the reader's
:class:`~caffe_py.io.reader.records.DecodedView`: which records by position arithmetic (the
consumer's record c is database record ``(origin + start + step c) mod N``, exactly where the reader
would have read it), then one numpy gather with the crop. On CUDA a database small enough is kept on
the device when the transform has no random choices (:class:`DeviceGather`: a batch is a slice), and
otherwise several batches are staged at once (:class:`StagedGather`): a few microseconds of the
loop's own time per batch instead of two threads waking and taking the GIL. The batches are the
threaded path's, bit for bit. """
from __future__ import annotations

import numpy as np
import torch

from ..reader.records import DecodedView
from .transformer import Choices, Transformer

STAGE_BATCHES = 8
STAGE_BYTES = 8 << 20
"""On CUDA the loop stages up to STAGE_BATCHES batches (at most STAGE_BYTES of records) at
once: one gather, two copies, the batches' views and an event per stage; per batch only a
stream lookup and the transform (a Python call into torch is what counts in a launch-bound
loop)."""


class HostGather:
    """Where a feed's batches lie in the decoded database, and (CPU) the batches themselves:
    ``next(consumed)`` -> data (B, C, h, w) float32, labels (B,) int64, by numpy.

    ``k`` batches are located at once (1 here; :class:`StagedGather` stages more)."""

    k = 1

    def __init__(self, view: DecodedView, batch_size: int, transformer: Transformer):
        self.view, self.transformer, self.batch_size = view, transformer, batch_size
        if view.unit != 1 and (view.unit != batch_size or view.start % view.unit):
            raise ValueError(f"turns of {view.unit} records from position {view.start} are "
                             f"not whole batches of {batch_size}")
        self.step = view.step if view.unit == 1 else 1
        """Positions between a batch's records: the replicas in turns of a record, else 1."""
        self.stride = view.step * batch_size
        """Positions between this consumer's consecutive batches (either way)."""
        self.start = view.start
        self.origin, self.size = view.origin, view.size
        self.fixed: Choices | None = None if transformer.random else \
            transformer.choices_for(0, self.step, batch_size)
        """The constant choices of a transform without randomness (None: drawn per batch)."""
        n = self.k * batch_size
        record = np.arange(n, dtype=np.int64)
        self.offsets = record // batch_size * self.stride + record % batch_size * self.step
        """(k B,): each record's position after the first's."""
        self.index = np.empty(n, dtype=np.int64)  # filled in place: no array per batch
        self.span = int(self.offsets[-1])

    def located(self, consumed: int) -> tuple[int, int, bool]:
        """The first stream position of the ``k`` batches after ``consumed`` records, its
        database record, and whether their records wrap past the end of the database."""
        batches, within = divmod(consumed, self.batch_size)
        first = self.start + self.stride * batches + self.step * within
        low = (self.origin + first) % self.size
        return first, low, low + self.span >= self.size

    def positions(self, consumed: int) -> tuple[int, np.ndarray]:
        """The first position of the ``k`` batches after ``consumed`` records, and their
        (k B,) database records (``self.index``, rewritten by the next call)."""
        first, low, wraps = self.located(consumed)
        index = np.add(self.offsets, low, out=self.index)
        if wraps:
            np.remainder(index, self.size, out=index)
        return first, index

    def choices(self, first: int) -> Choices:
        """The choices of the batch starting at position ``first``."""
        if self.fixed is not None:
            return self.fixed
        return self.transformer.choices_for(first, self.step, self.batch_size)

    def next(self, consumed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch after ``consumed`` records: the gather and the numpy value half of the
        transform, as the feed thread runs it."""
        first, index = self.positions(consumed)
        choices = self.choices(first)
        pixels = self.transformer.gather(self.view.pixels, index, choices)
        data = torch.from_numpy(self.transformer.numpy_values(pixels, choices))
        return data, torch.from_numpy(self.view.labels[index])


class _Stage:
    """A pinned staging buffer: ``k`` batches of records (k, B, C, h, w) in their own dtype,
    their labels (k, B) int64, and the event marking both copied to the device (refilled only
    after it)."""

    def __init__(self, k: int, batch_size: int, shape: tuple[int, ...], dtype: np.dtype):
        tdtype = torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
        self.pixels = torch.empty((k, batch_size, *shape), dtype=tdtype, pin_memory=True)
        self.labels = torch.empty((k, batch_size), dtype=torch.int64, pin_memory=True)
        self.host_pixels = self.pixels.numpy().reshape(k * batch_size, *shape)  # views
        self.host_labels = self.labels.numpy().reshape(k * batch_size)
        self.done = torch.cuda.Event()  # a query before its first record is True


class StagedGather(HostGather):
    """CUDA: ``k`` batches (up to STAGE_BATCHES, STAGE_BYTES of records) gathered at once into
    one of two pinned stages and copied to fresh device tensors (records, labels: two copies),
    split there into each batch's views; a batch is then its views and the transform, so the
    per-batch host work is a stream lookup and one op. The device tensors are never
    written again, so the labels handed out (views) need no clone and stay valid however long
    they are kept."""

    def __init__(self, view: DecodedView, batch_size: int, transformer: Transformer,
                 device: torch.device, mean: torch.Tensor | None):
        batch_bytes = batch_size * view.pixels[0].nbytes
        self.k = max(1, min(STAGE_BATCHES, STAGE_BYTES // max(1, batch_bytes)))
        super().__init__(view, batch_size, transformer)
        self.device = device.index if device.index is not None else torch.cuda.current_device()
        self.mean = mean
        self.stages = [_Stage(self.k, batch_size, transformer.out_shape, view.pixels.dtype)
                       for _ in range(2)]
        self.turn = 0
        self.taken = self.k  # batches of the staged ones handed out (k: stage more)
        self.stream: torch.cuda.Stream | None = None  # where the staged copies ran
        self.pixels: torch.Tensor | None = None  # (k, B, C, h, w) on the device
        self.labels: torch.Tensor | None = None  # (k, B) int64 on the device
        self.batches: list[tuple[torch.Tensor, torch.Tensor]] = []  # their k batches' views
        self.choices_k: Choices | None = None  # the staged batches' choices (k B)

    def next(self, consumed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch after ``consumed`` records: (B, C, h, w) float32, (B,) int64."""
        stream = torch.cuda.current_stream(self.device)  # the one lookup of the batch
        if self.taken == self.k:
            self.stage(consumed, stream)
        elif stream != self.stream:
            self._follow(stream)
        k = self.taken
        self.taken = k + 1
        choices = self.fixed
        if choices is None:
            staged = self.choices_k
            assert staged is not None  # set by stage(), which the first call runs
            picked = slice(k * self.batch_size, (k + 1) * self.batch_size)
            choices = Choices(staged.offsets[picked], staged.flips[picked])
        pixels, labels = self.batches[k]
        return self.transformer.device(pixels, choices, self.mean), labels

    def stage(self, consumed: int, stream: torch.cuda.Stream) -> None:
        """Gather the next ``k`` batches (crops and flips included) into a pinned stage and
        copy it to fresh device tensors on ``stream`` (the current, compute stream: what
        the loop does with the batches is ordered after the copies)."""
        stage = self.stages[self.turn]
        self.turn ^= 1
        if not stage.done.query():  # its copies were queued k batches ago: done by now
            stage.done.synchronize()
        first, index = self.positions(consumed)
        choices = (self.transformer.choices(first + self.offsets) if self.transformer.random
                   else self.transformer.choices_for(first, self.step, len(index)))
        self.transformer.gather(self.view.pixels, index, choices, stage.host_pixels)
        np.take(self.view.labels, index, out=stage.host_labels, mode="clip")
        self.pixels = stage.pixels.to(self.device, non_blocking=True)
        self.labels = stage.labels.to(self.device, non_blocking=True)
        self.batches = list(zip(self.pixels.unbind(0), self.labels.unbind(0), strict=True))
        stage.done.record(stream)
        self.stream, self.choices_k, self.taken = stream, choices, 0

    def _follow(self, stream: torch.cuda.Stream) -> None:
        """The loop's current stream changed since the stage was copied: order it after the
        copies, and keep the allocator from reusing the tensors while it reads them."""
        assert self.stream is not None and self.pixels is not None and self.labels is not None
        stream.wait_stream(self.stream)
        self.pixels.record_stream(stream)
        self.labels.record_stream(stream)
        self.stream = stream


class DeviceGather(HostGather):
    """CUDA, a database small enough to keep on the device (:func:`resident_bytes`) and a
    transform without random choices: the decoded records and labels are copied to the device
    once; a batch is then a slice of them (a view: two slices joined on the device where it
    wraps past the end), its crop window a view too, and the transform one op. That is less
    host work per batch than a plain loop's slice, float conversion and scale. The copies are
    never written, so the batches' views stay valid however long they are kept."""

    def __init__(self, view: DecodedView, batch_size: int, transformer: Transformer,
                 device: torch.device, mean: torch.Tensor | None):
        super().__init__(view, batch_size, transformer)
        assert self.fixed is not None, "a random transform gathers on the host (StagedGather)"
        self.choices_all: Choices = self.fixed  # every batch's
        self.mean = mean
        self.pixels = torch.from_numpy(view.pixels).to(device)
        self.labels = torch.from_numpy(view.labels).to(device)
        if device.type == "cuda":  # once: any stream may read them now
            torch.cuda.current_stream(device).synchronize()
        self.crops = tuple(transformer.out_shape) != tuple(view.pixels.shape[1:])
        """Whether a batch is cut to its (centre) crop window: a view, by the transformer."""

    def next(self, consumed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch after ``consumed`` records: (B, C, h, w) float32, (B,) int64."""
        _, low, wraps = self.located(consumed)
        if not wraps:
            rows = slice(low, low + self.span + 1, self.step)
            pixels, labels = self.pixels[rows], self.labels[rows]
        else:  # once a pass
            _, index = self.positions(consumed)
            where = torch.from_numpy(index).to(self.pixels.device)
            pixels, labels = self.pixels[where], self.labels[where]
        if self.crops:
            pixels = self.transformer.device_crop(pixels, self.choices_all)
        return self.transformer.device(pixels, self.choices_all, self.mean), labels


RESIDENT_BYTES = 1 << 30
RESIDENT_SHARE = 20
"""A decoded database stays on the device when it takes at most RESIDENT_BYTES and at most
1/RESIDENT_SHARE of the device's memory (each replica keeps its own copy)."""


def resident_bytes(device: torch.device) -> int:
    """How large a decoded database :class:`DeviceGather` keeps on ``device``."""
    total = torch.cuda.get_device_properties(device).total_memory
    return min(RESIDENT_BYTES, total // RESIDENT_SHARE)


def resides(view: DecodedView, transformer: Transformer, device: torch.device) -> bool:
    """Whether the in-loop gather keeps ``view``'s database on ``device``
    (:class:`DeviceGather`): CUDA, a fixed transform, and a database of at most
    :func:`resident_bytes`."""
    return (device.type == "cuda" and not transformer.random
            and view.pixels.nbytes + view.labels.nbytes <= resident_bytes(device))


def loop_gather(view: DecodedView, batch_size: int, transformer: Transformer,
                device: torch.device, mean: torch.Tensor | None) -> HostGather:
    """The in-loop gather for ``device``: on CUDA the database on the device where it is small
    and the transform fixed (:func:`resides`), else staged; by numpy on the CPU."""
    if device.type == "cuda":
        if resides(view, transformer, device):
            return DeviceGather(view, batch_size, transformer, device, mean)
        return StagedGather(view, batch_size, transformer, device, mean)
    return HostGather(view, batch_size, transformer)
