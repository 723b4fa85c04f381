"""Data parallelism: a replica (Solver + thread) per device of a process, synchronised through
the solver's callbacks by a reduction tree (Caffe rc3's P2PSync) or an NCCL ring, and the hosts'
roots joined through torch.distributed.

The strategies :class:`~.replicated.Replicated` (one process, several devices) and
:class:`~.multihost.MultiHost` (several hosts) are what caffe_py.train picks for ``cpy train``.
"""
from .replicated import HostSlice, Replicated, ReplicatedRun, Tuning
from .topology import Tree, build_tree

__all__ = ["HostSlice", "Replicated", "ReplicatedRun", "Tree", "Tuning", "build_tree"]
