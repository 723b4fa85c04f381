"""Two hosts on loopback (two processes, gloo), each with cpu:2 replicas, train what one process
with cpu:4 and one replica with 4 x the batch train; rank 0 alone snapshots; mismatched replica
counts and a failing rank end every process with an error naming the rank, never a hang."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from support import snapshot_names

from caffe_py.devices import world_size
from caffe_py.io import feed_of
from caffe_py.parallel import HostSlice, ReplicatedRun
from caffe_py.solver.roles import HOST_ROOT
from caffe_py.solver.snapshot import load_weights
from caffe_py.solver.solver import Solver
from caffe_py.spec.solver_spec import load_solver

B, ITERS = 4, 6
CLI = Path(__file__).resolve().parents[2] / "cli.py"
SOLVER = """
net_param:
  name: tiny
  layer:
    - {{name: data, type: Data, top: [data, label],
       transform_param: {{scale: 0.00390625, crop_size: 4, mirror: true}},
       data_param: {{source: {db}, batch_size: {batch}}}}}
    - {{name: conv, type: Convolution, bottom: data, top: conv,
       convolution_param: {{num_output: 2, kernel_size: 3, weight_filler: {{type: xavier}},
                           bias_filler: {{type: constant, value: 0.1}}}}}}
    - {{name: ip, type: InnerProduct, bottom: conv, top: ip,
       inner_product_param: {{num_output: 3, weight_filler: {{type: xavier}}}}}}
    - {{name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}}
type: SGD
base_lr: 0.1
momentum: 0.9
weight_decay: 0.001
lr_policy: inv
gamma: 0.01
power: 0.75
max_iter: {iters}
display: 2
random_seed: 7
solver_mode: CPU
snapshot: {snapshot}
snapshot_after_train: true
snapshot_prefix: {prefix}
"""
# One host's process, as `cpy train` runs it, that also saves its root's weights (every rank)
# and can make one of its workers fail at an iteration.
DRIVER = textwrap.dedent("""
    import logging, os, sys, torch
    from caffe_py.devices import parse_devices
    from caffe_py.errors import CaffePyError
    from caffe_py.options import TrainOptions
    from caffe_py.solver.solver import Solver
    from caffe_py.spec.solver_spec import load_solver
    from caffe_py.train import train
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    solver_file, gpus, out = sys.argv[1:4]
    rank = int(os.environ["RANK"])
    if os.environ.get("FAIL_RANK") == str(rank):
        real = Solver.forward_backward
        def failing(self):
            if self.replica == 1 and self.iter == 2:
                raise RuntimeError("injected")
            return real(self)
        Solver.forward_backward = failing
    if os.environ.get("SIGNAL_RANK") == str(rank):  # "snapshot" at the 2nd poll, "stop" at the 4th
        from caffe_py.solver.signals import SignalHandler
        polls = []
        def requested(self):
            polls.append(1)
            return {2: "snapshot", 4: "stop"}.get(len(polls), "none")
        SignalHandler.requested_action = requested
    try:
        root = train(load_solver(solver_file), parse_devices(gpus),
                     TrainOptions(dist_timeout=20))
    except CaffePyError as exc:
        print(f"Error: {exc}", flush=True)
        sys.exit(1)
    torch.save([lp.param.detach() for lp in root.net.learnable_params()],
               f"{out}/rank{rank}.pt")
    print(f"rank {rank} ended at iteration {root.iter}", flush=True)
