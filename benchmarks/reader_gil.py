"""How fast the reader hands over an LMDB's stored image files while other threads of the
training process keep the GIL busy: each cursor step (py-lmdb gives up the GIL around it)
against the first pass's index of where the files lie (no record read), in the same run.

    python benchmarks/make_imagenet_lmdb.py /tmp/cpy_imagenet --images 4096
    python benchmarks/reader_gil.py /tmp/cpy_imagenet/jpeg_lmdb --save docs/data_pipeline.md

The reader runs as for the decode processes (the files left in the database: the records'
keys and spans handed over, nothing decoded); ``--replicas`` threads take its batches and
count them, and ``--busy`` other threads each run Python half the time (0.2 ms bursts), as
the feeds, the pool's threads and the training loop of a many-GPU run hold the GIL in turns
(about half the time on a 4 x H200 host: docs/data_pipeline.md). Reported: records a
second handed over (the index's first pass untimed). With ``--busy 0`` the reader's own
speed; with busy threads each GIL hand-back waits its turn.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import platform
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from data_pipeline import save  # noqa: E402
from decode_host_cost import record_shape  # noqa: E402

import caffe_py.io.reader.reader as reader_module  # noqa: E402
from caffe_py.io import ReaderPool  # noqa: E402
from caffe_py.io.db.lmdb_store import LmdbReader  # noqa: E402
from caffe_py.io.decoders.workers import DecodeOptions, usable_cores  # noqa: E402
from caffe_py.io.reader import FeedSpec  # noqa: E402

BURST_S = 0.0002
"""A busy thread runs Python this long, then sleeps as long (the GIL held half the time)."""
FIRST_PASS_S = 120.0
"""The most the index's first pass may take before the timed part starts anyway."""
MODES = ("cursor", "index")
"""cursor: every pass reads the records; index: passes after the first take the index."""


@contextlib.contextmanager
def _settings(mode: str) -> Iterator[None]:
    """The files left in the LMDB, no database kept decoded, and the index on or off; as
    they were afterwards."""
    saved = (LmdbReader.rereadable, reader_module.CACHE_BYTES,
             reader_module.STORED_INDEX_RECORDS)
    LmdbReader.rereadable, reader_module.CACHE_BYTES = True, 0
    reader_module.STORED_INDEX_RECORDS = 0 if mode == "cursor" else saved[2]
    try:
        yield
    finally:
        (LmdbReader.rereadable, reader_module.CACHE_BYTES,
         reader_module.STORED_INDEX_RECORDS) = saved


def measure(db: str, mode: str, replicas: int, batch: int, busy: int, seconds: float,
            warmup: float) -> dict:
    """Records a second the reader hands ``replicas`` consumers beside ``busy`` threads."""
    shape = record_shape(db)
    counts = [0] * replicas
    stop = threading.Event()
    errors: list[BaseException] = []
    with _settings(mode), ReaderPool(replicas, decode=DecodeOptions(
            2, "off", processes="on")) as pool:
        queues = [pool.subscribe(FeedSpec(db, batch, 4, shape, encoded=True), "TRAIN/data",
                                 replica=r, seed=0) for r in range(replicas)]
        pool.start()

        def take(r: int) -> None:
            try:
                while not stop.is_set():
                    queues[r].get_batch(batch)
                    queues[r].mark_consumed(batch)
                    counts[r] += batch
            except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
                if not stop.is_set():  # (after it: the reader closed under a waiting take)
                    errors.append(exc)
                stop.set()

        def spin() -> None:   # the GIL held half the time, in bursts of BURST_S
            while not stop.is_set():
                until = time.perf_counter() + BURST_S
                while time.perf_counter() < until:
                    pass
                time.sleep(BURST_S)

        threads = [threading.Thread(target=take, args=(r,), daemon=True)
                   for r in range(replicas)]
        threads += [threading.Thread(target=spin, daemon=True) for _ in range(busy)]
        for thread in threads:
            thread.start()

        def indexed() -> bool:
            return any(stream.stored is not None and stream.stored.complete
                       for source in pool._sources.values()
                       for stream in source.streams.values())

        deadline = time.monotonic() + FIRST_PASS_S   # the index's pass is not timed
        time.sleep(warmup)
        while mode == "index" and not indexed() and time.monotonic() < deadline:
            time.sleep(0.1)
        done0, t0 = sum(counts), time.perf_counter()
        time.sleep(seconds)
        done1, t1 = sum(counts), time.perf_counter()
        was_indexed = indexed()
        stop.set()
        # a thread may wait for records the reader holds for another that stopped taking
        # them: closing the reader ends that wait
        pool.close()
        for thread in threads:
            thread.join(30)
    if errors:
        raise errors[0]
    return {"mode": mode, "busy": busy, "records_per_s": (done1 - done0) / (t1 - t0),
            "indexed": was_indexed}


def table(rows: list[dict], args) -> str:
    lines = [
        f"Machine: {platform.node() or 'unknown'}, {usable_cores()} usable cores; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; Python "
        f"{platform.python_version()}.",
        f"Command: `python benchmarks/reader_gil.py {args.db} --replicas {args.replicas} "
        f"--batch {args.batch} --busy {args.busy} --seconds {args.seconds:g} --rounds "
        f"{args.rounds}` (each row the best of its rounds).",
        "",
        "| busy threads | every pass reads the records | later passes take the index | "
        "index vs cursor |",
        "|---|---|---|---|",
    ]
    for busy in sorted({row["busy"] for row in rows}):
        by = {row["mode"]: row for row in rows if row["busy"] == busy}
        cursor, index = by["cursor"]["records_per_s"], by["index"]["records_per_s"]
        lines.append(f"| {busy} | {cursor:,.0f} records/s | {index:,.0f} records/s | "
                     f"{index / cursor:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("db", help="an encoded LMDB (benchmarks/make_imagenet_lmdb.py)")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--busy", default="0,2", help="busy threads, a row each")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--save", type=Path, help="write the table into this markdown file")
    args = parser.parse_args(argv)
    rows = []
    for busy in (int(b) for b in args.busy.split(",")):
        runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
        for _ in range(args.rounds):
            for mode in MODES:
                row = measure(args.db, mode, args.replicas, args.batch, busy, args.seconds,
                              args.warmup)
                print(f"{busy} busy, {mode}: {row['records_per_s']:,.0f} records/s "
                      f"(indexed: {row['indexed']})", flush=True)
                runs[mode].append(row)
        rows += [max(runs[mode], key=lambda r: r["records_per_s"]) for mode in MODES]
    text = table(rows, args)
    print(text)
    if args.save:
        save(args.save, "reader-gil", text)
    return rows


if __name__ == "__main__":
    main()
