"""Model averaging inside a host (model_average_period) and per-layer waits on the weight path,
through the real Solver and a Data layer over a tiny LMDB: K = 1 with plain SGD equals
synchronous training to float rounding, the root tests and snapshots the average, signals act
at points, resume is exact, and layer waits change no bit."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from support import snapshot_names

from caffe_py.errors import SolverError
from caffe_py.options import TrainOptions
from caffe_py.parallel import ReplicatedRun, Tuning
from caffe_py.parallel.pull import Pull
from caffe_py.solver.snapshot import load_weights
from caffe_py.solver.solver import Solver
from caffe_py.spec.solver_spec import load_solver

B = 4
# conv -> BatchNorm + Scale (fused into one batch_norm: the BatchNorm reads the Scale's blobs,
# which come after it) -> ReLU -> ip: weights, state blobs and a fused pair in several buckets
SOLVER = """
net_param:
  name: tiny
  layer:
    - {{name: data, type: Data, top: [data, label], transform_param: {{scale: 0.00390625}},
       data_param: {{source: {db}, batch_size: {batch}}}}}
    - {{name: conv, type: Convolution, bottom: data, top: conv,
       convolution_param: {{num_output: 2, kernel_size: 3, weight_filler: {{type: xavier}},
                           bias_filler: {{type: constant, value: 0.1}}}}}}
    - {{name: bn, type: BatchNorm, bottom: conv, top: conv}}
    - {{name: scale, type: Scale, bottom: conv, top: conv, scale_param: {{bias_term: true}}}}
    - {{name: relu, type: ReLU, bottom: conv, top: conv}}
    - {{name: ip, type: InnerProduct, bottom: conv, top: ip,
       inner_product_param: {{num_output: 3, weight_filler: {{type: xavier}}}}}}
    - {{name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}}
