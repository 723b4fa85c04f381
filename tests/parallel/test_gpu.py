"""The same equivalences on CUDA devices: tree and NCCL across GPUs, CUDA graphs vs eager, per-layer
waits on the weight path and model averaging.

Skipped without CUDA (marker ``gpu``); the multi-GPU cases need at least two GPUs.
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch
from support import tiny_net, write_records

from caffe_py.devices import DeviceError, check_devices
from caffe_py.options import TrainOptions
from caffe_py.parallel import ReplicatedRun, Tuning
from caffe_py.parallel.peer_sum import PEER_SUM_BYTES
from caffe_py.spec.solver_spec import load_solver

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")

B, ITERS = 8, 5
SOLVER = """
net_param:
  name: tiny
  layer:
    - {{name: data, type: Data, top: [data, label], transform_param: {{scale: 0.00390625}},
       data_param: {{source: {db}, batch_size: {batch}}}}}
    - {{name: conv, type: Convolution, bottom: data, top: conv,
       convolution_param: {{num_output: 4, kernel_size: 3, weight_filler: {{type: xavier}}}}}}
    - {{name: relu, type: ReLU, bottom: conv, top: conv}}
    - {{name: ip, type: InnerProduct, bottom: conv, top: ip,
       inner_product_param: {{num_output: 3, weight_filler: {{type: xavier}}}}}}
    - {{name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}}
