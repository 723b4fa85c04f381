"""train_replicated on CPU replicas: N x batch B equals 1 x batch N*B, through the real Solver,
the Data layer and a tiny LMDB (the round-robin reader gives identical record sets); the
lockstep driver gives the threaded run's weights bit for bit."""
from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from caffe_py.devices import DeviceError, check_devices, parse_devices
from caffe_py.errors import SolverError
from caffe_py.io import feed_of
from caffe_py.options import TrainOptions
from caffe_py.parallel import ReplicatedRun, Tuning
from caffe_py.parallel.lockstep import LockstepRoot, top_down
from caffe_py.parallel.sync import TreeSync
from caffe_py.parallel.topology import build_tree
from caffe_py.solver.snapshot import load_weights
from caffe_py.solver.solver import Solver
from caffe_py.spec.solver_spec import load_solver
from caffe_py.train import train

B, ITERS = 4, 6
SOLVER = """
net_param:
  name: tiny
  layer:
    - {{name: data, type: Data, top: [data, label], transform_param: {{{transform}}},
       data_param: {{source: {db}, batch_size: {batch}}}}}
    - {{name: conv, type: Convolution, bottom: data, top: conv,
       convolution_param: {{num_output: 2, kernel_size: 3, weight_filler: {{type: xavier}},
                           bias_filler: {{type: constant, value: 0.1}}}}}}
    - {{name: ip, type: InnerProduct, bottom: conv, top: ip,
       inner_product_param: {{num_output: 3, weight_filler: {{type: xavier}}}}}}
    - {{name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}}
type: {type}
base_lr: {lr}
momentum: 0.9
weight_decay: 0.001
lr_policy: inv
gamma: 0.01
power: 0.75
iter_size: {iter_size}
max_iter: {iters}
random_seed: 7
solver_mode: CPU
snapshot_after_train: {snap}
snapshot_prefix: {prefix}
"""


pytestmark = pytest.mark.usefixtures("no_stray_threads")


PLAIN = "scale: 0.00390625"
CROP_MIRROR = "scale: 0.00390625, crop_size: 4, mirror: true"


def _param(tmp_path, db, *, batch, type_="SGD", iter_size=1, iters=ITERS, snap="false",
           name="s", transform=PLAIN):
    lr = 0.01 if type_ == "Adam" else 0.1
    text = SOLVER.format(db=db, batch=batch, type=type_, lr=lr, iter_size=iter_size,
                         transform=transform,
                         iters=iters, snap=snap, prefix=tmp_path / f"{name}_snap")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return load_solver(path)


def _weights(solver):
    return [lp.param.detach().clone() for lp in solver.net.learnable_params()]


def _single(tmp_path, db, n, **kw):
    with Solver(_param(tmp_path, db, batch=n * B, name="ref", **kw)) as s:
        s.solve()
        return _weights(s)


def _replicated(tmp_path, db, n, **kw):
    param = _param(tmp_path, db, batch=B, name="rep", **kw)
    with ReplicatedRun(param, ["cpu"] * n) as run:
        run.run()
        return _weights(run.root), run


