"""Every replica's whole iterations from one thread (parallel/captured.py), on CPU replicas: the
graph loop's host sequence runs unrecorded and the all-reduce is a host sum. Two replicas give
the eager tree's weights bit for bit; every replica holds the root's weights; chunks, lines,
snapshots and resume follow the eager run; a worker's failure names it."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from support import load_script

from caffe_py.errors import SolverError
from caffe_py.io.reader.roundrobin import RoundRobin
from caffe_py.options import TrainOptions
from caffe_py.parallel import ReplicatedRun, Tuning
from caffe_py.parallel.captured import AllReduceGroup, CapturedReplicas
from caffe_py.solver import graphed_tests
from caffe_py.solver.roles import UPDATING_WORKER
from caffe_py.spec.solver_spec import load_solver

B = 4
SOLVER = """
net_param:
  name: tiny
  layer:
    - {{name: data, type: Data, top: [data, label], transform_param: {{scale: 0.00390625}},
       data_param: {{source: {db}, batch_size: {batch}}}}}
    - {{name: conv, type: Convolution, bottom: data, top: conv,
       convolution_param: {{num_output: 2, kernel_size: 3, weight_filler: {{type: xavier}},
                           bias_filler: {{type: constant, value: 0.1}}}}}}
    - {{name: ip, type: InnerProduct, bottom: conv, top: ip,
       inner_product_param: {{num_output: 3, weight_filler: {{type: xavier}}}}}}
    - {{name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}}
