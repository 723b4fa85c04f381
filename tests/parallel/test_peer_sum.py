"""Which gradient buckets the peer sum takes (the rest go to NCCL), on the CPU with the
extension and NCCL stood in for; the kernel itself is held to the host's sum on GPUs
(test_peer_sum_gpu.py)."""
from __future__ import annotations

import torch

from caffe_py.parallel.peer_sum import PEER_SUM_BYTES, PeerCollectives, replica_sum


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
    assert PeerCollectives.on([torch.device("cuda", 0)] * 2, _Nccl()) is None
    assert PeerCollectives.on([torch.device("cuda"), torch.device("cuda", 1)], _Nccl()) is None


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
    two = PeerCollectives(devices[:2], nccl, _Ext(), max_bytes=4096)
    assert two.max_numel == 1024 and two.limit_text() == "4 KiB"
    assert peers.limit_text() == "2 MiB" and PeerCollectives(
        devices + devices[:1], nccl, _Ext()).limit_text() == "1.33 MiB"


def test_the_reference_adds_in_replica_order_in_float32():
    parts = [torch.tensor([1e8, 1.0]), torch.tensor([1.0, 1e8]), torch.tensor([-1e8, -1e8])]
    # 1e8 + 1 rounds to 1e8 in float32: the first 1 is lost where it comes second
    assert torch.equal(replica_sum(parts), torch.tensor([0.0, 0.0]))
    assert torch.equal(replica_sum(parts[::-1]), torch.tensor([0.0, 1.0]))
    assert parts[0].tolist() == [1e8, 1.0]   # the inputs untouched


def _group(sizes):
    """Two CPU replicas' AllReduceGroup over parameters of ``sizes`` elements, bucketed."""
    from caffe_py.parallel.captured import AllReduceGroup

    devices = [torch.device("cpu")] * 2
    group = AllReduceGroup(devices)
    for i in range(2):
        group.setup(i, [torch.zeros(n, requires_grad=True) for n in sizes])
    return group, devices


def test_the_banner_names_the_buckets_the_peer_sum_takes():
    group, devices = _group([64, 16, 3920, 16, 4000, 16])
    spans = [end - start for start, end in group._spans()]
    assert spans == [4016, 3936, 80]   # in reverse order, each padded to 64 bytes
    assert group.describe().startswith("gradients summed by a host sum inside them in 3 buckets")
    group.collectives = PeerCollectives(devices, _Nccl(), _Ext(), max_bytes=4 * 80)
    assert group.describe() == (
        "gradients summed by reads of the peers' memory (1 bucket up to 320 bytes) and "
        "NCCL's all-reduce inside them in 3 buckets, each started as soon as backward has "
        "finished it")
    group.collectives = PeerCollectives(devices, _Nccl(), _Ext(), max_bytes=4 * 3936)
    assert group.describe() == (
        "gradients summed by reads of the peers' memory (2 buckets up to 15.4 KiB) and "
        "NCCL's all-reduce inside them in 3 buckets, each started as soon as backward has "
        "finished it")
    group.collectives = PeerCollectives(devices, _Nccl(), _Ext(), max_bytes=4 * 2**20)
    assert group.describe() == (
        "gradients summed by reads of the peers' memory (buckets up to 4 MiB) inside them "
        "in 3 buckets, each started as soon as backward has finished it")
