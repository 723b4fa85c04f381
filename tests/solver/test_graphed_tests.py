"""Test passes as CUDA graph replays (solver/graphed_tests.py): on the CPU the forward says
why it stays eager and gives the eager numbers, and the chunks run unrecorded (``emulate``)
give the eager pass's numbers bit for bit and read its records; on a GPU the replayed pass
prints the eager pass's numbers, and a blob that moves is captured again (skipped without
CUDA)."""
from __future__ import annotations

import contextlib
import logging
import math

import numpy as np
import pytest
import torch

from caffe_py.net import NetOutput
from caffe_py.solver import graphed_tests
from caffe_py.solver.evaluate import run_batches
from caffe_py.solver.graphed_tests import (
    CHUNK_SLOT_BYTES,
    GraphedForward,
    GraphedTests,
    RowLayout,
    batch_row,
    chunk_lengths,
    chunk_slots,
    graphed_pass,
)
from caffe_py.solver.solver import Solver, own_test_batches

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
NO_AUTOCAST = contextlib.nullcontext


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
        graphed = graphed_pass(forward, 13, autocast=NO_AUTOCAST, between=lambda: False)
        eager = run_batches(net, 13)
    assert not forward.graphs and forward.fallback == "it runs on the CPU"
    assert [m for m in caplog.messages if m.startswith("CUDA graphs")] == [
        "CUDA graphs off for test net #0 (cpu): it runs on the CPU; testing eagerly"]
    assert graphed is not None and set(graphed) == {"acc", "loss", "__loss__"}
    assert all(graphed[k].equal(eager[k]) for k in graphed)


def test_a_pass_runs_in_chunks_of_the_slots_that_fit():
    assert chunk_lengths(13, 4) == [4, 4, 4, 1]
    assert chunk_lengths(8, 4) == [4, 4]
    assert chunk_lengths(3, 32) == [3]

    class Layer:   # a Data layer's tops: data (B, C, H, W), label (B,)
        def __init__(self, *shapes):
            self.top_shapes = list(shapes)

    class Net:
        def __init__(self, *layers):
            self.layers = layers

        def data_layers(self):
            return self.layers

    lenet = 100 * (4 * 28 * 28 + 8)   # LeNet's TEST batch of 100: 314,400 bytes
    assert chunk_slots(Net(Layer((100, 1, 28, 28), (100,)))) == 32
    assert chunk_slots(Net(*[Layer((100, 1, 28, 28), (100,))] * 7)) == \
        CHUNK_SLOT_BYTES // (7 * lenet) == 30
    imagenet = Layer((50, 3, 224, 224), (50,))   # 30 MB a batch: two a replay
    assert chunk_slots(Net(imagenet)) == 2
    assert chunk_slots(Net(Layer((256, 3, 224, 224), (256,)))) == 1
    assert chunk_slots(Net(Layer((4, 3), ))) == 32   # no label top: the batch's (B,) counted


def test_rows_summed_from_minus_zero_give_the_eager_sums_bit_for_bit():
    """The eager pass adds the loss to +0.0 and copies the first batch's outputs; the total
    starts at +0.0 for the loss and -0.0 for the outputs, so every sign of zero comes out as
    the eager pass's (a start of +0.0 would turn an output of -0.0 into +0.0)."""
    outs = [NetOutput(torch.tensor(v[0]), {"a": torch.tensor(v[1]), "b": torch.tensor(v[2])})
            for v in ([-0.0, [-0.0, 1.5], [-0.0]], [-0.0, [-0.0, -2.0], [0.0]],
                      [0.25, [-0.0, 0.5], [-0.0]])]
    layout = RowLayout.of(outs[0])
    assert layout == RowLayout(("a", "b"), (slice(1, 3), slice(3, 4)), 4)
    total = layout.start(torch.device("cpu"))
    loss_sum, sums = torch.zeros(()), {}
    for i, out in enumerate(outs):
        total += batch_row(out)
        loss_sum += out.loss.float()
        for name, value in out.outputs.items():
            sums[name] = sums[name] + value.reshape(-1) if name in sums else value.reshape(-1)
        if i < 2:   # each zero's sign after one batch and after two (b: -0.0 + 0.0 = +0.0)
            eager = torch.cat([loss_sum.reshape(1), sums["a"], sums["b"]])
            assert total.tolist() == eager.tolist()
            assert [math.copysign(1, v) for v in total.tolist()] == \
                [math.copysign(1, v) for v in eager.tolist()]
    means = layout.means(total, 3)
    assert set(means) == {"a", "b", "__loss__"}
    assert means["a"].tolist() == [-0.0, 0.0] and math.copysign(1, means["a"][0]) == -1
    assert means["b"].tolist() == [0.0] and math.copysign(1, means["b"][0]) == 1
    assert means["__loss__"].tolist() == (torch.tensor([0.25]) / 3).tolist()