""")


def _solver_file(tmp_path, db, *, batch=B, iters=ITERS, snapshot=0, name="s") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(SOLVER.format(db=db, batch=batch, iters=iters, snapshot=snapshot,
                                  prefix=tmp_path / name / "snap"))
    (tmp_path / name).mkdir(exist_ok=True)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_hosts(argvs, *, extra_env=None, timeout=90.0) -> list[tuple[int, str]]:
    """Run argvs[r] as rank r of 2 on loopback; (exit status, output) per rank."""
    port = _free_port()
    procs = []
    for rank, argv in enumerate(argvs):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": "0",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               **(extra_env or {})}
        procs.append(subprocess.Popen([sys.executable, *argv], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    out = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            out.append((p.returncode, text))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def _weights(solver):
    return [lp.param.detach().clone() for lp in solver.net.learnable_params()]


def _rel(a, b):
    return max(((x - y).norm() / y.norm()).item() for x, y in zip(a, b, strict=True))


@pytest.mark.timeout(120)
def test_two_hosts_of_two_equal_one_host_of_four_and_one_replica_of_4b(tmp_path, db):
    solver = _solver_file(tmp_path, db)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    runs = _two_hosts([[str(driver), str(solver), "cpu:2", str(tmp_path)]] * 2)
    assert [rc for rc, _ in runs] == [0, 0], runs
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", map_location="cpu") for r in (0, 1))
    # every root applied the same update to the same weights
    assert all(torch.equal(a, b) for a, b in zip(rank0, rank1, strict=True))
    with ReplicatedRun(load_solver(solver), ["cpu"] * 4) as run:
        run.run()
        four = _weights(run.root)
    with Solver(load_solver(_solver_file(tmp_path, db, batch=4 * B, name="big"))) as single:
        single.solve()
        big = _weights(single)
    start = _weights(Solver(load_solver(solver)))
    assert _rel(rank0, start) > 1e-3      # it trained
    assert _rel(rank0, four) < 1e-5
    assert _rel(rank0, big) < 1e-5


@pytest.mark.timeout(120)
def test_cpy_train_on_two_hosts_rank_0_alone_snapshots_and_resumes(tmp_path, db):
    solver = _solver_file(tmp_path, db, snapshot=3)
    argv = [str(CLI), "train", "--solver", str(solver), "--gpus", "cpu:2", "--dist-timeout", "20"]
    (rc0, out0), (rc1, out1) = _two_hosts([argv, argv])
    assert (rc0, rc1) == (0, 0), out0 + out1
    assert ("World: 2 hosts x 2 replicas per host = 4 replicas (backend gloo, rank 0 leads); "
            "effective batch 4 x 4 replicas x iter_size 1 = 16") in out0
    assert "rank 1 of 2: global replicas 2..3 on cpu, cpu" in out1
    assert out0.count("Snapshotting to") == 2 and "Snapshotting" not in out1
    assert "Iteration" not in out1 and "Testing" not in out1
    snaps = tmp_path / "s"
    assert snapshot_names(snaps) == [
        "snap_iter_3.pt", "snap_iter_3.solverstate.pt",
        "snap_iter_6.pt", "snap_iter_6.solverstate.pt"]
    straight = load_weights(snaps / "snap_iter_6.pt")
    # both hosts resume from rank 0's state at iteration 3 (global data positions)
    (snaps / "snap_iter_6.pt").unlink()
    resume = [*argv, "--snapshot", str(snaps / "snap_iter_3.solverstate.pt")]
    (rc0, out0), (rc1, out1) = _two_hosts([resume, resume])
    assert (rc0, rc1) == (0, 0), out0 + out1
    resumed = load_weights(snaps / "snap_iter_6.pt")
    assert _rel(sum(resumed.values(), []), sum(straight.values(), [])) < 1e-6, out0


@pytest.mark.timeout(120)
def test_a_signal_on_rank_1_acts_on_every_host_after_the_same_iteration(tmp_path, db):
    """Rank 1's SIGHUP (snapshot) at its 2nd iteration is written by rank 0; its SIGINT (stop)
    at the 4th stops both hosts after iteration 4, with identical weights."""
    solver = _solver_file(tmp_path, db, iters=50)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    (rc0, out0), (rc1, out1) = _two_hosts([[str(driver), str(solver), "cpu:2", str(tmp_path)]] * 2,
                                          extra_env={"SIGNAL_RANK": "1"})
    assert (rc0, rc1) == (0, 0), out0 + out1
    assert "rank 0 ended at iteration 4" in out0 and "rank 1 ended at iteration 4" in out1
    assert "Optimization stopped early." in out0
    assert snapshot_names(tmp_path / "s") == [
        "snap_iter_2.pt", "snap_iter_2.solverstate.pt",
        "snap_iter_4.pt", "snap_iter_4.solverstate.pt"]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", map_location="cpu") for r in (0, 1))
    assert all(torch.equal(a, b) for a, b in zip(rank0, rank1, strict=True))


@pytest.mark.timeout(60)
def test_hosts_with_different_replica_counts_fail_naming_the_counts(tmp_path, db):
    solver = _solver_file(tmp_path, db)
    argv = [str(CLI), "train", "--solver", str(solver), "--dist-timeout", "20", "--gpus"]
    runs = _two_hosts([[*argv, "cpu:2"], [*argv, "cpu:3"]])
    line = ("every host must run the same number of replicas: rank 0 has 2, rank 1 has 3; "
            "give each host's --gpus the same count")
    for rank, (rc, out) in enumerate(runs):
        assert rc == 1
        assert f"Error: rank {rank} of 2: {line}" in out.splitlines(), out
        assert "Traceback" not in out


@pytest.mark.timeout(60)
def test_hosts_with_different_nets_fail_naming_the_sizes(tmp_path, db):
    solver = _solver_file(tmp_path, db)
    other = tmp_path / "other.yaml"
    other.write_text(solver.read_text().replace("num_output: 3", "num_output: 4"))
    argv = [str(CLI), "train", "--gpus", "cpu:1", "--dist-timeout", "20", "--solver"]
    runs = _two_hosts([[*argv, str(solver)], [*argv, str(other)]])
    line = ("rank 1's net differs from rank 0's: learnable blobs #2 is [4, 8] there, [3, 8] on "
            "rank 0; every host must train the same net")
    for rank, (rc, out) in enumerate(runs):
        assert rc == 1
        assert f"Error: rank {rank} of 2: {line}" in out.splitlines(), out


@pytest.mark.timeout(90)
def test_a_failing_rank_ends_every_process_with_an_error_naming_its_rank(tmp_path, db):
    solver = _solver_file(tmp_path, db, iters=50)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    started = time.monotonic()
    (rc0, out0), (rc1, out1) = _two_hosts([[str(driver), str(solver), "cpu:2", str(tmp_path)]] * 2,
                                          extra_env={"FAIL_RANK": "1"})
    assert time.monotonic() - started < 45    # the peer's exit breaks the collective
    assert (rc0, rc1) == (1, 1)
    assert "Error: rank 1 of 2: replica 1 (cpu) failed: RuntimeError: injected" in out1, out1
    assert "Error: rank 0 of 2: " in out0, out0
    assert "another rank failed, stopped or timed out: see its log" in out0, out0


def test_world_size_unset_or_one_keeps_the_single_process_path(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert world_size() == 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert world_size() == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert world_size() == 2


def test_a_stop_between_iterations_waits_for_the_next_iterations_flags(monkeypatch):
    """Rank 0's test phase polls signals outside an iteration: a snapshot is taken at once, a
    stop is deferred to the next iteration's flag all-reduce (so every host stops with it)."""
    import torch.distributed as dist

    from caffe_py.parallel.multihost import Hosts, HostSync

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        requests = iter(["snapshot", "stop", "none", "none"])
        sync = HostSync(Hosts(0, 1, 1, "gloo", 10.0), None, lambda: next(requests), 1.0)
        assert sync.action() == "snapshot"     # between iterations: now, on rank 0
        assert sync.action() == "none"         # the stop is deferred...
        sync.on_start()
        assert sync.action() == "stop"         # ...to the end of the next iteration
        sync.on_start()
        assert sync.action() == "none"
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 GPUs")
@pytest.mark.timeout(180)
def test_two_processes_over_nccl_equal_one_process_on_the_same_gpus(tmp_path, db):
    """Two "hosts" on one machine (rank r trains on GPU r, NCCL between the processes) against
    one process with --gpus 0,1: the same weights."""
    solver = _solver_file(tmp_path, db)
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    runs = _two_hosts([[str(driver), str(solver), str(r), str(tmp_path)] for r in (0, 1)])
    assert [rc for rc, _ in runs] == [0, 0], runs
    assert "backend nccl" in runs[0][1]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", map_location="cpu") for r in (0, 1))
    assert all(torch.equal(a, b) for a, b in zip(rank0, rank1, strict=True))
    with ReplicatedRun(load_solver(solver), ["cuda:0", "cuda:1"]) as run:
        run.run()
        one = _weights(run.root)
    assert _rel(rank0, [w.cpu() for w in one]) < 1e-4


def test_a_hosts_replicas_take_global_seeds_and_record_slices(tmp_path, db):
    """Rank 1 of 2 with 2 replicas: global replicas 2 and 3 (seeds 7 + 2, 7 + 3; Data feeds
    the run's seed 7), the reader's slice 2..3 of 4, an unscaled local root, and a root that
    neither tests nor displays."""
    param = load_solver(_solver_file(tmp_path, db))
    with ReplicatedRun(param, ["cpu", "cpu"], hosts=HostSlice(2, 4, lead=False)) as run:
        assert [s.seeds.model for s in run.solvers] == [9, 10]
        assert [feed_of(s.net.data_layers()[0]).transformer.seed for s in run.solvers] == [7, 7]
        assert (run.pool.replica_offset, run.pool.total_replicas) == (2, 4)
        assert run.sync.root_scale is False
        assert run.root.role == HOST_ROOT
        assert (run.root.role.reports, run.root.test_nets, run.root.role.applies_updates) == (
            False, [], True)