type: {type}
base_lr: {lr}
momentum: {momentum}
weight_decay: 0.001
lr_policy: inv
gamma: 0.01
power: 0.75
max_iter: {iters}
random_seed: 7
solver_mode: CPU
snapshot_after_train: false
snapshot_prefix: {prefix}
"""
SMALL_BUCKETS = 64   # bytes: every blob its own bucket, so weights arrive in several units


pytestmark = pytest.mark.usefixtures("no_stray_threads")


def _param(tmp_path, db, *, iters=6, momentum=0.9, type_="SGD", name="s", **fields):
    lr = 0.01 if type_ == "Adam" else 0.1
    path = tmp_path / f"{name}.yaml"
    path.write_text(SOLVER.format(db=db, batch=B, type=type_, lr=lr, momentum=momentum,
                                  iters=iters, prefix=tmp_path / f"{name}_snap"))
    return dataclasses.replace(load_solver(path), **fields)


def _run(param, n=3, options=None, **tuning):
    tuning.setdefault("bucket_bytes", SMALL_BUCKETS)
    with ReplicatedRun(param, ["cpu"] * n, options, tuning=Tuning(**tuning)) as run:
        run.run()
        return _weights(run.root), run


def _weights(solver):
    return [lp.param.detach().clone() for lp in solver.net.learnable_params()]


def _rel(a, b):
    return max(((x - y).norm() / y.norm()).item() for x, y in zip(a, b, strict=True))


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_averaging_every_iteration_with_plain_sgd_equals_synchronous_training(tmp_path, db, n):
    sync, _ = _run(_param(tmp_path, db, momentum=0.0), n)
    avg, run = _run(_param(tmp_path, db, momentum=0.0, model_average_period=1), n)
    start = _weights(Solver(_param(tmp_path, db, name="init")))
    assert _rel(sync, start) > 1e-2                   # it trained
    assert _rel(avg, sync) < 1e-5                     # the same training, to float rounding
    assert [s.role.applies_updates for s in run.solvers] == [True] * n


def test_with_the_history_averaged_momentum_also_equals_synchronous_training(tmp_path, db):
    # the mean of (m h_i + r g_i) is m h + r mean(g): linear, so K = 1 is synchronous SGD
    sync, _ = _run(_param(tmp_path, db))
    avg, _ = _run(_param(tmp_path, db, model_average_period=1))
    assert _rel(avg, sync) < 1e-5


def test_a_longer_period_trains_something_else_the_same_way_every_time(tmp_path, db):
    sync, _ = _run(_param(tmp_path, db))
    a, run = _run(_param(tmp_path, db, model_average_period=4))
    b, _ = _run(_param(tmp_path, db, model_average_period=4))
    assert _same(a, b)
    assert _rel(a, sync) > 1e-3
    assert "every 4 iterations" in "\n".join(run.banner())


@pytest.mark.parametrize("period", [0, 1, 3])
def test_layer_waits_change_no_bit(tmp_path, db, period):
    param = _param(tmp_path, db, model_average_period=period)
    on, run = _run(param, 4)
    off, _ = _run(param, 4, layer_waits=False)
    assert _same(on, off)
    assert run.sync.replica(1).layer_waits is not None


@pytest.mark.parametrize("period", [0, 2])
def test_lockstep_equals_threads_bit_for_bit(tmp_path, db, period):
    param = _param(tmp_path, db, model_average_period=period)
    assert _same(_run(param, 3, lockstep=True)[0], _run(param, 3)[0])


def test_a_forward_waits_only_for_the_units_its_layers_read(tmp_path, db, monkeypatch):
    """On a worker, conv's forward starts before ip's weights are copied; the BatchNorm waits
    for the Scale's blobs (fused into it) although the Scale comes after it."""
    log: list[tuple[str, object]] = []
    real = Pull._pull

    def pull(self, u):
        if self.who == 1:
            log.append(("pull", u))
        return real(self, u)

    monkeypatch.setattr(Pull, "_pull", pull)
    param = _param(tmp_path, db, iters=1)
    with ReplicatedRun(param, ["cpu"] * 2, tuning=Tuning(bucket_bytes=SMALL_BUCKETS)) as run:
        worker = run.solvers[1]
        for layer in worker.net.layers:
            layer.register_forward_pre_hook(lambda m, _a: log.append(("forward", m.name)))
        waits = run.sync.replica(1).layer_waits
        names = [layer.name for layer in worker.net.layers]
        needs = dict(zip(names, waits.first_needs, strict=True))
        run.run()
    unit = {k: u for u, ts in enumerate(_unit_tensors(run)) for k in ts}
    blobs = {name: [unit[t.data_ptr()] for t in layer.blobs() if t.data_ptr() in unit]
             for name, layer in zip(names, worker.net.layers, strict=True)}
    assert sorted(needs["bn"]) == sorted(blobs["bn"] + blobs["scale"])
    assert needs["scale"] == [] and needs["conv"] == sorted(blobs["conv"])
    assert needs["ip"] == sorted(blobs["ip"]) and needs["data"] == []
    # the pulls happen inside the forward, each just before the first layer that reads it
    order = [what for kind, what in log if kind == "forward" or what in blobs["ip"]]
    assert order.index("conv") < order.index(blobs["ip"][0]) < order.index("ip")


def _unit_tensors(run):
    from caffe_py.parallel.sync import unit_tensors

    return [[t.data_ptr() for t in ts] for ts in unit_tensors(run.sync.replica(1))]


