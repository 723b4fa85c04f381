"""The loss history and the run's device-side checks, read without stalling the device.

Every iteration's loss goes into a ring on the device (no host sync; the losses of a few
iterations are stacked into it at once, a launch-bound step pays for each copy). Caffe's
smoothed loss is the mean of its last ``average_loss`` entries. Every ``CHECK_INTERVAL``
iterations, :meth:`Monitor.poll` copies the ring and every layer's
:class:`~caffe_py.layers.base.DeviceCheck` state to pinned host memory without blocking, and
reads the previous copy, whose copy has long finished: a non-finite loss or a bad label stops
the run within 2 x CHECK_INTERVAL iterations whatever the display setting, and the loop never
waits for the device to catch up. :meth:`Monitor.check_now` reads everything at once (before a
snapshot, at display and at the end, where the loop syncs anyway).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import DataError, SolverError

CHECK_INTERVAL = 16
"""Iterations between two polls of the device-side checks."""
RING = 256
"""Losses kept on the device (at least average_loss)."""


@dataclass
class _Copy:
    """One poll's host copies and the range of iterations they cover."""

    losses: torch.Tensor
    iterations: list[int]
    upto: int
    states: list[torch.Tensor]
    event: torch.cuda.Event | None


class Monitor:
    """The losses and device checks of one replica's nets (see the module docstring)."""

    def __init__(self, device: torch.device, average_loss: int, checks: Sequence,
                 interval: int = CHECK_INTERVAL):
        self.device = device
        self.average = max(average_loss, 1)
        # A pending copy is judged a poll late, and a runner may advance several iterations
        # at once: the ring holds far more than the span between two judged copies.
        self.window = max(self.average, RING)
        self.interval = interval
        self.losses = torch.zeros(self.window, device=device)
        self.iterations = [-1] * self.window
        """The iteration whose loss each slot of the ring holds (-1: none yet)."""
        self.count = 0
        """Losses recorded so far; the next goes to slot count % window."""
        self.checks = list(checks)
        self.checked = 0
        """Iterations before this one are known to have had finite losses."""
        self._pending: _Copy | None = None
        self._pinned: list[list[torch.Tensor]] = []
        """Two sets of pinned host buffers, used in turn (CUDA only)."""
        self._polls = 0
        self._fresh: list[tuple[int, torch.Tensor]] = []
        """Losses noted but not yet in the ring (at most ``interval``)."""
        self._last_poll = 0

    def record(self, iteration: int, loss: torch.Tensor) -> None:
        """Note this iteration's loss (a device scalar); it reaches the ring with the next few."""
        self._fresh.append((iteration, loss))
        if len(self._fresh) >= self.interval:
            self._flush()

    def record_many(self, first: int, losses: torch.Tensor) -> None:
        """Put the losses of iterations first, first + 1, ... (a device vector) into the ring."""
        self._flush()
        self._store(list(range(first, first + len(losses))), losses)

    def _flush(self) -> None:
        if self._fresh:
            iterations, losses = zip(*self._fresh, strict=True)
            self._fresh = []
            self._store(list(iterations), torch.stack(losses))

    def _store(self, iterations: list[int], losses: torch.Tensor) -> None:
        """One copy into the ring, or two where it wraps."""
        n, start = len(losses), self.count % self.window
        head = min(n, self.window - start)
        self.losses[start:start + head].copy_(losses[:head])
        if head < n:
            self.losses[:n - head].copy_(losses[head:])
        for j, it in enumerate(iterations):
            self.iterations[(start + j) % self.window] = it
        self.count += n

    def smoothed(self) -> float:
        """The mean of the last average_loss losses (a host sync; 0 before the first)."""
        self._flush()
        n = min(self.count, self.average)
        if not n:
            return 0.0
        slots = [(self.count - 1 - k) % self.window for k in range(n)]
        return float(self.losses[slots].mean())

    def poll(self, iteration: int) -> None:
        """Every ``interval`` iterations: act on the previous copy, then start a new one."""
        if iteration - self._last_poll < self.interval:
            return
        self._last_poll = iteration
        self._flush()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._judge(pending)
        copy = self._copy(non_blocking=self.device.type == "cuda")
        if copy.event is None:  # CPU: the copy is done, judge it now
            self._judge(copy)
        else:
            self._pending = copy

    def check_now(self) -> None:
        """Read every loss and check recorded so far and raise the first problem."""
        self._flush()
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._judge(pending)
        self._judge(self._copy(non_blocking=False))

    def _copy(self, non_blocking: bool) -> _Copy:
        upto = max(self.iterations) + 1
        tensors = [self.losses, *(c.state for c in self.checks)]
        if non_blocking:
            if not self._pinned:
                self._pinned = [[torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                                 for t in tensors] for _ in range(2)]
            host = self._pinned[self._polls % 2]
            self._polls += 1
            for h, t in zip(host, tensors, strict=True):
                h.copy_(t, non_blocking=True)
            event = torch.cuda.Event()   # on the copies' stream: the ring's device's
            event.record(torch.cuda.current_stream(self.losses.device))
        else:
            host, event = [t.detach().cpu() for t in tensors], None
        return _Copy(host[0], list(self.iterations), upto, host[1:], event)

    def _judge(self, copy: _Copy) -> None:
        if copy.event is not None:
            copy.event.synchronize()   # long finished unless the device is far behind
        bad = []
        if not bool(np.isfinite(copy.losses.numpy()).all()):  # the usual case: one look
            bad = [it for it, value in zip(copy.iterations, copy.losses.tolist(), strict=True)
                   if it >= self.checked and not math.isfinite(value)]
        if bad:
            raise SolverError(f"iteration {min(bad)}: the loss is not finite (NaN or inf); "
                              "training stopped and no snapshot was written after it; lower "
                              "base_lr, set clip_gradients, or check the data")
        self.checked = max(self.checked, copy.upto)
        for check, state in zip(self.checks, copy.states, strict=True):
            problem = check.problem(state)
            if problem is not None:
                raise DataError(problem)
