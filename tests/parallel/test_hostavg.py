"""The hosts' model exchange: synchronous averaging, the asynchronous fold (a delta one period
late), the signal codes that ride along; on fake hosts in threads, then two real processes
over gloo (equal to one process, resume bit for bit in every mode, signals)."""
from __future__ import annotations

import threading

import pytest
import torch
from support import snapshot_names
from test_multihost import DRIVER, _rel, _solver_file, _two_hosts, _weights

from caffe_py.parallel import ReplicatedRun
from caffe_py.parallel.hostavg import HostExchange
from caffe_py.parallel.schedule import CODES, Schedule
from caffe_py.solver.snapshot import load_weights
from caffe_py.spec.solver_spec import load_solver


class FakeHosts:
    """H hosts in one process: a SUM all-reduce meets in ``wait`` (a barrier), over what each
    host sent when it called ``all_reduce``."""

    def __init__(self, n: int):
        self.n = n
        self.sent: dict[int, torch.Tensor] = {}
        self.meet = threading.Barrier(n, timeout=10)

    def member(self, rank: int) -> _Member:
        return _Member(self, rank)


class _Member:
    def __init__(self, hosts: FakeHosts, rank: int):
        self.hosts, self.rank = hosts, rank

    def all_reduce(self, tensor: torch.Tensor, async_op: bool = False):
        work = _Work(self.hosts, self.rank, tensor)
        if async_op:
            return work
        work.wait()
        return None


class _Work:
    def __init__(self, hosts: FakeHosts, rank: int, tensor: torch.Tensor):
        self.hosts, self.rank, self.tensor, self.data = hosts, rank, tensor, tensor.clone()

    def wait(self) -> None:
        self.hosts.sent[self.rank] = self.data
        self.hosts.meet.wait()
        total = sum(self.hosts.sent[r] for r in range(self.hosts.n))
        self.hosts.meet.wait()
        self.tensor.copy_(total)


def _on_hosts(n, script):
    """Run ``script(rank)`` on n fake hosts, one thread each; their results by rank."""
    out: dict[int, object] = {}
    errors: list[BaseException] = []

    def run(rank):
        try:
            out[rank] = script(rank)
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    if errors:
        raise errors[0]
    return [out[r] for r in range(n)]


# host r's model: x0 = [r, 2r, 3r] (integers: every sum and half is exact); it then moves by
# d_r = [1, 0, r] per period
X0 = [torch.tensor([1.0, 2.0, 3.0]) * r for r in range(2)]
D = [torch.tensor([1.0, 0.0, float(r)]) for r in range(2)]


def _exchange(hosts, rank, schedule):
    return HostExchange(2, schedule, 3, X0[0], hosts.member(rank))


def test_synchronous_exchange_leaves_every_host_at_the_average():
    hosts, schedule = FakeHosts(2), Schedule(host=4, hosts=2, max_iter=100)

    def script(rank):
        x = X0[rank].clone()
        agreed = _exchange(hosts, rank, schedule).exchange(x, 4, 0)
        return x, agreed

    (x0, a0), (x1, a1) = _on_hosts(2, script)
    assert x0.tolist() == x1.tolist() == [0.5, 1.0, 1.5] and a0 == a1 == 0


def test_async_exchange_folds_the_average_in_one_period_late_as_a_delta():
    """x <- x + (mean of what the hosts sent - what this host sent), at the next point."""
    hosts, schedule = FakeHosts(2), Schedule(host=4, hosts=2, host_async=True, max_iter=100)

    def script(rank):
        ex, x = _exchange(hosts, rank, schedule), X0[rank].clone()
        seen = []
        for t in (4, 8, 12):
            assert ex.exchange(x, t, 0) == 0
            seen.append(x.clone())
            x += D[rank]                              # a period of training
        return seen, ex.waited

    (a, waited_a), (b, waited_b) = _on_hosts(2, script)
    # t=4: nothing to fold yet, the exchange is in flight
    assert a[0].tolist() == X0[0].tolist() and b[0].tolist() == X0[1].tolist()
    # t=8: sent x0 (mean [0.5, 1, 1.5]); each keeps its own period's progress d_r
    assert a[1].tolist() == [1.5, 1.0, 1.5]          # [0,0,0] + d_0 + (mean - [0,0,0])
    assert b[1].tolist() == [1.5, 1.0, 2.5]          # [1,2,3] + d_1 + (mean - [1,2,3])
    # t=12: the means of what was sent at 8, plus the progress since
    assert a[2].tolist() == [2.5, 1.0, 2.0] and b[2].tolist() == [2.5, 1.0, 3.0]
    assert waited_a == waited_b == 0                 # no exchange was waited for at once


def test_a_sync_point_folds_the_exchange_in_flight_then_averages_at_once():
    hosts = FakeHosts(2)
    schedule = Schedule(host=4, hosts=2, host_async=True, test_interval=8, max_iter=100)

    def script(rank):
        ex, x = _exchange(hosts, rank, schedule), X0[rank].clone()
        ex.exchange(x, 4, 0)
        x += D[rank]
        ex.exchange(x, 8, 0)                          # a test point: blocking
        return x, ex.work

    (a, work_a), (b, work_b) = _on_hosts(2, script)
    assert a.tolist() == b.tolist() == [1.5, 1.0, 2.0]     # mean + mean progress, all equal
    assert work_a is None and work_b is None               # nothing left in flight