base_lr: 0.05
momentum: 0.9
max_iter: {iters}
random_seed: 11
snapshot_after_train: false
snapshot_prefix: {prefix}
"""


@pytest.fixture(autouse=True)
def exact_float32():
    conv, mm = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = conv, mm


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("lmdb") / "gpu_lmdb"
    rng = np.random.default_rng(1)
    return write_records(path, ((rng.integers(0, 256, (1, 8, 8), dtype=np.uint8), i % 3)
                                for i in range(200)))


def _train(tmp_path, db, devices, batch, options=None, caplog=None, fields=None, **tuning):
    """Train on ``devices``; the tree unless ``options`` say otherwise."""
    options = options or TrainOptions(reduction="tree")
    path = tmp_path / f"s{len(devices)}_{batch}.yaml"
    path.write_text(SOLVER.format(db=db, batch=batch, iters=ITERS, prefix=tmp_path / "snap"))
    if caplog is not None:
        caplog.set_level(logging.INFO, logger="caffe_py")
        caplog.clear()
    param = dataclasses.replace(load_solver(path), **(fields or {}))
    with ReplicatedRun(param, devices, options, tuning=Tuning(**tuning)) as run:
        run.run()
        weights = [lp.param.detach().cpu() for lp in run.root.net.learnable_params()]
    return weights, (caplog.messages if caplog is not None else [])


def _rel(a, b):
    return max(((x - y).norm() / y.norm()).item() for x, y in zip(a, b, strict=True))


@two_gpus
@pytest.mark.parametrize("reduction, graphs", [("tree", "auto"), ("nccl", "off"),
                                               ("auto", "auto")])
def test_gpus_equal_one_gpu_with_the_whole_batch(tmp_path, db, reduction, graphs):
    n = min(torch.cuda.device_count(), 4)
    devices = [torch.device("cuda", i) for i in range(n)]
    got, _ = _train(tmp_path, db, devices, B,
                    options=TrainOptions(reduction=reduction, graphs=graphs))
    ref, _ = _train(tmp_path, db, devices[:1], n * B)
    assert _rel(got, ref) < 1e-5


@two_gpus
def test_tree_runs_are_bit_identical(tmp_path, db):
    devices = [torch.device("cuda", i) for i in range(2)]
    torch.backends.cudnn.deterministic = True
    try:
        a, _ = _train(tmp_path, db, devices, B)
        b, _ = _train(tmp_path, db, devices, B)
    finally:
        torch.backends.cudnn.deterministic = False
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_cuda_graphs_match_eager(tmp_path, db, caplog):
    devices = [torch.device("cuda", i) for i in range(min(torch.cuda.device_count(), 2))]
    graphed, notes = _train(tmp_path, db, devices, B,
                            TrainOptions(graphs="on", reduction="tree"), caplog)
    assert not [m for m in notes if m.startswith("CUDA graphs off")]
    eager, _ = _train(tmp_path, db, devices, B)
    assert _rel(graphed, eager) < 1e-5


@two_gpus
def test_graphs_in_lockstep_match_graphs_in_threads(tmp_path, db, caplog):
    devices = [torch.device("cuda", i) for i in range(min(torch.cuda.device_count(), 4))]
    graphs = TrainOptions(graphs="on", reduction="tree")
    lockstep, notes = _train(tmp_path, db, devices, B, graphs, caplog)
    assert not [m for m in notes if m.startswith("CUDA graphs off")]
    threads, _ = _train(tmp_path, db, devices, B, graphs, lockstep=False)
    assert _rel(lockstep, threads) < 1e-5
    ref, _ = _train(tmp_path, db, devices[:1], len(devices) * B)
    assert _rel(lockstep, ref) < 1e-5


def test_a_gpu_that_does_not_exist():
    n = torch.cuda.device_count()
    with pytest.raises(DeviceError, match=rf"^GPU {n} does not exist: this machine has {n} GPU"):
        check_devices([0, n])


@pytest.fixture
def deterministic():
    torch.backends.cudnn.deterministic = True
    yield
    torch.backends.cudnn.deterministic = False


@two_gpus
@pytest.mark.parametrize("period", [0, 2])
def test_layer_waits_change_no_bit_on_gpus(tmp_path, db, deterministic, period):
    """Every blob its own bucket (64-byte buckets): the copies run on each replica's copy
    stream and each layer's forward waits on its own units' events only."""
    devices = [torch.device("cuda", i) for i in range(min(torch.cuda.device_count(), 4))]
    fields, eager = {"model_average_period": period}, TrainOptions(graphs="off", reduction="tree")
    on, _ = _train(tmp_path, db, devices, B, eager, fields=fields, bucket_bytes=64)
    off, _ = _train(tmp_path, db, devices, B, eager, fields=fields, bucket_bytes=64,
                    layer_waits=False)
    assert all(torch.equal(x, y) for x, y in zip(on, off, strict=True))


@two_gpus
def test_a_gpu_forward_waits_only_for_its_layers_units(tmp_path, db):
    """When conv's forward starts on a worker, every unit's copy is issued on its copy stream,
    conv's units are waited for on the compute stream and ip's are not yet."""
    path = tmp_path / "s.yaml"
    path.write_text(SOLVER.format(db=db, batch=B, iters=1, prefix=tmp_path / "snap"))
    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    seen = {}
    # layer waits belong to the eager step (a captured step replays its waits as recorded)
    with ReplicatedRun(load_solver(path), devices, TrainOptions(graphs="off"),
                       tuning=Tuning(bucket_bytes=64)) as run:
        rep = run.sync.replica(1)
        layers = {layer.name: (layer, units) for layer, units in
                  zip(run.solvers[1].net.layers, rep.layer_waits.first_needs, strict=True)}
        conv, conv_units = layers["conv"]
        ip_units = layers["ip"][1]

        def look(_module, _args):
            pull = rep.pull
            seen.update(done=list(pull.done), waited=list(pull.waited),
                        events=[e is not None for e in pull.events])

        conv.register_forward_pre_hook(look)
        run.run()
    assert all(seen["done"]) and all(seen["events"])
    assert all(seen["waited"][u] for u in conv_units)
    assert ip_units and not any(seen["waited"][u] for u in ip_units)


@two_gpus
def test_averaging_every_iteration_equals_the_tree_on_gpus(tmp_path, db):
    devices = [torch.device("cuda", i) for i in range(min(torch.cuda.device_count(), 4))]
    tree, _ = _train(tmp_path, db, devices, B)
    averaged, _ = _train(tmp_path, db, devices, B, fields={"model_average_period": 1})
    assert _rel(averaged, tree) < 1e-5


@two_gpus
def test_captured_whole_iterations_give_the_graphed_trees_weights_bit_for_bit(tmp_path, db,
                                                                              caplog):
    """Two GPUs, no flag: every replica's whole iteration is captured with NCCL's all-reduce
    inside. Against the tree whose replicas' passes are graphs too (the same kernels) and whose
    root updates with SGD's kernel (the same with host or device rates), the weights are
    equal bit for bit, and the worker holds the root's; against the eager tree they differ
    only by what cuDNN does differently inside a graph (deterministic convolutions in every
    run)."""
    devices = [torch.device("cuda", i) for i in range(2)]
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    fields = {"max_iter": 12}
    try:
        path = tmp_path / "s.yaml"
        path.write_text(SOLVER.format(db=db, batch=B, iters=12, prefix=tmp_path / "snap"))
        caplog.set_level(logging.INFO, logger="caffe_py")
        with ReplicatedRun(load_solver(path), devices, TrainOptions()) as run:
            assert run.captured and run.reduction == "all-reduce, captured"
            run.root.runner.chunk_cap = 4
            run.run()
            captured = [[lp.param.detach().cpu() for lp in s.net.learnable_params()]
                        for s in run.solvers]
            assert run.root.runner.fallback is None and sorted(run.root.runner.graphs) == [1, 4]
        graphed, _ = _train(tmp_path, db, devices, B,
                            TrainOptions(graphs="on", reduction="tree"), fields=fields)
        eager, _ = _train(tmp_path, db, devices, B,
                          TrainOptions(graphs="off", reduction="tree"), fields=fields)
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved
    assert "whole iterations captured on every replica (cuda:0, cuda:1), issued by one " \
           "thread; gradients summed by reads of the peers' memory (buckets up to " \
           f"{PEER_SUM_BYTES // 2**20} MiB) inside them in 2 buckets, each started as soon as " \
           "backward has finished it; every replica applies the update" in caplog.messages
    assert all(torch.equal(a, b) for a, b in zip(captured[1], captured[0], strict=True))
    assert _rel(captured[0], graphed) < 1e-6, [(a - b).abs().max().item()
                                               for a, b in zip(captured[0], graphed, strict=True)]
    assert _rel(captured[0], eager) < 1e-6


def _captured(tmp_path, db, devices, **fields):
    """A no-flag run on ``devices`` (whole iterations captured, chunks of 4): every replica's
    weights, the loss scale (FLOAT16) and the buckets backward's hooks completed."""
    path = tmp_path / "s.yaml"
    path.write_text(SOLVER.format(db=db, batch=B, iters=12, prefix=tmp_path / "snap"))
    param = dataclasses.replace(load_solver(path), **fields)
    with ReplicatedRun(param, devices, TrainOptions()) as run:
        assert run.captured
        run.root.runner.chunk_cap = 4
        run.run()
        loop = run.root.runner
        assert loop.fallback is None and sorted(loop.graphs) == [1, 4]
        weights = [[lp.param.detach().cpu() for lp in s.net.learnable_params()]
                   for s in run.solvers]
        scale = run.root.loss_scale.state_dict() if run.root.loss_scale is not None else None
        return weights, scale, run.sync.in_backward


