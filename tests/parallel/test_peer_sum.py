"""Which gradient buckets the peer sum takes (the rest go to NCCL), on the CPU with the
extension and NCCL stood in for; the kernel itself is held to the host's sum on GPUs
(test_peer_sum_gpu.py)."""
from __future__ import annotations

import torch

from caffe_py.parallel.peer_sum import PEER_SUM_BYTES, PeerCollectives, peer_sum_reference


class _Ext:
    def peer_sum_flag_count(self):
        return 1024

    def peer_sum_counter_count(self):
        return 64


class _Nccl:
    def __init__(self):
        self.calls = []

    def all_reduce(self, parts, streams=None):
        self.calls.append(([p.numel() for p in parts], streams))


def test_nothing_but_two_to_eight_gpus_gets_peer_sums():
    cpu = torch.device("cpu")
    assert PeerCollectives.on([cpu, cpu], _Nccl()) is None
    assert PeerCollectives.on([torch.device("cuda", 0)], _Nccl()) is None
    assert PeerCollectives.on([torch.device("cuda", i) for i in range(9)], _Nccl()) is None


def test_buckets_up_to_the_bytes_over_n_minus_1_are_taken_and_the_rest_go_to_nccl():
    nccl = _Nccl()
    devices = [torch.device("cpu")] * 3
    peers = PeerCollectives(devices, nccl, _Ext())
    assert peers.max_numel == PEER_SUM_BYTES // (4 * 2)
    assert [f.shape for f in peers.flags] == [(1024,)] * 3
    assert [c.shape for c in peers.counters] == [(64,)] * 3
    assert [s.shape for s in peers.scratch] == [(peers.max_numel,)] * 3
    small = torch.zeros(peers.max_numel)
    assert peers.takes(small)
    assert not peers.takes(torch.zeros(peers.max_numel + 1))
    assert not peers.takes(small.double())
    assert not peers.takes(torch.zeros(2, peers.max_numel // 2).t())
    assert not peers.takes(torch.zeros(0))
    long = [torch.zeros(peers.max_numel + 1) for _ in devices]
    peers.all_reduce(long, streams=None)
    assert nccl.calls == [([peers.max_numel + 1] * 3, None)]
    assert PeerCollectives(devices[:2], nccl, _Ext(), max_bytes=4096).max_numel == 1024


def test_the_reference_adds_in_replica_order_in_float32():
    parts = [torch.tensor([1e8, 1.0]), torch.tensor([1.0, 1e8]), torch.tensor([-1e8, -1e8])]
    # 1e8 + 1 rounds to 1e8 in float32: the first 1 is lost where it comes second
    assert torch.equal(peer_sum_reference(parts), torch.tensor([0.0, 0.0]))
    assert torch.equal(peer_sum_reference(parts[::-1]), torch.tensor([0.0, 1.0]))
    assert parts[0].tolist() == [1e8, 1.0]   # the inputs untouched
