"""pycaffe's process-wide mode: ``set_mode_cpu`` / ``set_mode_gpu`` and ``set_device``.

Nets and solvers made afterwards run on the chosen device (Caffe's mode is read when a net
runs; here it is read when a net is made, which is where BVLC's examples set it). Without a
CUDA device, ``set_mode_gpu`` warns once and nets stay on the CPU, so that a script written for
a GPU still runs.
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)
_state = {"gpu": False, "device": 0, "warned": False}


def set_mode_cpu() -> None:
    _state["gpu"] = False


def set_mode_gpu() -> None:
    _state["gpu"] = True


def set_device(device_id: int) -> None:
    _state["device"] = int(device_id)


def device() -> torch.device:
    """The device new nets and solvers are built on."""
    if not _state["gpu"]:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if not _state["warned"]:
            _state["warned"] = True
            log.warning("caffe.set_mode_gpu(): no CUDA device here; nets run on the CPU")
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if not 0 <= int(_state["device"]) < count:
        from .errors import PycaffeError

        raise PycaffeError(f"caffe.set_device({_state['device']}): this machine has {count} "
                           f"CUDA device(s) (0 to {count - 1})")
    from ..devices import ieee_float32

    ieee_float32()   # Caffe's float32 arithmetic on the GPU too
    return torch.device(f"cuda:{_state['device']}")
