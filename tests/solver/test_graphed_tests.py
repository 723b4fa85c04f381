"""Test passes as CUDA graph replays (solver/graphed_tests.py): on the CPU the forward says
why it stays eager and gives the eager numbers; on a GPU the replayed pass prints the eager
pass's numbers, and a blob that moves is captured again (skipped without CUDA)."""
from __future__ import annotations

import logging

import pytest
import torch

from caffe_py.solver.evaluate import run_batches
from caffe_py.solver.graphed_tests import GraphedForward, GraphedTests
from caffe_py.solver.solver import Solver, own_test_batches

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _pass(solver: Solver, tests) -> dict[str, torch.Tensor]:
    solver.start()   # the readers
    means = tests(0, solver.test_nets[0], solver.param.test_iter[0],
                  autocast=solver.autocast, between=lambda: False)
    assert means is not None
    return means


def test_on_the_cpu_a_test_forward_says_why_it_stays_eager(ws, caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")
    ws.net(ws.LMDB_NET)
    # 13 records, 3 a batch: passes of 13 batches start at the same record every time
    with Solver(ws.load(test_iter=13, test_interval=100)) as solver:
        solver.start()
        net = solver.test_nets[0]
        forward = GraphedForward(net, "test net #0")
        graphed = run_batches(net, 13, forward=forward)
        eager = run_batches(net, 13)
    assert forward.graph is None and forward.fallback == "it runs on the CPU"
    assert [m for m in caplog.messages if m.startswith("CUDA graphs")] == [
        "CUDA graphs off for test net #0 (cpu): it runs on the CPU; testing eagerly"]
    assert set(graphed) == {"acc", "loss", "__loss__"}
    assert all(graphed[k].equal(eager[k]) for k in graphed)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", ["FLOAT32", "BF16"])
def test_a_replayed_test_pass_prints_the_eager_numbers(ws, precision, caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")
    ws.net(ws.LMDB_NET)
    passes = {}
    for name, tests in (("graphed", GraphedTests()), ("eager", own_test_batches)):
        # 13 records, 3 a batch: passes of 13 batches start at the same record every time
        with Solver(ws.load(test_iter=13, test_interval=100, precision=precision),
                    device="cuda:0") as solver:
            passes[name] = [_pass(solver, tests) for _ in range(3)]
            if name == "graphed":
                forward = tests.forwards[0]
                assert forward.fallback is None and forward.graph is not None
    assert not [m for m in caplog.messages if m.startswith("CUDA graphs off")]
    for graphed, eager in zip(passes["graphed"], passes["eager"], strict=True):
        assert set(graphed) == set(eager) == {"acc", "loss", "__loss__"}
        for key in graphed:
            torch.testing.assert_close(graphed[key], eager[key], rtol=1e-6, atol=1e-7)
    # every pass reads the same 39 records: the replays read the real batches
    assert all(p[k].equal(passes["graphed"][0][k]) for p in passes["graphed"] for k in p)


@pytest.mark.gpu
@needs_cuda
def test_a_weight_that_moves_is_captured_again(ws):
    ws.net(ws.LMDB_NET)
    passes = {}
    for name, tests in (("graphed", GraphedTests()), ("eager", own_test_batches)):
        with Solver(ws.load(test_iter=13, test_interval=100), device="cuda:0") as solver:
            before = _pass(solver, tests)
            first = tests.forwards[0].graph if name == "graphed" else None
            weight = solver.net.learnable_params()[0].param
            # new storage (a graph would read the old one); a scale changes the softmax
            weight.data = weight.data * 3
            passes[name] = before, _pass(solver, tests)
            if name == "graphed":
                assert tests.forwards[0].graph is not None
                assert tests.forwards[0].graph is not first
    (before, moved), (eager_before, eager_moved) = passes["graphed"], passes["eager"]
    assert abs(moved["loss"].item() - before["loss"].item()) > 1e-3, (before, moved)
    for graphed, eager in ((before, eager_before), (moved, eager_moved)):
        for key in graphed:
            torch.testing.assert_close(graphed[key], eager[key], rtol=1e-6, atol=1e-7)