def test_a_stop_asked_on_one_host_reaches_every_host_and_makes_the_point_blocking():
    hosts, schedule = FakeHosts(2), Schedule(host=4, hosts=2, host_async=True, max_iter=100)

    def script(rank):
        ex, x = _exchange(hosts, rank, schedule), X0[rank].clone()
        first = ex.exchange(x, 4, CODES["stop"] if rank == 1 else 0)
        x += D[rank]
        second = ex.exchange(x, 8, 0)     # the codes sent at 4 arrive: stop, synchronously
        return first, second, x

    (f0, s0, a), (f1, s1, b) = _on_hosts(2, script)
    assert (f0, f1) == (0, 0) and s0 == s1 == CODES["stop"]
    assert a.tolist() == b.tolist() == [1.5, 1.0, 2.0]


def test_a_snapshot_asked_synchronously_is_agreed_at_once():
    hosts, schedule = FakeHosts(2), Schedule(host=4, hosts=2, max_iter=100)

    def script(rank):
        x = X0[rank].clone()
        return _exchange(hosts, rank, schedule).exchange(x, 4, CODES["snapshot"] * rank)

    assert _on_hosts(2, script) == [CODES["snapshot"]] * 2


# --- two processes over gloo --------------------------------------------------------------
MODES = {
    "replicas average, hosts join": "model_average_period: 1\n",
    "replicas sum, hosts average": "host_average_period: 1\n",
}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", list(MODES))
def test_averaging_every_iteration_on_two_hosts_equals_one_process_of_four(tmp_path, db, mode):
    solver = _solver_file(tmp_path, db)
    solver.write_text(solver.read_text() + MODES[mode])
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    runs = _two_hosts([[str(driver), str(solver), "cpu:2", str(tmp_path)]] * 2)
    assert [rc for rc, _ in runs] == [0, 0], runs
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", map_location="cpu") for r in (0, 1))
    assert all(torch.equal(a, b) for a, b in zip(rank0, rank1, strict=True))
    with ReplicatedRun(load_solver(_solver_file(tmp_path, db, name="one")), ["cpu"] * 4) as run:
        run.run()
        four = _weights(run.root)
    assert _rel(rank0, four) < 1e-5
    assert "hosts: models averaged" in runs[0][1]


RESUME_MODES = {
    "hosts sync": "host_average_period: 2\n",
    "hosts async": "host_average_period: 2\nhost_average_async: true\n",
    "replicas and hosts async": ("model_average_period: 2\nhost_average_period: 4\n"
                                 "host_average_async: true\n"),
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", list(RESUME_MODES))
def test_resume_on_two_hosts_is_bit_exact(tmp_path, db, mode):
    """8 iterations straight, and 3 + resume + 5 (3 is no multiple of any period: the
    snapshot makes it a sync point in both runs), give the same weights bit for bit."""
    solver = _solver_file(tmp_path, db, iters=8, snapshot=3)
    solver.write_text(solver.read_text() + RESUME_MODES[mode])
    argv = ["cli.py", "train", "--solver", str(solver), "--gpus", "cpu:2", "--dist-timeout",
            "20"]
    (rc0, out0), (rc1, out1) = _two_hosts([argv, argv])
    assert (rc0, rc1) == (0, 0), out0 + out1
    snaps = tmp_path / "s"
    straight = load_weights(snaps / "snap_iter_8.pt")
    (snaps / "snap_iter_8.pt").unlink()
    resume = [*argv, "--snapshot", str(snaps / "snap_iter_3.solverstate.pt")]
    (rc0, out0), (rc1, out1) = _two_hosts([resume, resume])
    assert (rc0, rc1) == (0, 0), out0 + out1
    resumed = load_weights(snaps / "snap_iter_8.pt")
    assert all(torch.equal(a, b) for name in straight
               for a, b in zip(straight[name], resumed[name], strict=True))


@pytest.mark.timeout(180)
def test_a_signal_on_rank_1_with_async_hosts_stops_both_at_a_point(tmp_path, db):
    """Rank 1 asks for a snapshot (its 2nd poll, iteration 2) and a stop (its 4th, right
    after the host point 3): the snapshot code travels with the asynchronous exchange of 3 and
    arrives at 6, which makes 6 a synchronous exchange, and that one carries the stop: both
    hosts stop after iteration 6 (a stop outranks a snapshot; the final snapshot is written)
    with identical weights."""
    solver = _solver_file(tmp_path, db, iters=50)
    solver.write_text(solver.read_text() + "host_average_period: 3\nhost_average_async: true\n")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    (rc0, out0), (rc1, out1) = _two_hosts([[str(driver), str(solver), "cpu:2", str(tmp_path)]] * 2,
                                          extra_env={"SIGNAL_RANK": "1"})
    assert (rc0, rc1) == (0, 0), out0 + out1
    assert "rank 0 ended at iteration 6" in out0 and "rank 1 ended at iteration 6" in out1
    assert "Optimization stopped early." in out0
    assert snapshot_names(tmp_path / "s") == [
        "snap_iter_6.pt", "snap_iter_6.solverstate.pt"]
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt", map_location="cpu") for r in (0, 1))
    assert all(torch.equal(a, b) for a, b in zip(rank0, rank1, strict=True))