@pytest.mark.parametrize("chunk_max, lengths", [(4, [4, 4, 3]), (32, [11])])
def test_an_emulated_chunked_pass_gives_the_eager_numbers_and_reads_its_records(
        ws, monkeypatch, chunk_max, lengths):
    """Without a graph the chunks run the same forwards on the slots they fill: three passes
    print the eager passes' numbers bit for bit, and the readers stand where the eager
    passes left them."""
    monkeypatch.setattr(graphed_tests, "CHUNK_MAX", chunk_max)
    replays = []
    replay = GraphedForward.replay

    def counted(self, length, mode, autocast):
        replays.append((length, mode))
        replay(self, length, mode, autocast)

    monkeypatch.setattr(GraphedForward, "replay", counted)
    ws.net(ws.LMDB_NET)
    passes, positions = {}, {}
    for name, tests in (("chunked", GraphedTests(emulate=True)), ("eager", own_test_batches)):
        # 13 records, 3 a batch: 11 batches a pass, so each pass starts somewhere else
        with Solver(ws.load(test_iter=11, test_interval=100)) as solver:
            passes[name] = [_pass(solver, tests) for _ in range(3)]
            positions[name] = solver.test_pool.state_dict()
    assert replays == [(length, "sum") for length in lengths] * 3
    for chunked, eager in zip(passes["chunked"], passes["eager"], strict=True):
        assert set(chunked) == set(eager) == {"acc", "loss", "__loss__"}
        assert all(chunked[k].equal(eager[k]) for k in chunked)
    assert len({p["loss"].item() for p in passes["eager"]}) == 3   # other records each pass
    assert positions["chunked"] == positions["eager"]


def test_a_stop_between_chunks_ends_the_pass(ws, monkeypatch):
    """``between`` runs before each chunk: True ends the pass (None) with the batches of the
    chunks before it read."""
    monkeypatch.setattr(graphed_tests, "CHUNK_MAX", 4)
    ws.net(ws.LMDB_NET)
    with Solver(ws.load(test_iter=11, test_interval=100)) as solver:
        solver.start()
        net = solver.test_nets[0]
        forward = GraphedForward(net, "test net #0", emulate=True)
        asked = []

        def between():
            asked.append(len(asked))
            return len(asked) == 3

        assert graphed_pass(forward, 11, autocast=NO_AUTOCAST, between=between) is None
        assert asked == [0, 1, 2]
        taken = [feed.real for feed in forward.feeds][0].delivered
    assert taken == 8   # two chunks of 4


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
                assert forward.fallback is None and list(forward.graphs) == [(13, "sum")]
                # the database is kept decoded after pass 1 and on the device from pass 2's
                # first batch on: pass 3 gathers its batches inside the graph
                assert [type(feed).__name__ for feed in forward.feeds] == ["GatherFeed"]
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
            first = tests.forwards[0].graphs[13, "sum"] if name == "graphed" else None
            weight = solver.net.learnable_params()[0].param
            # new storage (a graph would read the old one); a scale changes the softmax
            weight.data = weight.data * 3
            passes[name] = before, _pass(solver, tests)
            if name == "graphed":
                assert tests.forwards[0].graphs[13, "sum"] is not first
    (before, moved), (eager_before, eager_moved) = passes["graphed"], passes["eager"]
    assert abs(moved["loss"].item() - before["loss"].item()) > 1e-3, (before, moved)
    for graphed, eager in ((before, eager_before), (moved, eager_moved)):
        for key in graphed:
            torch.testing.assert_close(graphed[key], eager[key], rtol=1e-6, atol=1e-7)


class _Records:
    """A feed's record queue as the gathers read it: what it consumed."""

    def __init__(self):
        self.consumed = 0

    def mark_consumed(self, n):
        self.consumed += n


