"""Launchers: a list of calls run at once, the first in the caller's thread, errors in order."""
from __future__ import annotations

import threading
import time

import pytest

from caffe_py.parallel.launchers import Launchers


def test_calls_run_at_once_the_first_in_the_callers_thread():
    n = 4
    arrived = threading.Barrier(n, timeout=10)   # breaks unless all four run at the same time
    threads: list[str | None] = [None] * n

    def call(k: int) -> None:
        threads[k] = threading.current_thread().name
        arrived.wait()

    launchers = Launchers("t")
    try:
        for _ in range(2):
            launchers.run([lambda k=k: call(k) for k in range(n)])
            assert threads[0] == threading.current_thread().name
            assert len(set(threads)) == n
            assert all(name.startswith("t_") for name in threads[1:])
    finally:
        launchers.close()


def test_the_first_error_in_list_order_is_raised_after_every_call_returned():
    finished: list[int] = []

    def slow_ok() -> None:
        time.sleep(0.2)
        finished.append(3)

    def fail(k: int) -> None:
        finished.append(k)
        raise ValueError(f"call {k}")

    def root_fails() -> None:
        raise KeyError("root")

    launchers = Launchers()
    try:
        with pytest.raises(ValueError, match="call 1"):
            launchers.run([lambda: None, lambda: fail(1), lambda: fail(2), slow_ok])
        assert sorted(finished) == [1, 2, 3]
        finished.clear()
        with pytest.raises(KeyError, match="root"):
            launchers.run([root_fails, lambda: fail(1), lambda: fail(2), slow_ok])
        assert sorted(finished) == [1, 2, 3]   # the caller's error waited for every worker
    finally:
        launchers.close()


def test_one_call_runs_inline_and_a_new_count_makes_new_workers():
    launchers = Launchers("c")
    seen: list[str] = []
    launchers.run([lambda: seen.append(threading.current_thread().name)])
    assert seen == [threading.current_thread().name]
    assert launchers._pool is None
    launchers.run([lambda: None, lambda: seen.append(threading.current_thread().name)])
    assert launchers._workers == 1 and seen[-1].startswith("c_")
    launchers.run([lambda: None] * 3)
    assert launchers._workers == 2
    launchers.close()
    assert launchers._pool is None and launchers._workers == 0
    launchers.run([])   # nothing to run: returns
