"""One replica's parameters and gradients as views into two flat buffers (Caffe's GPUParams).

After :class:`FlatParams` is built, every ``param.data`` is a view into ``flat.data`` and every
``param.grad`` a view into ``flat.grad``, so moving all the weights (or all the gradients) of a
replica is one copy per bucket instead of one per tensor, and the solver keeps updating the very
same ``nn.Parameter`` objects.

Layout: parameters are laid out in *reverse* order, so that the parameters whose gradients
backward produces first (the last layers) come first; the buffer is then cut into buckets of
about ``bucket_bytes`` at parameter boundaries. Bucket 0 is the first one ready during backward.
Each parameter starts on a 64-byte boundary (its padding stays zero) and keeps its own strides
(a channels_last weight stays channels_last).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

ALIGN_BYTES = 64
DEFAULT_BUCKET_BYTES = 25 * 2**20
REDUCTION_PARTS = 4
"""A gradient smaller than this many default buckets is still reduced in about this many
(:func:`plan_reduction`)."""


@dataclass(frozen=True)
class Bucket:
    """Elements [start, end) of the flat buffers, holding the parameters ``members``."""

    index: int
    start: int
    end: int
    members: tuple[int, ...]
    """Indices into the parameter list, in layout order."""

    @property
    def numel(self) -> int:
        return self.end - self.start


class FlatParams:
    """Flat data (and optionally grad) buffers for a list of same-dtype, same-device tensors.

    ``with_grad=False`` is for state blobs (BatchNorm statistics) that are broadcast with the
    weights but never reduced.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], *, with_grad: bool = True,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        self.tensors = list(tensors)
        self.with_grad = with_grad
        if not self.tensors:
            self.data = torch.empty(0)
            self.grad = torch.empty(0) if with_grad else None
            self.offsets: list[int] = []
            self.strides: list[tuple[int, ...]] = []
            self.buckets: list[Bucket] = []
            self.bucket_of: list[int] = []
            self._grad_pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
            return
        first = self.tensors[0]
        for k, t in enumerate(self.tensors):
            if t.dtype != first.dtype or t.device != first.device:
                raise ValueError(f"flat buffers need one dtype and device: tensor {k} is "
                                 f"{t.dtype} on {t.device}, tensor 0 {first.dtype} on "
                                 f"{first.device}")
        self.offsets, total = _layout(self.tensors)
        self.strides = [_dense_strides(t) for t in self.tensors]
        self.data = torch.zeros(total, dtype=first.dtype, device=first.device)
        self.grad = torch.zeros_like(self.data) if with_grad else None
        self.buckets = _cut(self.tensors, self.offsets, total, bucket_bytes)
        self.bucket_of = [0] * len(self.tensors)
        for b in self.buckets:
            for k in b.members:
                self.bucket_of[k] = b.index
        self._bind()

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def numel(self) -> int:
        return self.data.numel()

    def view(self, buffer: torch.Tensor, k: int) -> torch.Tensor:
        """Tensor ``k``'s window of ``buffer`` (data, grad, or a same-layout buffer)."""
        return buffer.as_strided(self.tensors[k].shape, self.strides[k], self.offsets[k])

    def bucket(self, buffer: torch.Tensor, b: int) -> torch.Tensor:
        """Bucket ``b``'s slice of ``buffer``."""
        bk = self.buckets[b]
        return buffer[bk.start:bk.end]

    def rebind_grads(self) -> int:
        """Make every ``param.grad`` a view into ``self.grad`` again; returns how many moved.

        A solver that sets ``grad = None`` when it clears, or an autograd step that replaced
        a gradient, leaves gradients outside the buffer: copy them in (or zero the window
        when there is none) so the buffer holds exactly the current gradients. Frozen tensors
        (``requires_grad`` False, Caffe's lr_mult 0) keep no gradient; their window stays 0.

        Hot path (every iteration of every replica): one identity test per parameter against
        the views made once at bind time (autograd accumulates in place, so ``param.grad`` is
        the very same tensor object), no per-parameter tensor op unless one really moved.
        """
        assert self.grad is not None
        moved = 0
        for t, view in self._grad_pairs:
            g = t.grad
            if g is view:
                continue
            if g is None:
                view.zero_()
            elif g.data_ptr() != view.data_ptr() or g.stride() != view.stride():
                view.copy_(g)
            else:           # another view of the same window: nothing moved
                t.grad = view
                continue
            t.grad = view
            moved += 1
        return moved

    def _bind(self) -> None:
        self._grad_pairs = []
        for k, t in enumerate(self.tensors):
            view = self.view(self.data, k)
            view.copy_(t.detach())
            t.data = view
            if self.grad is not None and t.requires_grad:
                grad = self.view(self.grad, k)
                if t.grad is not None:
                    grad.copy_(t.grad)
                t.grad = grad
                self._grad_pairs.append((t, grad))