def _rel(a, b):
    return max(((x - y).norm() / y.norm()).item() for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_sgd_momentum_n_replicas_equal_one_with_n_times_the_batch(tmp_path, db, n):
    ref = _single(tmp_path, db, n)
    got, _ = _replicated(tmp_path, db, n)
    assert _rel(got, ref) < 1e-5


@pytest.mark.parametrize("n", [2, 3])
def test_adam(tmp_path, db, n):
    assert _rel(_replicated(tmp_path, db, n, type_="Adam")[0],
                _single(tmp_path, db, n, type_="Adam")) < 1e-5


@pytest.mark.parametrize("n", [2, 4])
def test_iter_size(tmp_path, db, n):
    assert _rel(_replicated(tmp_path, db, n, iter_size=2)[0],
                _single(tmp_path, db, n, iter_size=2)) < 1e-5


@pytest.mark.parametrize("n", [2, 3])
def test_random_crop_and_mirror_n_replicas_equal_one_with_n_times_the_batch(tmp_path, db, n):
    # the crops and flips of a record depend on (seed, record position) only, and every
    # replica's Data feed uses the run's seed, so N x B sees exactly the 1 x N*B images
    ref = _single(tmp_path, db, n, transform=CROP_MIRROR)
    got, run = _replicated(tmp_path, db, n, transform=CROP_MIRROR)
    assert _rel(got, ref) < 1e-5
    seeds = [(s.seeds.model, feed_of(s.net.data_layers()[0]).transformer.seed) for s in run.solvers]
    assert seeds == [(7 + i, 7) for i in range(n)]


def test_weights_moved_and_workers_hold_the_roots_weights(tmp_path, db):
    got, run = _replicated(tmp_path, db, 3)
    start = _weights(Solver(_param(tmp_path, db, batch=B, name="init")))
    assert _rel(got, start) > 1e-3
    # workers trained the last iteration with the weights before the root's last update
    assert run.solvers[1].role.applies_updates is False
    assert run.solvers[0].role.applies_updates is True
    assert [s.iter for s in run.solvers] == [ITERS] * 3


def test_two_runs_are_bit_identical(tmp_path, db):
    a, _ = _replicated(tmp_path, db, 3)
    b, _ = _replicated(tmp_path, db, 3)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_layer_wise_reduce_false_reduces_after_backward_with_the_same_weights(tmp_path, db):
    """Caffe's switch: the tree then sums after backward only (no hooks), to the same bits."""
    overlapped, on = _replicated(tmp_path, db, 3)
    param = dataclasses.replace(_param(tmp_path, db, batch=B, name="rep"),
                                layer_wise_reduce=False)
    with ReplicatedRun(param, ["cpu"] * 3) as off:
        off.run()
        after = _weights(off.root)
    assert on.sync.overlap and not off.sync.overlap
    assert sum(off.sync.replica(i).early for i in range(3)) == 0
    assert all(torch.equal(x, y) for x, y in zip(overlapped, after, strict=True))


def test_train_replicated_logs_batches_and_tree_and_snapshots(tmp_path, db, caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")
    param = _param(tmp_path, db, batch=B, snap="true", name="cli")
    root = train(param, [torch.device("cpu")] * 3, TrainOptions())
    lines = caplog.messages   # after the run layer's lines (devices, seed, resolved specs)
    lines = lines[next(i for i, m in enumerate(lines) if m.startswith("Batch: ")):]
    assert lines[:4] == [
        "Batch: 4 per replica x 3 replicas x iter_size 1 = 12 per update (effective batch 12; "
        "devices cpu#0, cpu#1, cpu#2; reduction tree; precision FLOAT32)",
        "reduction tree over 3 replica(s): root cpu#0, height 1 (<= ceil(log2 3) = 2)",
        "  round 1: cpu#0 <- cpu#1",
        "  round 2: cpu#0 <- cpu#2"]
    assert root.iter == ITERS
    weights = load_weights(tmp_path / f"cli_snap_iter_{ITERS}.pt")
    assert torch.equal(weights["ip"][0], root.net.layer_by_name("ip").blobs()[0].detach())
    assert (tmp_path / f"cli_snap_iter_{ITERS}.solverstate.pt").is_file()


def test_a_failure_leaves_the_last_snapshot_intact(tmp_path, db, monkeypatch):
    param = _param(tmp_path, db, batch=B, iters=20, name="snap")
    param.snapshot = 2
    with ReplicatedRun(param, ["cpu"] * 2) as run:
        worker = run.solvers[1]
        real = worker.step_fn

        def out_of_memory(solver):
            if worker.iter == 5:
                raise MemoryError("no room")
            return real(solver)

        monkeypatch.setattr(worker, "step_fn", out_of_memory)
        with pytest.raises(SolverError, match=r"^replica 1 \(cpu\) failed: MemoryError: no room$"):
            run.run()
    snaps = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("snap_snap_iter"))
    assert snaps == [f"snap_snap_iter_{i}{kind}.pt" for i in (2, 4)
                     for kind in ("", ".solverstate")]
    assert set(load_weights(tmp_path / "snap_snap_iter_4.pt")) == {"conv", "ip"}
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("lockstep", [None, True], ids=["threads", "lockstep"])
def test_an_exception_in_one_worker_names_it_and_stops_all(tmp_path, db, monkeypatch, lockstep):
    param = _param(tmp_path, db, batch=B, iters=50, name="boom")
    with ReplicatedRun(param, ["cpu"] * 3, tuning=Tuning(lockstep=lockstep)) as run:
        assert run.lockstep is bool(lockstep)
        worker = run.solvers[2]
        real = worker.step_fn

        def boom(solver):
            if worker.iter == 3:
                raise RuntimeError("injected in replica 2")
            return real(solver)

        monkeypatch.setattr(worker, "step_fn", boom)
        with pytest.raises(SolverError, match=r"^replica 2 \(cpu\) failed: RuntimeError: "
                                              r"injected in replica 2$"):
            run.run()
        # threads: the root may be one iteration ahead; lockstep issues replicas in turn
        if lockstep:
            assert run.root.iter == 3
        else:
            assert run.root.iter <= 4


def test_device_errors():
    if torch.cuda.device_count() > 1:
        with pytest.raises(DeviceError, match=r"^GPU 1 is listed twice in --gpus"):
            check_devices(["cuda:1", 1])
    with pytest.raises(DeviceError, match=r"^no device to train on"):
        check_devices([])
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError) as err:
            check_devices(["cpu", 7])
        assert str(err.value) == ("GPU 7 does not exist: this machine has no GPU; pass --gpus "
                                  "with existing ids, 'all', or cpu:N")
    assert check_devices(parse_devices("cpu:2")) == [torch.device("cpu")] * 2


def test_nccl_needs_cuda(tmp_path, db):
    param = _param(tmp_path, db, batch=B, name="nccl")
    with pytest.raises(SolverError, match=r"^reduction 'nccl' needs CUDA devices, got cpu, cpu"):
        ReplicatedRun(param, ["cpu"] * 2, TrainOptions(reduction="nccl"))


