"""NcclSync's barriers and bookkeeping on CPU replicas, with CPU stand-ins for the collectives
(the real torch.cuda.nccl path runs in test_gpu.py)."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from caffe_py.errors import SolverError
from caffe_py.parallel.nccl import NcclSync
from caffe_py.parallel.sync import TreeSync, run_replicas

B, STEPS = 4, 4


class CpuCollectives:
    """all_reduce (sum into every tensor) and broadcast, as torch.cuda.nccl does them."""

    calls: list[str]

    def __init__(self):
        self.calls = []

    def all_reduce(self, tensors, streams=None):
        self.calls.append("all_reduce")
        total = torch.stack(tensors).sum(0)
        for t in tensors:
            t.copy_(total)

    def broadcast(self, tensors, root=0, streams=None):
        self.calls.append("broadcast")
        for t in tensors:
            t.copy_(tensors[root])


def _run(sync, n, fail_at=None):
    g = torch.Generator().manual_seed(5)
    xs, ys = torch.randn(STEPS, n * B, 5, generator=g), torch.randint(0, 3, (STEPS, n * B),
                                                                      generator=g)
    models = []
    for i in range(n):
        torch.manual_seed(i)
        models.append(nn.Linear(5, 3))
        sync.setup(i, list(models[i].parameters()))

    def loop(i):
        cb, model = sync.callback(i), models[i]
        for t in range(STEPS):
            for p in model.parameters():
                p.grad.zero_()
            cb.on_start()
            if fail_at == (i, t):
                raise ValueError("injected")
            F.cross_entropy(model(xs[t, i::n]), ys[t, i::n]).backward()
            cb.on_gradient_ready()
            if i == 0:
                with torch.no_grad():
                    for p in model.parameters():
                        p.sub_(0.5 * p.grad)

    run_replicas(sync, [lambda i=i: loop(i) for i in range(n)], join_timeout=10)
    return models


def test_ring_and_tree_give_the_same_weights():
    fake = CpuCollectives()
    ring = _run(NcclSync([torch.device("cpu")] * 3, collectives=fake, timeout=20), 3)
    tree = _run(TreeSync([torch.device("cpu")] * 3, timeout=20), 3)
    for p, q in zip(ring[0].parameters(), tree[0].parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7)
    assert fake.calls == ["broadcast", "all_reduce"] * STEPS


def test_a_failure_breaks_the_barriers_and_names_the_replica():
    sync = NcclSync([torch.device("cpu")] * 3, collectives=CpuCollectives(), timeout=20)
    with pytest.raises(SolverError, match=r"^replica 1 \(cpu\) failed: ValueError: injected$"):
        _run(sync, 3, fail_at=(1, 2))
    assert not [t for t in threading.enumerate() if t.name.startswith("cpy-replica")]


def test_needs_cuda_devices():
    with pytest.raises(SolverError) as err:
        NcclSync([torch.device("cpu")] * 2)
    assert str(err.value) == ("reduction 'nccl' needs CUDA devices, got cpu, cpu; use reduction "
                              "'tree' (the default) on CPU")