def plan_reduction(flat: FlatParams, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                   parts: int = REDUCTION_PARTS) -> list[Bucket]:
    """The buckets a gradient is all-reduced in while backward runs, first ready first.

    Buckets of at least ``bucket_bytes`` (ResNet-50's 102 MB: 4), or of a ``parts``-th of the
    buffer when that is smaller, so that a small net's last layers are reduced while its first
    layers still run backward (LeNet's 1.7 MB: the two InnerProducts, then the two
    Convolutions). Cut at tensor boundaries in layout order, like :attr:`FlatParams.buckets`.
    """
    if not flat.tensors:
        return []
    size = flat.numel * flat.data.element_size()
    return _cut(flat.tensors, flat.offsets, flat.numel,
                min(bucket_bytes, max(1, size // max(1, parts))))


class BucketCount:
    """When backward has finished each bucket of one replica's gradient: a post-accumulate
    hook per parameter that gets a gradient (:meth:`hook`) counts its bucket, which is
    complete once every such parameter has accumulated once per backward pass (the solver's
    ``iter_size``). Counts only between :meth:`begin` and :meth:`end`."""

    def __init__(self, flat: FlatParams, buckets: Sequence[Bucket]):
        self.flat = flat
        self.expected = [sum(flat.tensors[k].requires_grad for k in b.members)
                         for b in buckets]
        """Per bucket: the parameters that get a gradient."""
        self.fired = [0] * len(self.expected)
        """Per bucket: accumulations seen this iteration."""
        self.passes = 1
        self.collecting = False
        self._bucket_of = {k: b.index for b in buckets for k in b.members}

    def hook(self, on_complete: Callable[[int], None],
             counts: Callable[[], bool] | None = None) -> None:
        """Call ``on_complete(b)`` from backward's thread once bucket b is complete
        (``counts``: whether an accumulation counts now, e.g. not while a graph records)."""
        for k, t in enumerate(self.flat.tensors):
            if t.requires_grad:
                t.register_post_accumulate_grad_hook(
                    lambda _p, b=self._bucket_of[k]: self._fired(b, on_complete, counts))

    def _fired(self, b: int, on_complete: Callable[[int], None],
               counts: Callable[[], bool] | None) -> None:
        if not self.collecting or (counts is not None and not counts()):
            return
        self.fired[b] += 1
        if self.fired[b] == self.expected[b] * self.passes:
            on_complete(b)

    def begin(self, passes: int) -> None:
        """An iteration of ``passes`` backward passes starts: count from zero."""
        self.passes = max(1, int(passes))
        self.fired = [0] * len(self.expected)
        self.collecting = True

    def end(self) -> None:
        self.collecting = False


def _layout(tensors: Sequence[torch.Tensor]) -> tuple[list[int], int]:
    """Offsets (in elements) for tensors laid out in reverse order, each 64-byte aligned."""
    align = max(1, ALIGN_BYTES // tensors[0].element_size())
    offsets = [0] * len(tensors)
    pos = 0
    for k in reversed(range(len(tensors))):
        offsets[k] = pos
        pos += -(-tensors[k].numel() // align) * align
    return offsets, pos


def _cut(tensors: Sequence[torch.Tensor], offsets: list[int], total: int,
         bucket_bytes: int) -> list[Bucket]:
    """Cut the layout into buckets of >= bucket_bytes at tensor boundaries (the last smaller)."""
    limit = max(1, bucket_bytes // tensors[0].element_size())
    buckets: list[Bucket] = []
    members: list[int] = []
    start = 0
    order = list(reversed(range(len(tensors))))
    for pos, k in enumerate(order):
        members.append(k)
        end = offsets[order[pos + 1]] if pos + 1 < len(order) else total
        if end - start >= limit or pos + 1 == len(order):
            buckets.append(Bucket(len(buckets), start, end, tuple(members)))
            members, start = [], end
    return buckets


def _dense_strides(t: torch.Tensor) -> tuple[int, ...]:
    """The tensor's own strides when dense (contiguous or channels_last), else contiguous."""
    if t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)):
        return tuple(t.stride())
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))