def test_the_root_tests_the_average_of_the_replicas_models(tmp_path, db, monkeypatch):
    """At a test point that is no multiple of K the replicas average first, and the root's test
    nets see exactly (w0 + w1 + w2) / 3, the models after the update before the test."""
    updated: dict[tuple[int, int], list[torch.Tensor]] = {}
    tested: dict[int, list[torch.Tensor]] = {}
    real_update, real_test = Solver.apply_update, Solver.test_all

    def apply_update(self):
        rate = real_update(self)
        updated[(self.replica, self.iter + 1)] = _weights(self)
        return rate

    def test_all(self):
        tested[self.iter] = [lp.param.detach().clone()
                             for lp in self.test_nets[0].learnable_params()]
        return real_test(self)

    monkeypatch.setattr(Solver, "apply_update", apply_update)
    monkeypatch.setattr(Solver, "test_all", test_all)
    param = _param(tmp_path, db, iters=7, model_average_period=4, test_iter=[1],
                   test_interval=3, test_initialization=False)
    _run(param, 3)
    assert sorted(tested) == [3, 6]
    for t in (3, 6):
        mean = [(a + b + c) * (1.0 / 3) for a, b, c in
                zip(*(updated[(i, t)] for i in range(3)), strict=True)]
        assert _same(tested[t], mean)
        assert not _same(updated[(0, t)], mean)       # the root's own model was not tested


def test_resume_at_a_point_between_periods_continues_exactly(tmp_path, db):
    full = _param(tmp_path, db, iters=8, model_average_period=3, snapshot=5, name="full")
    whole, _ = _run(full)
    again = _param(tmp_path, db, iters=8, model_average_period=3, name="again")
    state = tmp_path / "full_snap_iter_5.solverstate.pt"
    resumed, run = _run(again, options=TrainOptions(snapshot=str(state)))
    assert [s.iter for s in run.solvers] == [8] * 3
    assert _same(whole, resumed)


def test_lockstep_resume_continues_exactly(tmp_path, db):
    full = _param(tmp_path, db, iters=6, type_="Adam", model_average_period=2, snapshot=3,
                  name="full")
    whole, _ = _run(full, lockstep=True)
    again = _param(tmp_path, db, iters=6, type_="Adam", model_average_period=2, name="again")
    state = tmp_path / "full_snap_iter_3.solverstate.pt"
    assert _same(whole, _run(again, options=TrainOptions(snapshot=str(state)),
                             lockstep=True)[0])


def test_signals_act_at_the_next_averaging_point(tmp_path, db):
    """A snapshot asked for after iteration 2 is written at 4, a stop asked for after 5
    ends the run at 8 (K = 4), where every replica holds the one model that is saved."""
    requests = {2: "snapshot", 5: "stop"}
    holder: dict[str, ReplicatedRun] = {}

    def action() -> str:
        return requests.pop(holder["run"].root.iter, "none")

    param = _param(tmp_path, db, iters=40, model_average_period=4)
    param.snapshot_after_train = True
    with ReplicatedRun(param, ["cpu"] * 3, action=action,
                       tuning=Tuning(bucket_bytes=SMALL_BUCKETS)) as run:
        holder["run"] = run
        run.run()
        assert run.root.iter == 8 and run.root.stop_requested
        root = _weights(run.root)
    names = snapshot_names(tmp_path, "s_snap")
    assert names == ["s_snap_iter_4.pt", "s_snap_iter_4.solverstate.pt",
                     "s_snap_iter_8.pt", "s_snap_iter_8.solverstate.pt"]
    saved = load_weights(tmp_path / "s_snap_iter_8.pt")
    assert _same([t for blobs in saved.values() for t in blobs][:2], root[:2])


def test_nccl_cannot_average_models(tmp_path, db):
    param = _param(tmp_path, db, model_average_period=2)
    with pytest.raises(SolverError, match="model_average_period averages the replicas "
                                          "through the tree; use --reduction tree"):
        ReplicatedRun(param, ["cpu"] * 2, TrainOptions(reduction="nccl"))


def test_keeping_the_history_per_replica_is_the_measured_alternative(tmp_path, db):
    kept, _ = _run(_param(tmp_path, db, model_average_period=3), average_history=False)
    averaged, _ = _run(_param(tmp_path, db, model_average_period=3))
    assert _rel(kept, averaged) > 1e-6
    assert _same(kept, _run(_param(tmp_path, db, model_average_period=3),
                            average_history=False)[0])