def test_channels_last_replicas_train_the_same(tmp_path, db):
    param = _param(tmp_path, db, batch=B, name="cl")
    param.memory_format = "CHANNELS_LAST"
    with ReplicatedRun(param, ["cpu"] * 2) as run:
        conv = run.root.net.layer_by_name("conv").blobs()[0]
        assert conv.is_contiguous(memory_format=torch.channels_last)
        assert all(h.is_contiguous(memory_format=torch.channels_last)
                   for h in run.root.updater.history if h.dim() == 4)
        run.run()
        got = _weights(run.root)
    assert _rel(got, _replicated(tmp_path, db, 2)[0]) < 1e-5


def test_resume_from_a_snapshot_continues_exactly(tmp_path, db):
    full = _param(tmp_path, db, batch=B, iters=6, snap="false", name="full")
    full.snapshot = 3
    with ReplicatedRun(full, ["cpu"] * 3) as run:
        run.run()
        whole = _weights(run.root)
    again = _param(tmp_path, db, batch=B, iters=6, snap="false", name="again")
    state = tmp_path / "full_snap_iter_3.solverstate.pt"
    with ReplicatedRun(again, ["cpu"] * 3, TrainOptions(snapshot=str(state))) as run:
        run.run()
        resumed = _weights(run.root)
        assert [s.iter for s in run.solvers] == [6, 6, 6]
    assert all(torch.equal(a, b) for a, b in zip(whole, resumed, strict=True))


def test_cpy_train_on_cpu_replicas(tmp_path, db):
    from click.testing import CliRunner

    from caffe_py.cli import cli

    _param(tmp_path, db, batch=B, name="cli_run")
    solver = str(tmp_path / "cli_run.yaml")
    result = CliRunner().invoke(cli, ["train", "--solver", solver, "--gpus", "cpu:2"])
    assert result.exit_code == 0, result.output
    assert "Batch: 4 per replica x 2 replicas x iter_size 1 = 8 per update" in result.output
    assert "reduction tree over 2 replica(s): root cpu#0" in result.output
    bad = CliRunner().invoke(cli, ["train", "--solver", solver, "--gpus", "cpu:2",
                                   "--reduction", "nccl"])
    assert bad.exit_code == 1
    assert bad.output.strip().splitlines()[-1] == (
        "Error: reduction 'nccl' needs CUDA devices, got cpu, cpu; use reduction 'tree' (the "
        "default) on CPU")


def test_out_of_memory_while_building_names_the_replica(tmp_path, db, monkeypatch):
    import caffe_py.parallel.replicated as replicated

    real = replicated.Solver

    def solver(*args, replica=0, **kw):
        if replica == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(*args, replica=replica, **kw)

    monkeypatch.setattr(replicated, "Solver", solver)
    with pytest.raises(SolverError) as err:
        ReplicatedRun(_param(tmp_path, db, batch=B, name="oom"), ["cpu"] * 3)
    assert str(err.value) == ("replica 2 (cpu): out of GPU memory; lower the net's batch_size "
                              "(each GPU runs the full batch) or use fewer/larger GPUs")


# --- lockstep: the root's thread issues every replica's iteration (used with CUDA graphs) --
def _lockstep_run(tmp_path, db, n, *, lockstep, **kw):
    param = _param(tmp_path, db, batch=B, name=f"ls{n}{lockstep}", **kw)
    with ReplicatedRun(param, ["cpu"] * n, tuning=Tuning(lockstep=lockstep)) as run:
        assert run.lockstep is lockstep
        assert isinstance(run.root.callbacks[0], LockstepRoot) is lockstep
        run.run()
        assert [s.iter for s in run.solvers] == [run.root.iter] * n
        return _weights(run.root), [_weights(s) for s in run.solvers[1:]]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_lockstep_equals_threads_bit_for_bit(tmp_path, db, n):
    got, workers = _lockstep_run(tmp_path, db, n, lockstep=True, transform=CROP_MIRROR)
    ref, _ = _lockstep_run(tmp_path, db, n, lockstep=False, transform=CROP_MIRROR)
    assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))
    if n <= 4:
        assert _rel(got, _single(tmp_path, db, n, transform=CROP_MIRROR)) < 1e-5


def test_lockstep_with_iter_size_and_adam(tmp_path, db):
    got, _ = _lockstep_run(tmp_path, db, 3, lockstep=True, iter_size=2, type_="Adam")
    ref, _ = _lockstep_run(tmp_path, db, 3, lockstep=False, iter_size=2, type_="Adam")
    assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))


def test_top_down_puts_parents_first():
    sync = TreeSync(["cpu"] * 5, tree=build_tree(5, [[True] * 5] * 5))
    order = top_down(sync)
    assert sorted(order) == [1, 2, 3, 4]
    for i in order:
        parent = sync.tree.parent(i)
        assert parent == 0 or order.index(parent) < order.index(i)


def test_default_is_off_on_cpu_even_with_graphs(tmp_path, db):
    param = _param(tmp_path, db, batch=B, name="default")
    with ReplicatedRun(param, ["cpu"] * 2, TrainOptions(graphs="on")) as run:
        assert run.lockstep is False