class _Feed:
    """A feed gathering in the loop: the in-loop gather, its queue, its count."""

    def __init__(self, gatherer):
        self.gatherer, self.records, self.delivered = gatherer, _Records(), 0

    def next(self):
        data, label = self.gatherer.next(self.records.consumed)
        self.records.mark_consumed(self.gatherer.batch_size)
        self.delivered += 1
        return data, label


class _Turns:
    """The root's turns over two replicas' feeds of one stream: batch g is replica g mod 2's."""

    def __init__(self, feeds):
        self.feeds = feeds

    def turn(self):
        return 0 if self.feeds[0].delivered <= self.feeds[1].delivered else 1

    def next(self):
        return self.feeds[self.turn()].next()


def _device_gather(pixels, labels, start=0, step=1, unit=1, mean_value=(10.0, 20.0, 30.0)):
    from caffe_py.io.feed.gather import DeviceGather
    from caffe_py.io.feed.transformer import Transformer
    from caffe_py.io.reader.records import DecodedView
    from caffe_py.spec.layer_params.data import TransformationParameter

    tp = TransformationParameter(crop_size=2, scale=0.5, mean_value=list(mean_value))
    transformer = Transformer(tp, "TEST", pixels.shape[1:])
    view = DecodedView(pixels, labels, origin=3, start=start, step=step, unit=unit)
    return DeviceGather(view, 4, transformer, torch.device("cpu"),
                        transformer.device_mean(torch.device("cpu")))


def _database(n=7):
    rng = np.random.default_rng(5)
    return (rng.integers(0, 256, (n, 3, 4, 4), dtype=np.uint8),
            np.arange(100, 100 + n, dtype=np.int64))


def test_a_gathered_slot_is_the_feeds_batch_bit_for_bit():
    """Inside the graph the batch is gathered from the device's copy of the database by the
    indices the host wrote: the values, labels and record counts of the feed's own next(),
    across the end of the database (7 records, 4 a batch, from position 3)."""
    from caffe_py.solver.graphed_tests import GatherFeed, device_gather

    pixels, labels = _database()
    eager, graphed = _Feed(_device_gather(pixels, labels)), _Feed(_device_gather(pixels, labels))
    gather = device_gather(graphed, torch.device("cpu"))
    assert gather is graphed.gatherer
    feed = GatherFeed(graphed, gather, slots=3)
    for _ in range(3):   # three chunks of 3 batches: 36 records, five passes over the 7
        for k in range(3):
            feed.fill_slot(k)
        feed.flush(3)
        feed.cursor = 0
        for _ in range(3):
            data, label = feed.next()
            want_data, want_label = eager.next()
            assert data.shape == (4, 3, 2, 2) and data.dtype == torch.float32
            assert torch.equal(data, want_data) and torch.equal(label, want_label)
    assert graphed.records.consumed == eager.records.consumed == 36
    assert graphed.delivered == eager.delivered == 9


def test_the_roots_turns_are_gathered_from_its_own_copy():
    """The root's turns over two replicas' feeds (whole batches in turn): each slot holds the
    batch of the feed whose turn it is, gathered from the root's copy of the database; a feed
    over another database, or one copying batches into slots, keeps the turns copied in."""
    from caffe_py.solver.graphed_tests import GatherFeed, device_gather

    pixels, labels = _database()

    def turns():   # replica r reads batches r, r + 2, ...: its turns of 4 records from 4 r
        return _Turns([_Feed(_device_gather(pixels, labels, start=4 * r, unit=4))
                       for r in range(2)])

    eager, graphed = turns(), turns()
    gather = device_gather(graphed, torch.device("cpu"))
    assert gather is graphed.feeds[0].gatherer
    feed = GatherFeed(graphed, gather, slots=5)
    for k in range(5):
        feed.fill_slot(k)
    feed.flush(5)
    for _ in range(5):
        data, label = feed.next()
        want_data, want_label = eager.next()
        assert torch.equal(data, want_data) and torch.equal(label, want_label)
    assert [f.delivered for f in graphed.feeds] == [3, 2]
    other = _Turns([graphed.feeds[0], _Feed(_device_gather(pixels.copy(), labels, unit=4))])
    assert device_gather(other, torch.device("cpu")) is None
    staged = _Turns([graphed.feeds[0], _Feed(None)])
    assert device_gather(staged, torch.device("cpu")) is None
