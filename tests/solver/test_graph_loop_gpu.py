"""The whole-iteration CUDA-graph loop on a GPU: the captured iterations train as the eager
loop does, DummyData's device generator is replayed, two runs are bit-identical, a bad label
is caught on the device (skipped without a GPU)."""
from __future__ import annotations

import logging

import pytest
import torch

from caffe_py.errors import DataError
from caffe_py.solver.graph_loop import GraphedLoop
from caffe_py.solver.solver import Solver

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def run(param, loop=None):
    with Solver(param, device="cuda:0") as solver:
        solver.runner = loop
        solver.solve()
        return solver, [lp.param.detach().cpu() for lp in solver.net.learnable_params()]


@pytest.mark.parametrize("rule", [{"type": "SGD", "lr_policy": "inv", "gamma": 0.1,
                                   "power": 0.75, "weight_decay": 0.01},
                                  {"type": "Adam", "base_lr": 0.01, "iter_size": 2}])
def test_captured_chunks_train_as_the_eager_loop(ws, rule, caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")
    ws.net(ws.LMDB_NET, batch=2)
    common = {"max_iter": 24, "display": 4, "test_iter": 2, "test_interval": 8, **rule}
    _, eager = run(ws.load(**common))
    loop = GraphedLoop(chunk=4)
    solver, graphed = run(ws.load(**common, snapshot_prefix="g/t"), loop)
    assert loop.fallback is None and sorted(loop.graphs) == [1, 4]
    assert not [m for m in caplog.messages if m.startswith("CUDA graphs off")]
    for a, b in zip(graphed, eager, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_dummy_data_refills_inside_the_graph_and_two_runs_are_identical(ws):
    torch.backends.cudnn.deterministic = True
    try:
        param = ws.load(max_iter=40, display=0, average_loss=1)
        first, w1 = run(param, GraphedLoop(chunk=8))
        second, w2 = run(param, GraphedLoop(chunk=8))
    finally:
        torch.backends.cudnn.deterministic = False
    assert all(torch.equal(a, b) for a, b in zip(w1, w2, strict=True))
    ring = first.monitor.losses[:40].cpu()
    assert len(set(ring.tolist())) > 30   # every replay drew new gaussian data and dropout


def test_a_bad_label_is_caught_on_the_device_within_a_few_iterations(ws):
    text = (ws.root / "net.yaml").read_text().replace("max: 2.99", "max: 3.5")
    ws.net(text)
    with Solver(ws.load(max_iter=500, display=0), device="cuda:0") as solver:
        solver.runner = GraphedLoop(chunk=4)
        with pytest.raises(DataError, match=r"label 3 is outside \[0, 3\) \(3 classes\)"):
            solver.solve()
        assert solver.iter <= 2 * 16 + 8


def test_deterministic_runs_of_the_default_path_are_bit_identical(ws):
    from caffe_py.options import TrainOptions
    from caffe_py.train import train

    ws.net(ws.LMDB_NET, batch=2)
    runs = []
    try:
        for _ in range(2):
            root = train(ws.load(max_iter=40, display=0), ["cuda:0"],
                         TrainOptions(deterministic=True, overwrite=True))
            runs.append([lp.param.detach().cpu() for lp in root.net.learnable_params()])
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_the_chunk_is_sized_by_the_devices_time_not_the_hosts_work_before_the_launch(
        ws, monkeypatch):
    """The timed replays measure from the graph's launch to its end: 30 ms of host work
    before each launch (here in the rates' copy) leaves the tiny net's chunk at the most
    its display interval allows, as a chunk does that work once, not once an iteration."""
    import time

    from caffe_py.solver import graph_loop

    put = graph_loop._Scales.put

    def slow_put(self, rows):
        time.sleep(0.03)
        put(self, rows)

    monkeypatch.setattr(graph_loop._Scales, "put", slow_put)
    ws.net(ws.LMDB_NET, batch=2)
    loop = GraphedLoop()
    run(ws.load(max_iter=40, display=10, lr_policy="fixed"), loop)
    assert len(loop._replay_ms) == graph_loop.TIMED_REPLAYS
    assert max(loop._replay_ms) < 4.0
    assert loop.chunk == 10 and sorted(loop.graphs) == [1, 10]