@two_gpus
@pytest.mark.parametrize("precision", ["FLOAT32", "FLOAT16"])
def test_captured_buckets_reduced_during_backward_equal_the_sum_after_it_bit_for_bit(
        tmp_path, db, precision):
    """Two GPUs: each bucket's all-reduce runs on a side stream beside backward inside the
    graphs; against ``layer_wise_reduce: false`` (the whole gradient after backward, on the
    update's stream) the weights are equal bit for bit, since each element is the sum of the
    same two operands. FLOAT16's unscale and overflow mask read the sum after the join: the
    loss scale and its skipped updates are the same too."""
    devices = [torch.device("cuda", i) for i in range(2)]
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        on, on_scale, in_backward = _captured(tmp_path, db, devices, precision=precision)
        off, off_scale, none = _captured(tmp_path, db, devices, precision=precision,
                                         layer_wise_reduce=False)
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved
    assert in_backward == 2 * 2 and none == 0   # 2 buckets per replica, completed by hooks
    assert on_scale == off_scale
    for replica in (0, 1):
        assert all(torch.equal(a, b) for a, b in zip(on[replica], off[replica], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(on[1], on[0], strict=True))


@pytest.mark.skipif(torch.cuda.device_count() < 3, reason="needs 3 GPUs")
def test_captured_buckets_on_more_gpus_match_the_sum_after_backward(tmp_path, db):
    """Three or four GPUs: NCCL's ring adds an element's operands in an order that depends on
    where the element lies in the buffer it reduces, so buckets may round differently from
    the whole buffer (12 iterations with momentum: within 1e-5); every replica still holds the
    same weights."""
    devices = [torch.device("cuda", i) for i in range(min(4, torch.cuda.device_count()))]
    saved = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        on, _, in_backward = _captured(tmp_path, db, devices)
        off, _, _ = _captured(tmp_path, db, devices, layer_wise_reduce=False)
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = saved
    assert in_backward == 2 * len(devices)
    assert _rel(on[0], off[0]) < 1e-5
    assert all(torch.equal(a, b) for w in on[1:] for a, b in zip(w, on[0], strict=True))


@two_gpus
@pytest.mark.parametrize("iters, interval", [(6, 3), (14, 2)])
def test_a_test_pass_split_over_gpus_prints_one_gpus_numbers(tmp_path, db, caplog, iters,
                                                             interval):
    """The default on GPUs: each replica's test forward is a graph replay and the pass is split
    over the replicas. With base_lr 0 the weights stay as initialised, so every pass of 7
    batches prints one GPU's numbers (one GPU replays its pass as a graph too). With 8 passes
    the 200 records are read whole by the fourth, kept decoded and on each device: the last
    passes gather their batches inside the root's graph, its turns over both feeds too."""
    from caffe_py.train import train

    caplog.set_level(logging.INFO, logger="caffe_py")
    lines = {}
    for n in (1, 2):
        path = tmp_path / f"t{n}.yaml"
        path.write_text(SOLVER.format(db=db, batch=B, iters=iters,
                                      prefix=tmp_path / f"t{n}" / "s")
                        + f"test_iter: 7\ntest_interval: {interval}\n")
        param = dataclasses.replace(load_solver(path), base_lr=0.0)
        caplog.clear()
        root = train(param, [f"cuda:{i}" for i in range(n)], TrainOptions(overwrite=True))
        lines[n] = [m for m in caplog.messages if m.lstrip().startswith("Test net output")]
        forwards = (root.test_batches._forwards[0] if n == 2
                    else list(root.test_batches.forwards.values()))
        assert len(forwards) == n and all(f.graphs and f.fallback is None for f in forwards)
        if iters > 6:   # the root's (its turns over both replicas' feeds, on 2)
            assert [type(feed).__name__ for feed in forwards[0].feeds] == ["GatherFeed"]
    assert len(lines[1]) == iters // interval + 1 and lines[2] == lines[1]
    assert not [m for m in caplog.messages if m.startswith("CUDA graphs off")]



@two_gpus
def test_captured_iterations_draw_from_each_gpus_own_generator(tmp_path):
    """DummyData draws from a generator on each replica's GPU, registered with the graph that
    GPU replays; its graph-safe seed and offset must live on that GPU too (made on the root's,
    4 GPUs captured from one thread hit an illegal address on the first replay). Every GPU
    (up to 4) trains, each replica on its own draws, and all end with the root's weights."""
    devices = [torch.device("cuda", i) for i in range(min(4, torch.cuda.device_count()))]
    (tmp_path / "net.yaml").write_text(tiny_net())   # gaussian data, uniform labels
    path = tmp_path / "g.yaml"
    path.write_text(f"net: {tmp_path / 'net.yaml'}\nbase_lr: 0.05\nmax_iter: 12\n"
                    f"random_seed: 11\nsnapshot_after_train: false\n"
                    f"snapshot_prefix: {tmp_path / 'snap'}\n")
    with ReplicatedRun(load_solver(path), devices, TrainOptions()) as run:
        assert run.captured
        run.run()
        assert run.root.runner.fallback is None
        weights = [[lp.param.detach().cpu() for lp in s.net.learnable_params()]
                   for s in run.solvers]
        losses = run.root.monitor.losses[:12].cpu()
    assert all(torch.isfinite(w).all() for w in weights[0])
    assert all(torch.equal(a, b) for w in weights[1:] for a, b in zip(w, weights[0], strict=True))
    assert len(set(losses.tolist())) > 6   # every replay drew new data
