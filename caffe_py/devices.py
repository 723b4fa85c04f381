"""The ``--gpus`` flag: which devices a command runs on.

``cpu`` (one CPU replica), ``cpu:N`` (N replicas on the CPU, for testing parallel training
without GPUs), ``0`` / ``0,1,2,3`` (CUDA ids, each checked against the machine) and ``all``.
Without the flag, a solver's ``solver_mode: GPU`` uses ``device_id`` when CUDA exists, and
everything else runs on the CPU.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
from collections.abc import Sequence

import torch

from .cpu_threads import size_threads
from .errors import CaffePyError

log = logging.getLogger(__name__)


DeviceLike = torch.device | str | int
"""A device as a caller may name it: torch.device("cuda", 1), "cuda:1", 1 (a CUDA id), "cpu"."""


class DeviceError(CaffePyError):
    """A device list that names devices this machine does not have."""


MAX_CPU_REPLICAS = 64
"""The most CPU replicas ``--gpus cpu:N`` takes (or the cores, where there are more): each is a
thread with its own copy of the net, and thousands of them exhausted the machine's memory or
its threads before the first iteration, past a stop signal."""

def parse_devices(text: str | None, *, solver_mode: str = "GPU",
                  device_id: int = 0) -> list[torch.device]:
    """The devices ``--gpus text`` names (``None``: the default described above)."""
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if text is None:
        if solver_mode == "GPU" and n_cuda:
            return [_cuda(device_id, n_cuda, f"device_id {device_id}")]
        return [torch.device("cpu")]
    spec = text.strip().lower()
    if spec == "cpu":
        return [torch.device("cpu")]
    if spec.startswith("cpu:"):
        count = spec[4:]
        if not count.isdigit() or int(count) < 1:
            raise DeviceError(f"--gpus {text}: expected cpu:N with N >= 1 CPU replicas, "
                              "e.g. cpu:2")
        cores = os.cpu_count() or 1
        most = max(MAX_CPU_REPLICAS, cores)
        if len(count) > 6 or int(count) > most:
            raise DeviceError(f"--gpus {text}: {count} CPU replicas is more than cpu:{most} "
                              f"({cores} cores here; each replica is a thread with a copy of "
                              f"the net); use at most cpu:{most}")
        if int(count) > cores:
            log.warning(f"Warning: --gpus {text}: {count} CPU replicas on {cores} cores; they "
                        f"take turns, so the run is slower than with cpu:{cores} (the numbers "
                        "are the same)")
        return [torch.device("cpu")] * int(count)
    if spec == "all":
        if not n_cuda:
            raise DeviceError("--gpus all: no CUDA device is available; use --gpus cpu")
        return [torch.device("cuda", i) for i in range(n_cuda)]
    parts = [p.strip() for p in spec.split(",")]
    if not all(p.isdigit() for p in parts):
        raise DeviceError(f"--gpus {text}: expected cpu, cpu:N, all, or GPU ids like 0,1")
    ids = [int(p) for p in parts]
    if len(set(ids)) != len(ids):
        raise DeviceError(f"--gpus {text}: a GPU is listed twice; list each id once")
    return [_cuda(i, n_cuda, f"--gpus {text}") for i in ids]


def _cuda(index: int, n_cuda: int, what: str) -> torch.device:
    if not n_cuda:
        raise DeviceError(f"{what}: no CUDA device is available on this machine; "
                          "use --gpus cpu")
    if index >= n_cuda:
        have = ", ".join(str(i) for i in range(n_cuda))
        raise DeviceError(f"{what}: GPU {index} does not exist (this machine has {n_cuda}: "
                          f"{have}); see cpy device-query")
    return torch.device("cuda", index)


def check_devices(devices: Sequence[DeviceLike]) -> list[torch.device]:
    """Devices as torch.device, each CUDA id existing and listed once (for library callers;
    ``cpy train`` has checked its ``--gpus`` with :func:`parse_devices`)."""
    out = [torch.device("cuda", d) if isinstance(d, int) else torch.device(d) for d in devices]
    if not out:
        raise DeviceError("no device to train on; give --gpus ids, 'all' or cpu:N")
    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    seen: set[int] = set()
    for d in out:
        if d.type != "cuda":
            continue
        index = 0 if d.index is None else d.index
        if index >= available:
            have = f"{available} GPU(s) (ids 0-{available - 1})" if available else "no GPU"
            raise DeviceError(f"GPU {index} does not exist: this machine has {have}; pass "
                              "--gpus with existing ids, 'all', or cpu:N")
        if index in seen:
            raise DeviceError(f"GPU {index} is listed twice in --gpus; list each GPU once")
        seen.add(index)
    kinds = {d.type for d in out}
    if len(kinds) > 1:
        raise DeviceError("--gpus mixes CPU and GPU replicas; use one kind")
    return [torch.device("cuda", d.index or 0) if d.type == "cuda" else d for d in out]


def world_size() -> int:
    """WORLD_SIZE from the launcher's environment (1 when unset): the processes of a run of
    several hosts (docs/parallel.md)."""
    return _launcher_number("WORLD_SIZE", 1, "the count of processes")


def rank() -> int:
    """RANK from the launcher's environment (0 when unset): this process's place among them."""
    return _launcher_number("RANK", 0, "this process's index")


def _launcher_number(name: str, default: int, meaning: str) -> int:
    text = os.environ.get(name, "")
    try:
        return int(text) if text.strip() else default
    except ValueError:
        raise DeviceError(f"{name}={text!r} is not a number; the launcher (torchrun) sets it to "
                          f"{meaning}") from None


def describe(devices: list[torch.device]) -> str:
    """'cpu', 'cpu x 2' or 'cuda:0, cuda:1' for the start-of-run banner."""
    if all(d.type == "cpu" for d in devices):
        return "cpu" if len(devices) == 1 else f"cpu x {len(devices)}"
    return ", ".join(str(d) for d in devices)


# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling on 64-bit machines
TRIM_THRESHOLD = 1 << 30


def prepare_host(devices: Sequence[torch.device]) -> None:
    """Host and backend settings for a run on ``devices``: where one is the CPU, keep freed
    memory and size torch's thread count to the CPUs the process may use (cpu_threads.py);
    where one is a GPU, float32 in IEEE single precision (:func:`ieee_float32`)."""
    if any(d.type == "cuda" for d in devices):
        ieee_float32()
    if any(d.type == "cpu" for d in devices):
        keep_freed_host_memory()
        size_threads()


def ieee_float32() -> None:
    """Float32 convolutions and matrix products in IEEE single precision, as Caffe computes
    them. PyTorch lets cuDNN use TF32 (products of 10-bit mantissas) for float32 convolutions
    unless told otherwise: not Caffe's arithmetic, and for small nets the slower kernels too
    (LeNet's step on an H200: 0.240 ms with TF32, 0.217 ms without; docs/performance.md).
    BF16 and FLOAT16 runs keep their speed: autocast runs their convolutions in half
    precision."""
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


@functools.cache
def keep_freed_host_memory() -> bool:
    """Have glibc's malloc keep freed memory for the next allocation: blocks up to 32 MiB come
    from the heap instead of fresh mappings, and the heap's top is not handed back to the
    kernel below 1 GiB. A net on the CPU allocates the same activations and gradients every
    iteration, and each fresh mapping pays its page faults again (LeNet, batch 64, 2 cores:
    13.1-14.0 -> 10.9-11.6 ms per iteration); the process keeps its peak footprint instead,
    as CUDA's caching allocator does on a GPU. False (nothing changed) without glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # another C library (musl, macOS): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
                and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