type: {type}
base_lr: 0.05
momentum: 0.9
weight_decay: 0.001
lr_policy: step
gamma: 0.5
stepsize: 5
iter_size: {iter_size}
max_iter: {iters}
display: 4
snapshot: {snapshot}
random_seed: 7
solver_mode: CPU
snapshot_after_train: false
snapshot_prefix: {prefix}
"""

pytestmark = pytest.mark.usefixtures("no_stray_threads")


def _param(tmp_path, db, name, *, batch=B, type_="SGD", iter_size=1, iters=12, snapshot=0):
    path = tmp_path / f"{name}.yaml"
    path.write_text(SOLVER.format(db=db, batch=batch, type=type_, iter_size=iter_size,
                                  iters=iters, snapshot=snapshot,
                                  prefix=tmp_path / name / "s"))
    return load_solver(path)


def _weights(solver):
    return [lp.param.detach().clone() for lp in solver.net.learnable_params()]


def _run(param, n, *, captured, chunk=None, snapshot=None, callbacks=None):

    tuning = Tuning(captured=captured, extra_callbacks=callbacks)
    with ReplicatedRun(param, ["cpu"] * n, TrainOptions(snapshot=snapshot),
                       tuning=tuning) as run:
        if captured and chunk is not None:
            run.root.runner.chunk_cap = chunk
        run.run()
        return run, [_weights(s) for s in run.solvers]


@pytest.mark.parametrize("rule", [{}, {"type_": "Adam"}, {"iter_size": 2}])
def test_two_captured_replicas_give_the_eager_trees_weights_bit_for_bit(tmp_path, db, rule):
    eager, (want, _) = _run(_param(tmp_path, db, "tree", **rule), 2, captured=False)
    run, (root, worker) = _run(_param(tmp_path, db, "cap", **rule), 2, captured=True, chunk=4)
    assert isinstance(run.sync, AllReduceGroup) and not eager.captured
    loop = run.root.runner
    assert isinstance(loop, CapturedReplicas) and loop.fallback is None
    assert loop.chunk == 4 and sorted(loop.graphs) == [1, 4]
    assert run.solvers[1].role == UPDATING_WORKER
    assert all(a.equal(b) for a, b in zip(root, want, strict=True))
    assert all(a.equal(b) for a, b in zip(worker, root, strict=True))
    assert run.root.iter == run.solvers[1].iter == 12
    assert run.root.current_step == eager.root.current_step == 2


def test_three_captured_replicas_train_as_one_with_three_times_the_batch(tmp_path, db):
    from caffe_py.solver.solver import Solver

    with Solver(_param(tmp_path, db, "one", batch=3 * B)) as one:
        one.solve()
        want = _weights(one)
    _, (root, *workers) = _run(_param(tmp_path, db, "cap"), 3, captured=True)
    assert max(((a - b).norm() / b.norm()).item() for a, b in zip(root, want, strict=True)) \
        < 1e-5
    assert all(a.equal(b) for w in workers for a, b in zip(w, root, strict=True))


def test_lines_snapshots_and_resume_follow_the_eager_tree(tmp_path, db, caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")

    def lines():
        kept = [m for m in caplog.messages if m.startswith(("Iteration", "Snapshot"))]
        caplog.clear()
        return [m.split(" (")[0] if "iter/s" in m else m for m in kept]

    _run(_param(tmp_path, db, "tree", snapshot=8), 2, captured=False)
    want = [m.replace("/tree/", "/cap/") for m in lines()]
    run, (root, _) = _run(_param(tmp_path, db, "cap", snapshot=8), 2, captured=True, chunk=4)
    assert lines() == want
    assert [m for m in caplog.messages if "captured" in m] == []
    # a resume from iteration 8 gives the straight run's weights, on every replica
    state = tmp_path / "cap" / "s_iter_8.solverstate.pt"
    resumed, (again, worker) = _run(_param(tmp_path, db, "cap", snapshot=8), 2, captured=True,
                                    chunk=4, snapshot=str(state))
    assert resumed.root.iter == 12
    assert all(a.equal(b) for a, b in zip(again, root, strict=True))
    assert all(a.equal(b) for a, b in zip(worker, root, strict=True))


@pytest.mark.parametrize("layer_wise, how", [
    (True, "in 2 buckets"), (False, "after backward")])
def test_the_banner_says_how_the_replicas_reduce(tmp_path, db, caplog, layer_wise, how):
    caplog.set_level(logging.INFO, logger="caffe_py")
    param = dataclasses.replace(_param(tmp_path, db, "cap", iters=1),
                                layer_wise_reduce=layer_wise)
    _run(param, 2, captured=True)
    assert caplog.messages[:2] == [
        "Batch: 4 per replica x 2 replicas x iter_size 1 = 8 per update (effective batch 8; "
        "devices cpu#0, cpu#1; reduction all-reduce, captured; precision FLOAT32)",
        "whole iterations captured on every replica (cpu#0, cpu#1), issued by one thread; "
        f"gradients summed by a host sum inside them {how}; every replica applies the update"]


@pytest.mark.parametrize("n, rule", [(2, {}), (2, {"type_": "Adam"}), (2, {"iter_size": 2}),
                                     (3, {"iter_size": 3})])
def test_bucket_by_bucket_equals_the_whole_gradient_after_backward_bit_for_bit(tmp_path, db,
                                                                             n, rule):
    """The reference: ``layer_wise_reduce: false`` sums the whole buffer after backward."""
    plain = dataclasses.replace(_param(tmp_path, db, "plain", **rule), layer_wise_reduce=False)
    off, want = _run(plain, n, captured=True, chunk=4)
    on, got = _run(_param(tmp_path, db, "cap", **rule), n, captured=True, chunk=4)
    assert not off.sync.overlap and off.sync.plans == [[]] * n and off.sync.in_backward == 0
    assert on.sync.overlap and [len(p) for p in on.sync.plans] == [2] * n
    assert on.sync.in_backward == 2 * n   # every bucket completed by backward's hooks
    assert all(a.equal(b) for w, v in zip(got, want, strict=True)
               for a, b in zip(w, v, strict=True))


def test_a_bucket_is_complete_only_after_the_last_pass_with_its_final_gradient(tmp_path, db,
                                                                             monkeypatch):
    """With iter_size 3 the hooks fire three times per parameter; a bucket counts as ready
    once, in the last pass, when its gradient is what the sum then reads."""
    with ReplicatedRun(_param(tmp_path, db, "cap", iter_size=3, iters=3), ["cpu"] * 2,
                       tuning=Tuning(captured=True)) as run:
        group = run.sync
        assert isinstance(group, AllReduceGroup)
        ready, summed = [], []
        mark, reduce_ = group._mark_ready, group.all_reduce

        def on_ready(i, b):
            bk = group.plans[i][b]
            grad = group.replica(i).flat.grad[bk.start:bk.end].clone()
            ready.append((i, b, group._counts[i].fired[b], grad))
            mark(i, b)

        def on_sum(streams):
            summed.append([group.replica(i).flat.grad.clone() for i in range(2)])
            reduce_(streams)

        monkeypatch.setattr(group, "_mark_ready", on_ready)
        monkeypatch.setattr(group, "all_reduce", on_sum)
        run.run()
    assert len(summed) == 3 and len(ready) == 3 * 2 * 2
    # per iteration: replica 0's buckets in backward order, then replica 1's
    assert [(i, b) for i, b, _, _ in ready] == [(0, 0), (0, 1), (1, 0), (1, 1)] * 3
    assert [fired for _, _, fired, _ in ready] == [6] * 12   # 2 blobs x 3 passes each
    for k, (i, b, _, grad) in enumerate(ready):
        bk = group.plans[i][b]
        assert grad.equal(summed[k // 4][i][bk.start:bk.end])


def test_a_bucket_of_frozen_blobs_waits_for_the_end_of_backward(tmp_path, db):
    """conv's two blobs (lr_mult 0) get no gradient: their bucket is summed after backward."""
    path = tmp_path / "frozen.yaml"
    path.write_text(SOLVER.format(db=db, batch=B, type="SGD", iter_size=1, iters=6, snapshot=0,
                                  prefix=tmp_path / "frozen" / "s").replace(
        "{name: conv, type: Convolution, bottom: data, top: conv,",
        "{name: conv, type: Convolution, bottom: data, top: conv, "
        "param: [{lr_mult: 0}, {lr_mult: 0}],"))
    on, got = _run(load_solver(path), 2, captured=True)
    off, want = _run(dataclasses.replace(load_solver(path), layer_wise_reduce=False), 2,
                     captured=True)
    assert [len(p) for p in on.sync.plans] == [2, 2] and on.sync.in_backward == 2
    assert all(a.equal(b) for w, v in zip(got, want, strict=True)
               for a, b in zip(w, v, strict=True))


