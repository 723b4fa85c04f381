"""The averaging points of a run and when signals are acted on."""
from __future__ import annotations

from caffe_py.parallel.schedule import CODES, Actions, Schedule


def _points(schedule: Schedule, kind: str, upto: int = 40) -> list[int]:
    return [t for t in range(1, upto + 1) if getattr(schedule, kind)(t)]


def test_replicas_average_every_k_and_at_tests_snapshots_and_the_end():
    s = Schedule(local=8, test_interval=12, snapshot=30, max_iter=37)
    assert _points(s, "local_point") == [8, 12, 16, 24, 30, 32, 36, 37, 40]
    assert _points(s, "host_point") == []                  # one host
    assert not s.averages_hosts and s.averages_replicas


def test_host_points_are_local_points_too():
    s = Schedule(local=4, host=16, hosts=2, host_async=True, test_interval=10, max_iter=40)
    assert _points(s, "host_point") == [10, 16, 20, 30, 32, 40]
    assert _points(s, "local_point") == [4, 8, 10, 12, 16, 20, 24, 28, 30, 32, 36, 40]
    assert [t for t in _points(s, "host_point") if s.blocking(t)] == [10, 20, 30, 40]


def test_with_host_period_0_the_hosts_join_every_local_average_synchronously():
    s = Schedule(local=3, hosts=2, max_iter=10)
    assert _points(s, "host_point", 10) == [3, 6, 9, 10]
    assert all(s.blocking(t) for t in range(1, 11))


def test_replicas_that_sum_gradients_leave_only_host_points():
    s = Schedule(host=5, hosts=3, max_iter=12)
    assert _points(s, "local_point", 12) == []
    assert _points(s, "host_point", 12) == [5, 10, 12]
    assert not Schedule(host=5, hosts=1).averages_hosts     # one host: nothing to average
    assert not Schedule(hosts=4).averages_hosts             # gradients every iteration


def test_actions_are_acted_on_at_points_only():
    requests = iter(["snapshot", "none", "stop", "none", "none", "none", "none", "none"])
    actions = Actions(lambda: next(requests))
    actions.between_points()
    assert actions() == "none"                 # the snapshot waits for a point...
    actions.at_point(actions.take())
    assert actions() == "snapshot"             # ...and comes with it
    actions.between_points()
    assert actions() == "none"
    actions.at_point(actions.take())
    assert actions() == "stop"


def test_between_iterations_a_snapshot_is_taken_at_once_and_a_stop_waits():
    requests = iter(["snapshot", "stop", "none", "none"])
    actions = Actions(lambda: next(requests))
    assert actions() == "snapshot"
    assert actions() == "none"
    assert actions.take() == CODES["stop"]


def test_only_rank_0_snapshots():
    actions = Actions(lambda: "snapshot", rank=1)
    actions.at_point(CODES["snapshot"])
    assert actions() == "none"
    actions.at_point(CODES["stop"])
    assert actions() == "stop"
