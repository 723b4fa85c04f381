"""Decode workers: parts in record order, the first failure by record order as one line,
close() joins every thread, and the options' automatic defaults and environment."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from caffe_py.errors import DataError
from caffe_py.io.decoders import libjpeg
from caffe_py.io.decoders import workers as workers_module
from caffe_py.io.decoders.workers import DecodeOptions, DecodeWorkers


@pytest.fixture
def pool():
    pool = DecodeWorkers(3, "test")
    pool.start()
    yield pool
    pool.close()


def test_parts_cover_every_record_once_and_run_on_the_threads(pool):
    out = np.full(50, -1)
    names = set()

    def part(start, stop):
        names.add(threading.current_thread().name)
        time.sleep(0.001 * (start % 3))  # parts finish out of order
        out[start:stop] = np.arange(start, stop)

    pool.run(part, 50, where="db")
    assert out.tolist() == list(range(50))
    assert names <= {"cpy-test:0", "cpy-test:1", "cpy-test:2"} and len(names) >= 2


def test_one_worker_decodes_in_the_calling_thread():
    pool = DecodeWorkers(1)
    pool.start()
    seen = []
    pool.run(lambda a, b: seen.append((a, b, threading.current_thread().name)), 7, where="db")
    assert seen == [(0, 7, threading.current_thread().name)] and pool.threads == []
    pool.close()


def test_the_first_failure_by_record_order_is_raised_after_all_parts(pool):
    done = []

    def part(start, stop):
        done.append(start)
        if start >= 10:
            raise DataError(f"db: record {start} is bad")

    with pytest.raises(DataError, match=r"^db: record 10 is bad$"):
        pool.run(part, 30, where="db")
    assert sorted(done) == [0, 5, 10, 15, 20, 25]  # 6 parts: 2 per worker, all ran


def test_an_unexpected_error_becomes_one_line_naming_the_database(pool):
    def part(start, stop):
        raise TypeError("bad\nthing")

    with pytest.raises(DataError) as err:
        pool.run(part, 8, where="/data/db")
    assert str(err.value) == "/data/db: decoding failed (TypeError: bad thing)"


def test_close_joins_the_threads_and_a_later_run_raises():
    before = threading.active_count()
    pool = DecodeWorkers(4, "t")
    pool.start()
    assert threading.active_count() == before + 4
    pool.close()
    assert threading.active_count() == before
    with pytest.raises(DataError, match="db: the decode workers were closed"):
        pool.run(lambda a, b: None, 10, where="db")


def test_a_run_waiting_when_the_pool_closes_raises(pool):
    release = threading.Event()
    errors = []

    def caller():
        try:
            pool.run(lambda a, b: release.wait(5), 6, where="db")
        except DataError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=caller)
    thread.start()
    time.sleep(0.05)
    pool._stop.set()  # close() as the reader pool calls it, before the parts finish
    thread.join(2)
    release.set()
    assert errors == ["db: the decode workers were closed"]


def test_options_resolve_the_automatic_count(monkeypatch):
    monkeypatch.setattr(libjpeg, "installed", lambda: False)  # PIL's threads
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 16)
    assert DecodeOptions().threads == 4
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 5)
    assert DecodeOptions().threads == 3
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 2)
    assert DecodeOptions().threads == 1
    assert DecodeOptions(workers=5).threads == 5


def test_options_resolve_the_decode_processes(monkeypatch):
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 10)
    assert DecodeOptions().use_processes and DecodeOptions().process_count == 8
    assert DecodeOptions(3).process_count == 3
    assert not DecodeOptions(processes="off").use_processes
    monkeypatch.setattr(workers_module, "usable_cores", lambda: 9)
    assert not DecodeOptions().use_processes
    assert DecodeOptions(processes="on").use_processes
    assert DecodeOptions.from_env({"CPY_DECODE_PROCESSES": "On"}).processes == "on"
    with pytest.raises(DataError, match=r"^CPY_DECODE_PROCESSES='2' is not one of auto, on, "
                                        r"off; unset it for auto$"):
        DecodeOptions.from_env({"CPY_DECODE_PROCESSES": "2"})


def test_options_from_the_environment():
    assert DecodeOptions.from_env({}) == DecodeOptions(None, "auto")
    assert DecodeOptions.from_env({"CPY_DECODE_WORKERS": "auto", "CPY_GPU_DECODE": ""}) == \
        DecodeOptions(None, "auto")
    assert DecodeOptions.from_env({"CPY_DECODE_WORKERS": " 6 ", "CPY_GPU_DECODE": "OFF"}) == \
        DecodeOptions(6, "off")
    with pytest.raises(DataError, match=r"^CPY_DECODE_WORKERS='x' is not a worker count; set "
                                        r"a whole number >= 1, or auto$"):
        DecodeOptions.from_env({"CPY_DECODE_WORKERS": "x"})
    with pytest.raises(DataError, match="CPY_DECODE_WORKERS='0' is not a worker count"):
        DecodeOptions.from_env({"CPY_DECODE_WORKERS": "0"})
    with pytest.raises(DataError, match=r"^CPY_GPU_DECODE='yes' is not one of auto, on, off; "
                                        r"unset it for auto$"):
        DecodeOptions.from_env({"CPY_GPU_DECODE": "yes"})
    with pytest.raises(DataError, match="GPU decode must be one of auto, on, off"):
        DecodeOptions(gpu="gpu")