def test_callbacks_keep_the_iterations_eager_and_say_why(tmp_path, db, caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")

    class Count:
        calls = 0

        def on_start(self, solver):
            Count.calls += 1

        def on_gradient_ready(self, solver):
            pass

    eager, (want, _) = _run(_param(tmp_path, db, "tree"), 2, captured=False)
    run, (root, worker) = _run(_param(tmp_path, db, "cap"), 2, captured=True,
                               callbacks=lambda i: [Count()])
    assert run.root.runner.fallback == "callbacks run between the forward and the update"
    assert ("CUDA graphs off (cpu, cpu): callbacks run between the forward and the update; "
            "running eagerly") in caplog.messages
    assert Count.calls == 2 * 12
    assert all(a.equal(b) for a, b in zip(root, want, strict=True))
    assert all(a.equal(b) for a, b in zip(worker, root, strict=True))


def test_a_workers_failure_names_it_and_stops_the_run(tmp_path, db, monkeypatch):
    param = _param(tmp_path, db, "cap", iters=20)
    with ReplicatedRun(param, ["cpu"] * 2, tuning=Tuning(captured=True)) as run:
        worker = run.solvers[1]
        real = worker.step_fn

        def bad_labels(solver):
            if solver.iter >= 5:
                raise SolverError("iteration 5: label 7 is outside [0, 3)")
            return real(solver)

        monkeypatch.setattr(worker, "step_fn", bad_labels)
        with pytest.raises(SolverError, match=r"^replica 1 \(cpu\): iteration 5: label 7 is "
                                              r"outside \[0, 3\)$"):
            run.run()
        assert run.root.iter == 5


TESTED = """
net_param:
  name: tested
  layer:
    - {{name: data, type: Data, top: [data, label], include: {{phase: TRAIN}},
       transform_param: {{scale: 0.00390625}}, data_param: {{source: {db}, batch_size: 4}}}}
    - {{name: data, type: Data, top: [data, label], include: {{phase: TEST}},
       transform_param: {{scale: 0.00390625}}, data_param: {{source: {db}, batch_size: 5}}}}
    - {{name: conv, type: Convolution, bottom: data, top: conv,
       convolution_param: {{num_output: 2, kernel_size: 3, weight_filler: {{type: xavier}}}}}}
    - {{name: bn, type: BatchNorm, bottom: conv, top: conv}}
    - {{name: ip, type: InnerProduct, bottom: conv, top: ip,
       inner_product_param: {{num_output: 3, weight_filler: {{type: xavier}}}}}}
    - {{name: acc, type: Accuracy, bottom: [ip, label], top: acc, include: {{phase: TEST}}}}
    - {{name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}}
base_lr: 0.05
momentum: 0.9
max_iter: 8
test_iter: {test_iter}
test_interval: 4
random_seed: 7
solver_mode: CPU
snapshot_after_train: false
snapshot_prefix: {prefix}
"""


@pytest.mark.parametrize("n, test_iter, graphed", [(2, 7, None), (3, 7, None), (3, 2, None),
                                                   (2, 7, True), (3, 7, True)])
def test_a_test_pass_spread_over_the_replicas_prints_one_devices_numbers(
        tmp_path, db, n, test_iter, graphed, caplog, monkeypatch):
    """Each replica reads and computes its own batches (batch g of the TEST stream on replica
    g mod N, passes going on where the last stopped), the sums in batch order: the same
    numbers, to the bit, as the root testing alone (the tree, where only the root tests).
    ``graphed`` runs the forwards as the GPUs' replays do, unrecorded: rounds of up to 2
    batches a replica, read in the stream's order, then each replica's chunk."""
    caplog.set_level(logging.INFO, logger="caffe_py")
    monkeypatch.setattr(graphed_tests, "CHUNK_MAX", 2)

    def count_batches(run):
        """One more pass: the replica of each batch, in the order they ran."""
        nets = run.root.test_batches._nets[0]
        ran = []
        hooks = [net.register_forward_hook(lambda *_, r=r: ran.append(r))
                 for r, net in enumerate(nets)]
        run.root.test_batches(0, nets[0], test_iter, autocast=contextlib.nullcontext,
                              between=lambda: False)
        for hook in hooks:
            hook.remove()
        return ran

    def tests(name, captured):
        path = tmp_path / f"{name}.yaml"
        path.write_text(TESTED.format(db=db, test_iter=test_iter, prefix=tmp_path / name / "s"))
        caplog.clear()
        tuning = Tuning(captured=captured, split_tests=True,
                        graphed_tests=graphed if captured else None)
        with ReplicatedRun(load_solver(path), ["cpu"] * n, tuning=tuning) as run:
            run.run()
            lines = [m for m in caplog.messages if m.startswith(("Test", "    Test"))]
            return lines, run.root.last_test, run, count_batches(run) if captured else None

    alone, alone_means, _, _ = tests("tree", False)
    split, split_means, run, ran = tests("cap", True)
    assert len(alone) == 3 * 2 and split == alone   # tests at 0, 4 and 8: acc and loss
    assert all(a[k].equal(b[k]) for a, b in zip(split_means, alone_means, strict=True)
               for k in a)
    nets = run.root.test_batches._nets[0]
    assert len(nets) == n and [net.device for net in nets] == [torch.device("cpu")] * n
    # the fourth pass: batches 3 x test_iter on, each on the replica whose turn it is
    turns = [(3 * test_iter + i) % n for i in range(test_iter)]
    if graphed:   # each round's batches replayed replica by replica
        turns = [r for at in range(0, test_iter, 2 * n) for r in sorted(turns[at:at + 2 * n])]
    assert ran == turns
    # every replica's TEST feed read its own turns: N readers of one stream, 5 records a turn
    state = run.root.test_pool.state_dict()[db]["TEST/data"]
    read = 4 * test_iter * 5
    assert state == {"replicas": n, "origin": 0, "unit": 5,
                     "next": [read + RoundRobin.fresh(n, unit=5).first_index(r, read)
                              for r in range(n)]}


def test_a_split_test_stream_resumes_after_the_batches_read(tmp_path, db, caplog):
    """Snapshotted at iteration 4 (before its test) by two replicas that split their test
    passes (7 batches of 5 read: replica 0 read 0, 2, 4, 6, replica 1 1, 3, 5), resumed by
    two, by three, and by the tree (its root testing alone): the test a resume runs at
    iteration 4 reads batches 7-13 in each, so all three print what the run that went straight
    through printed at 4."""
    caplog.set_level(logging.INFO, logger="caffe_py")
    text = TESTED.format(db=db, test_iter=7, prefix=tmp_path / "r" / "s").replace(
        "snapshot_after_train: false", "snapshot_after_train: false\nsnapshot: 4")
    path = tmp_path / "r.yaml"
    path.write_text(text)

    def retest(n=2, captured=True, snapshot=None):
        """The first test pass's lines (acc, loss)."""
        caplog.clear()
        options = TrainOptions(snapshot=str(snapshot)) if snapshot else TrainOptions()
        if snapshot and captured:
            with ReplicatedRun(load_solver(path), ["cpu"] * n, options,
                               tuning=Tuning(captured=True)) as run:
                run.prepare()
                # the same count goes on where each replica was; another starts fresh turns
                # right after the 35 records read
                starts = [q.next_position for q in run.split_tests._queues[0]]
                assert starts == ([40, 35] if n == 2 else [0, 5, 10])
                assert run.root.test_pool._sources[db].streams["TEST/data"].origin == (
                    0 if n == 2 else 35)
        with ReplicatedRun(load_solver(path), ["cpu"] * n, options,
                           tuning=Tuning(captured=captured)) as run:
            run.run()
        lines = [m for m in caplog.messages if m.startswith("    Test")]
        return lines if snapshot else lines[2:4]   # straight: the test at 4

    straight = retest()
    state = tmp_path / "r" / "s_iter_4.solverstate.pt"
    resumed = [retest(2, snapshot=state)[:2], retest(3, snapshot=state)[:2],
               retest(2, captured=False, snapshot=state)[:2]]
    assert resumed[0] == resumed[1] == resumed[2] == straight


@pytest.mark.parametrize("split_ms, chosen", [(2.0, True), (6.0, False)])
def test_the_passes_measure_whether_a_split_pass_is_shorter(tmp_path, db, split_ms, chosen,
                                                           caplog):
    """Passes 1-2 on the root alone (reading every batch from the feed whose turn it is),
    pass 3 split, then the one that took less time a batch (pass 2 against pass 3: the first
    paid for capture), said once; the numbers are the same either way, the same as the tree's
    root testing alone."""
    caplog.set_level(logging.INFO, logger="caffe_py")
    path = tmp_path / "s.yaml"
    path.write_text(TESTED.format(db=db, test_iter=5, prefix=tmp_path / "m" / "s")
                    .replace("max_iter: 8", "max_iter: 20"))
    with ReplicatedRun(load_solver(path), ["cpu"] * 2, tuning=Tuning(captured=True)) as run:
        tests = run.root.test_batches
        # each pass reads the clock at its start and end (seconds), 5 batches a pass (the
        # split pass starts its clock after the replicas' captures)
        ticks = iter([0.0, 0.05, 0.05, 0.05 + 5 * 5e-3, 0.5, 0.5 + 5 * split_ms * 1e-3])
        tests.clock = lambda: next(ticks, 0.0)
        run.run()
        means = run.root.last_test
    lines = [m for m in caplog.messages if m.startswith("Test net #0 tests")]
    where = "split over 2 replicas" if chosen else "on the root alone"
    assert lines == [f"Test net #0 tests {where}: {split_ms:g} ms a batch split over 2, "
                     "5 ms on the root alone"]
    assert tests._chosen == {0: chosen}
    assert sum("Testing net (#0)" in m for m in caplog.messages) == 6   # 0, 4, ..., 20
    assert set(means[0]) == {"acc", "loss", "__loss__"}
    caplog.clear()
    with ReplicatedRun(load_solver(path), ["cpu"] * 2, tuning=Tuning(captured=False)) as run:
        run.run()
        alone = run.root.last_test
    assert all(a[k].equal(b[k]) for a, b in zip(means, alone, strict=True) for k in a)


def test_the_root_test_net_driven_directly_reads_every_batch_in_turn(tmp_path, db):
    """Anything that runs the root's TEST net itself (the detection evaluation does) reads
    the stream's batches in order, each from the feed whose turn it is: with the same weights
    it computes what one replica reading the stream alone computes."""
    path = tmp_path / "d.yaml"
    path.write_text(TESTED.format(db=db, test_iter=7, prefix=tmp_path / "d" / "s"))

    def four_batches(n, captured):
        with ReplicatedRun(load_solver(path), ["cpu"] * n,
                           tuning=Tuning(captured=captured)) as run:
            run.prepare()
            net = run.root.test_nets[0]
            with torch.no_grad():
                outs = [net() for _ in range(4)]
            where = [q.next_position for q in run.split_tests._queues[0]] if captured else None
        return [(out.loss.item(), out.outputs["acc"].item()) for out in outs], where

    got, where = four_batches(3, True)
    want, _ = four_batches(1, False)
    assert where == [30, 20, 25]   # batches 0-3 read; batch 4 is replica 1's
    assert got == want and len({loss for loss, _ in got}) == 4


def test_a_detection_test_net_tests_on_the_root(tmp_path, monkeypatch, caplog):
    """The detection evaluation runs the root's TEST net itself and gathers every batch's
    detections there: its net tests on the root alone, reading every batch (the small SSD of
    configs/ssd_shapes on 2 CPU replicas prints the tree's mAP)."""
    import shutil

    from click.testing import CliRunner

    from caffe_py.cli import cli

    root = Path(__file__).resolve().parents[2]
    caplog.set_level(logging.INFO, logger="caffe_py")
    monkeypatch.chdir(tmp_path)   # the prototxts' paths are relative to where Caffe runs
    shutil.copytree(root / "configs" / "ssd_shapes", tmp_path / "configs" / "ssd_shapes")
    shapes = load_script("data/shapes_detection.py")
    shapes.write_set(tmp_path / "data" / "shapes", 8, 20, size=64, seed=0)
    for split in ("trainval", "test"):
        done = CliRunner().invoke(cli, [
            "convert", "annoset", "data/shapes/", f"data/shapes/{split}.txt",
            f"data/shapes/{split}_lmdb", "--label-map-file", "data/shapes/labelmap.prototxt",
            "--encoded", "--encode-type", "png"])
        assert done.exit_code == 0, done.output
    param = dataclasses.replace(load_solver("configs/ssd_shapes/solver.prototxt"),
                                max_iter=1, test_iter=[2], test_interval=1,
                                test_initialization=False, snapshot=0)
    maps = []
    for captured in (True, False):
        with ReplicatedRun(param, ["cpu"] * 2, tuning=Tuning(captured=captured)) as run:
            run.run()
            maps.append(float(run.root.last_test[0]["detection_eval"]))
    assert ("Note: test net #0 runs on the root alone: the detection evaluation gathers every "
            "batch's detections there") in caplog.messages
    assert maps[0] == maps[1]


def test_a_test_net_that_makes_its_own_data_tests_on_the_root(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")
    path = tmp_path / "s.yaml"
    path.write_text("""
net_param:
  name: dummy
  layer:
    - {name: data, type: DummyData, top: [data, label],
       dummy_data_param: {shape: [{dim: [4, 3]}, {dim: [4]}],
                          data_filler: [{type: gaussian}, {type: constant}]}}
    - {name: ip, type: InnerProduct, bottom: data, top: ip,
       inner_product_param: {num_output: 2, weight_filler: {type: xavier}}}
    - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
base_lr: 0.1
max_iter: 2
test_iter: 3
test_interval: 2
solver_mode: CPU
snapshot_after_train: false
snapshot_prefix: """ + str(tmp_path / "s") + "\n")
    with ReplicatedRun(load_solver(path), ["cpu"] * 2, tuning=Tuning(captured=True)) as run:
        run.run()
    assert ("Note: test net #0 runs on the root alone: layer 'data' (DummyData) makes its own "
            "data, which the other replicas cannot read their share of") in caplog.messages
    assert sum("Testing net (#0)" in m for m in caplog.messages) == 2


def test_a_split_pass_sums_its_rows_one_after_another_in_batch_order():
    """The host adds the replicas' rows in batch order, one add after another as one device
    does (a sum in pairs would not: 1e8 then 16 ones is 1e8 added one at a time in float32,
    1e8 + 16 in pairs), the loss from +0.0 and the outputs from -0.0."""
    from caffe_py.parallel.captured import _host_means
    from caffe_py.solver.graphed_tests import RowLayout

    layout = RowLayout(("acc",), (slice(1, 3),), 3)
    values = np.ones((17, 3), dtype=np.float32)
    values[0] = [1e8, 1e8, -0.0]
    values[1:, 2] = -0.0   # acc[1] is -0.0 in every batch: its sum stays -0.0
    order = [(i + 1) % 3 for i in range(17)]   # batch i on replica (i + 1) mod 3
    rows = [[torch.from_numpy(values[[i for i, r in enumerate(order) if r == replica]])]
            for replica in range(3)]
    means = _host_means(order, rows, layout, 17, torch.device("cpu"))
    total = np.float32(0.0)
    sums = values[0, 1:].copy()
    total = total + values[0, 0]
    for row in values[1:]:
        total, sums = total + row[0], sums + row[1:]
    assert sums.tolist() == [1e8, -0.0] and float(values[:, 1].sum()) != 1e8
    assert means["__loss__"].tolist() == (torch.tensor([float(total)]) / 17).tolist()
    assert means["acc"].tolist() == (torch.from_numpy(sums) / 17).tolist()
    assert math.copysign(1, means["acc"][1]) == -1
