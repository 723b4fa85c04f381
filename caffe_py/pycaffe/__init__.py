"""pycaffe's Python interface (BVLC Caffe 1.0's ``import caffe``) over caffe-py.

    import caffe_py.pycaffe as caffe

    net = caffe.Net("deploy.prototxt", "weights.caffemodel", caffe.TEST)
    net.blobs["data"].data[...] = image
    prob = net.forward()["prob"]

or, for a script written against pycaffe, unchanged::

    python -m caffe_py.pycaffe classify.py cat.jpg out.npy      # also: cpy pycaffe ...

which runs the script with ``import caffe`` (and ``caffe.io``, ``caffe.proto.caffe_pb2``,
``caffe.draw``...) resolved to this package for that process only. docs/pycaffe.md lists what
is covered; any other name is a one-line error naming it and the nearest covered one.
"""
from __future__ import annotations

import logging
import time
from typing import Any

from ..layers import pycaffe as _standin
from . import caffe_stream as _stream
from . import io
from .classifier import Classifier
from .detector import Detector
from .errors import missing
from .mode import set_device, set_mode_cpu, set_mode_gpu
from .net import Net
from .solver import (
    AdaDeltaSolver,
    AdaGradSolver,
    AdamSolver,
    NesterovSolver,
    RMSPropSolver,
    SGDSolver,
    Solver,
    get_solver,
)

__version__ = "1.0.0"
"""The pycaffe version this interface follows (BVLC Caffe 1.0)."""

TRAIN = _standin.TRAIN
TEST = _standin.TEST
Layer = _standin.Layer
Blob = _standin.Blob
BlobVec = _standin.BlobVec
_solver_state = {"count": 1, "rank": 0, "multiprocess": False}
_LAZY = {"layers": "net_spec", "params": "net_spec", "NetSpec": "net_spec",
         "to_proto": "net_spec", "net_spec": "net_spec", "draw": "draw", "proto": "proto",
         "classifier": "classifier", "detector": "detector", "pycaffe": "net"}


def set_random_seed(seed: int) -> None:
    """Caffe::set_random_seed: seeds Caffe's random stream (fillers, Dropout) and torch's."""
    import torch

    _stream.STREAM.seed(int(seed))
    torch.manual_seed(int(seed) & 0xFFFFFFFF)


def init_log(level: int = 0, stderr: bool = True) -> None:
    """glog's setup: caffe-py's log to stderr at ``level`` (0 INFO, 1 WARNING, 2 ERROR)."""
    logger = logging.getLogger("caffe_py")
    logger.setLevel((logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)[
        max(0, min(int(level), 3))])
    if not any(getattr(h, "_pycaffe", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler._pycaffe = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)


def log(message: str) -> None:
    """LOG(INFO) << message."""
    logging.getLogger("caffe_py.pycaffe").info(message)


def layer_type_list() -> list[str]:
    """The layer types caffe-py builds (Caffe's LayerRegistry::LayerTypeList)."""
    from ..layers import registry

    return registry.known_types()


def solver_count() -> int:
    return int(_solver_state["count"])


def set_solver_count(count: int) -> None:
    _solver_state["count"] = int(count)


def solver_rank() -> int:
    return int(_solver_state["rank"])


def set_solver_rank(rank: int) -> None:
    _solver_state["rank"] = int(rank)


def set_multiprocess(multiprocess: bool) -> None:
    _solver_state["multiprocess"] = bool(multiprocess)


def has_nccl() -> bool:
    """pycaffe's multi-GPU training (caffe.NCCL) is not covered: always False."""
    return False


class Timer:
    """Caffe's Timer: ``start()``, ``stop()``, ``ms``."""

    def __init__(self) -> None:
        self._start: float | None = None
        self._elapsed = 0.0

    def start(self) -> None:
        self._start = time.perf_counter()

    def stop(self) -> None:
        if self._start is not None:
            self._elapsed = time.perf_counter() - self._start
            self._start = None

    @property
    def ms(self) -> float:
        if self._start is not None:
            self.stop()
        return self._elapsed * 1000.0


_COVERED = ["Net", "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver",
            "AdaDeltaSolver", "AdamSolver", "Solver", "get_solver", "Timer", "init_log", "log",
            "set_mode_cpu", "set_mode_gpu", "set_device", "Layer", "Blob", "BlobVec",
            "layer_type_list", "set_random_seed", "solver_count", "set_solver_count",
            "solver_rank", "set_solver_rank", "set_multiprocess", "has_nccl", "__version__",
            "TRAIN", "TEST", "Classifier", "Detector", "io", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is not None:  # protobuf and pydot are only needed by those who use them
        import importlib

        loaded = importlib.import_module(f"{__name__}.{module}")
        value = loaded if name == module else getattr(loaded, name)
        globals()[name] = value
        return value
    if name.startswith("__"):
        raise AttributeError(name)
    raise missing("caffe", name, _COVERED)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_COVERED))


__all__ = ["Net", "SGDSolver", "NesterovSolver", "AdaGradSolver", "RMSPropSolver",
           "AdaDeltaSolver", "AdamSolver", "Solver", "get_solver", "Timer", "init_log", "log",
           "set_mode_cpu", "set_mode_gpu", "set_device", "Layer", "Blob", "BlobVec",
           "layer_type_list", "set_random_seed", "solver_count", "set_solver_count",
           "solver_rank", "set_solver_rank", "set_multiprocess", "has_nccl", "TRAIN", "TEST",
           "Classifier", "Detector", "io"]
