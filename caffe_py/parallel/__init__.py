"""Data parallelism in one process: a replica (Solver + thread) per device, synchronised
through the solver's callbacks by a reduction tree (Caffe rc3's P2PSync) or an NCCL ring.

``train_replicated(param, devices, options)`` is the entry point ``cpy train --gpus`` uses for
more than one device; ``parse_devices`` (from caffe_py.devices) reads a ``--gpus`` value
('0,1', 'all', 'cpu:N').
"""
from ..devices import parse_devices
from .replicated import ReplicatedRun, check_devices, train_replicated
from .topology import Tree, build_tree

__all__ = ["ReplicatedRun", "Tree", "build_tree", "check_devices", "parse_devices",
           "train_replicated"]
