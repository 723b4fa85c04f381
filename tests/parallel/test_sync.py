"""The tree and its threads over plain nn.Modules on CPU replicas (no Solver needed).

A tiny loop plays the Solver: clear grads, on_start, forward/backward (mean loss over the
replica's batch), on_gradient_ready, and on the root an SGD+momentum step.
"""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from caffe_py.errors import SolverError
from caffe_py.parallel.sync import TreeSync, run_replicas
from caffe_py.parallel.topology import build_tree

B, STEPS, LR, MOMENTUM = 4, 5, 0.1, 0.9


def _model(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def _data(total):
    g = torch.Generator().manual_seed(123)
    return torch.randn(STEPS, total, 6, generator=g), torch.randint(0, 3, (STEPS, total),
                                                                    generator=g)


def _loop(model, cb, xs, ys, applies, fail_at=None):
    history = [torch.zeros_like(p) for p in model.parameters()]
    for t in range(STEPS):
        for p in model.parameters():
            p.grad.zero_()
        cb.on_start()
        if fail_at == t:
            raise ValueError("injected failure")
        F.cross_entropy(model(xs[t]), ys[t]).backward()
        cb.on_gradient_ready()
        if applies:
            with torch.no_grad():
                for p, h in zip(model.parameters(), history, strict=True):
                    h.mul_(MOMENTUM).add_(p.grad, alpha=LR)
                    p.sub_(h)


def _train(n, *, fail=None, tree=None, bucket_bytes=64, overlap=True):
    xs, ys = _data(n * B)
    sync = TreeSync([torch.device("cpu")] * n, tree=tree, bucket_bytes=bucket_bytes, timeout=20,
                    overlap=overlap)
    models = [_model(seed=i) for i in range(n)]   # different inits: on_start must fix them
    for i, m in enumerate(models):
        sync.setup(i, list(m.parameters()))
    # replica i gets records i, i+n, i+2n, ... (the round-robin reader)
    targets = [lambda i=i: _loop(models[i], sync.callback(i), xs[:, i::n], ys[:, i::n], i == 0,
                                 fail_at=fail[1] if fail and fail[0] == i else None)
               for i in range(n)]
    run_replicas(sync, targets, join_timeout=10)
    return models, sync


class _Nothing:
    def on_start(self):
        pass

    def on_gradient_ready(self):
        pass


def _zero_grads(model):
    for p in model.parameters():
        p.grad = torch.zeros_like(p)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_n_replicas_equal_one_replica_with_n_times_the_batch(n):
    xs, ys = _data(n * B)
    ref = _model(seed=0)
    _zero_grads(ref)
    # the reference sees the records in round-robin order too (a permutation of the batch)
    order = torch.cat([torch.arange(i, n * B, n) for i in range(n)])
    _loop(ref, _Nothing(), xs[:, order], ys[:, order], True)
    models, _ = _train(n)
    for p, q in zip(models[0].parameters(), ref.parameters(), strict=True):
        rel = ((p - q).norm() / q.norm()).item()
        assert rel < 1e-5, rel


def test_two_runs_are_bit_identical():
    a, _ = _train(5)
    b, _ = _train(5)
    for p, q in zip(a[0].parameters(), b[0].parameters(), strict=True):
        assert torch.equal(p, q)


def test_on_start_brings_every_replica_level_with_the_root():
    models, sync = _train(5)
    # the root updated after the last iteration; the others still hold the weights they used
    assert not torch.equal(sync.replica(3).flat.data, sync.replica(0).flat.data)
    # the root's thread ending ends a run, so every thread waits for the others here
    sync.finished.clear()
    done = threading.Barrier(5, timeout=10)
    run_replicas(sync, [lambda i=i: (sync.callback(i).on_start(), done.wait()) for i in range(5)])
    for i in range(1, 5):
        assert torch.equal(sync.replica(i).flat.data, sync.replica(0).flat.data)
        for p, q in zip(models[i].parameters(), models[0].parameters(), strict=True):
            assert torch.equal(p, q)


def test_an_exception_in_one_worker_stops_all_threads():
    before = {t.name for t in threading.enumerate()}
    with pytest.raises(SolverError,
                       match=r"^replica 2 \(cpu\) failed: ValueError: injected failure$"):
        _train(4, fail=(2, 3))
    assert {t.name for t in threading.enumerate()} - before == set()


def test_a_failing_root_stops_the_workers():
    with pytest.raises(SolverError, match=r"^replica 0 \(cpu\) failed: ValueError: injected"):
        _train(3, fail=(0, 0))
    assert not [t for t in threading.enumerate() if t.name.startswith("cpy-replica")]


def test_a_stuck_replica_times_out_with_a_message():
    sync = TreeSync([torch.device("cpu")] * 2, timeout=0.3)
    models = [_model(0), _model(1)]
    for i, m in enumerate(models):
        sync.setup(i, list(m.parameters()))
    cbs = [sync.callback(0), sync.callback(1)]

    def root():
        cbs[0].on_start()
        cbs[0].on_gradient_ready()   # replica 1 never sends

    with pytest.raises(SolverError, match=r"^replica 0 \(cpu\) waited 0.3 s for gradient "
                                          r"bucket 0 from replica 1 \(cpu\) at iteration 0; "):
        run_replicas(sync, [root, lambda: None], join_timeout=5)


def test_custom_tree_and_bucket_sizes_give_the_same_weights():
    a, _ = _train(4, bucket_bytes=64)
    b, _ = _train(4, bucket_bytes=1 << 20)
    chain = build_tree(4, [[True, True, False, False], [True, True, False, False],
                           [False, False, True, True], [False, False, True, True]])
    c, _ = _train(4, tree=chain)
    for p, q, r in zip(a[0].parameters(), b[0].parameters(), c[0].parameters(), strict=True):
        assert torch.equal(p, q)
        assert ((p - r).norm() / p.norm()).item() < 1e-6


def test_reducing_during_backward_changes_no_bit():
    a, sync = _train(4)
    b, plain = _train(4, overlap=False)
    for p, q in zip(a[0].parameters(), b[0].parameters(), strict=True):
        assert torch.equal(p, q)
    # 64-byte buckets: 4 of them; leaves (1, 3) have no children to wait for, so every bucket
    # left during backward; nothing did without hooks
    assert len(sync.replica(1).flat.buckets) == 4
    assert [sync.replica(i).early for i in (1, 3)] == [4 * STEPS] * 2
    assert [plain.replica(i).early for i in range(4)] == [0] * 4
