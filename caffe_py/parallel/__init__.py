"""Data parallelism: a replica (Solver + thread) per device of a process, synchronised through
the solver's callbacks by a reduction tree (Caffe rc3's P2PSync) or an NCCL ring, and the hosts'
roots joined through torch.distributed.

:class:`~.replicated.ReplicatedRun` (one process, several devices) and
:func:`~.multihost.run_host` (several hosts) are what the Replicated and MultiHost strategies
(caffe_py/strategies.py) run.
"""
from .replicated import HostSlice, ReplicatedRun, Tuning
from .topology import Tree, build_tree

__all__ = ["HostSlice", "ReplicatedRun", "Tree", "Tuning", "build_tree"]
