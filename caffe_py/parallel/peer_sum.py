"""The collectives of whole-iteration replicas on one host: small gradient buckets summed by
the replicas' GPUs reading each other's memory (csrc/peer_sum.cu), the rest by NCCL's
all-reduce.

NCCL's all-reduce costs a few microseconds of latency a call whatever its size, and the bucket
reduced after the end of backward is on every iteration's critical path: on two H200s LeNet's
iteration took 0.247 ms against one GPU's 0.226, the all-reduce making most of the difference
(docs/parallel.md). A peer sum is one kernel a device: every device reads the bucket of every
replica over peer access and adds the N values in replica order, so each gets the same bits
(on two replicas, NCCL's bits too: a + b either way). It reads (N - 1) buckets across the
links where NCCL's ring moves about 2 (N - 1) / N of one, so it is the faster only while
latency dominates: buckets up to :data:`PEER_SUM_BYTES` / (N - 1) bytes take it.

Both are kernels a CUDA graph holds, issued in the same order on every replica (the buckets of
an iteration, each in turn on the replicas' side streams).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)

PEER_SUM_BYTES = 4 * 2**20
"""A float32 bucket of up to PEER_SUM_BYTES / (N - 1) bytes is summed over peer access: 4 MiB
on 2 GPUs, 2 MiB on 3, 1.33 MiB on 4, each within the sizes where the peer sum was the faster
on 4 x H200 (benchmarks/peer_sum.py, docs/parallel.md: up to 8 MiB on 2 GPUs, 4 MiB on 3,
2 MiB on 4)."""

PEER_WAIT_S = 60.0
"""How long a peer sum waits for a peer's call before it traps (a CUDA error on its device,
which the run reports, instead of a hang): a replica that never launched its call."""


class PeerCollectives:
    """``all_reduce(parts, streams)`` as ``torch.cuda.nccl``'s, sending small float32 buckets
    through :func:`peer_sum` (one per device of ``devices``, in replica order)."""

    def __init__(self, devices: Sequence[torch.device], nccl: Any, ext: Any,
                 max_bytes: int | None = None):
        self.devices = list(devices)
        self.nccl, self.ext = nccl, ext
        n = len(self.devices)
        self.max_numel = (PEER_SUM_BYTES if max_bytes is None else max_bytes) // (4 * (n - 1))
        """The longest bucket (float32 elements) summed over peer access."""
        self.flags = [torch.zeros(ext.peer_sum_flag_count(), dtype=torch.int32, device=d)
                      for d in self.devices]
        self.counters = [torch.zeros(ext.peer_sum_counter_count(), dtype=torch.int32,
                                     device=d) for d in self.devices]
        self.scratch = [torch.empty(self.max_numel, device=d) for d in self.devices]

    @classmethod
    def on(cls, devices: Sequence[torch.device], nccl: Any) -> PeerCollectives | None:
        """The collectives for ``devices``, or None where peer sums cannot run there (a CPU
        device, one device or more than 8, a GPU twice or without its index, a pair without
        peer access or without native atomics between them (PCIe), the CUDA extension not
        built): NCCL's all-reduce alone then."""
        indices = [torch.device(d).index for d in devices]
        if (not 2 <= len(devices) <= 8 or any(d.type != "cuda" for d in devices)
                or None in indices or len(set(indices)) != len(indices)):
            return None
        from ..kernels import build

        try:
            ext = build.load()
        except build.BuildError as exc:
            log.info(f"Small gradient buckets go through NCCL: {exc}")
            return None
        if not ext.enable_peer_access(indices):
            log.info("Small gradient buckets go through NCCL: a pair of the GPUs has no peer "
                     "access over an NVLink-class link")
            return None
        return cls(devices, nccl, ext)

    def limit_text(self) -> str:
        """The longest bucket summed over peer access, as the banner says it ("4 MiB")."""
        size = self.max_numel * 4
        for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
            if size >= scale:
                return f"{size / scale:.3g} {unit}"
        return f"{size} bytes"

    def takes(self, part: torch.Tensor) -> bool:
        """Whether a bucket of this size and type is summed over peer access."""
        return (0 < part.numel() <= self.max_numel and part.dtype == torch.float32
                and part.is_contiguous())

    def all_reduce(self, parts: Sequence[torch.Tensor],
                   streams: Sequence[torch.cuda.Stream] | None = None) -> None:
        """Every part (one a replica, in replica order) replaced by their sum, on each
        device's stream of ``streams`` (default: its current one)."""
        if not self.takes(parts[0]):
            self.nccl.all_reduce(list(parts), streams=streams)
            return
        parts = list(parts)
        for r, part in enumerate(parts):
            stream = streams[r] if streams is not None else torch.cuda.current_stream(part.device)
            with torch.cuda.device(part.device), torch.cuda.stream(stream):
                self.ext.peer_sum(parts, r, self.flags, self.scratch[r], self.counters[r],
                                  PEER_WAIT_S)


def replica_sum(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """The parts' sum on the host, float32 adds in replica order: the peer sum's bits (its
    tests' oracle) and CPU replicas' all-reduce (:class:`~.captured.AllReduceGroup`)."""
    total = parts[0].detach().cpu().clone()
    for part in parts[1:]:
        total += part.detach().cpu()
    return total
