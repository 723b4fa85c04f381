"""The training process's own CPU time per JPEG record that the decode processes decode: the
image files left in the LMDB (each process reads its records by key) against the files copied
out of the map by the reader and into the processes' shared input buffers by the feeds, and
the crops written straight into the feed's shared batch buffers (a CUDA feed's slots) against
copied out of the processes' own, in the same run.

    python benchmarks/make_imagenet_lmdb.py /tmp/cpy_imagenet --images 4096
    python benchmarks/decode_host_cost.py /tmp/cpy_imagenet/jpeg_lmdb --save docs/data_pipeline.md

Each replica's feed runs as on a GPU: a thread takes its batches from the reader's queue and
has the decode processes crop (224 x 224) and mirror them into a batch buffer, two batches in
flight (:class:`~caffe_py.io.feed.image_batch.BatchImages`, the feed's own code); nothing is
sent to a device. Reported per mode: images/s, and the CPU time of the training process
itself (its threads: reader, feeds, the pool's pipes; not the decode processes) per image.
On a machine with many cores that time, most of it under the GIL, bounds the rate four GPUs
can be fed at; on a small one the decode processes bound the rate and the host time is the
figure to compare.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import platform
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from data_pipeline import save  # noqa: E402

import caffe_py.io.reader.reader as reader_module  # noqa: E402
from caffe_py.io import ReaderPool  # noqa: E402
from caffe_py.io.db.lmdb_store import LmdbReader  # noqa: E402
from caffe_py.io.decoders.decode_processes import release, shared_buffer  # noqa: E402
from caffe_py.io.decoders.workers import DecodeOptions, usable_cores  # noqa: E402
from caffe_py.io.feed.image_batch import BatchImages  # noqa: E402
from caffe_py.io.feed.transformer import Choices  # noqa: E402
from caffe_py.io.formats.datum import decode_datum  # noqa: E402
from caffe_py.io.reader import FeedSpec  # noqa: E402

MODES = ("slots", "stored", "buffers")
"""slots: the processes read the files from the LMDB and write the crops into the feed's
shared batch buffers (as into a CUDA feed's slots); stored: the same, the crops copied out of
the processes' buffers (as into a CPU feed's batch); buffers: the files are copied through the
training process too (as from a database the processes cannot read, LevelDB)."""


def record_shape(db: str) -> tuple[int, int, int]:
    """(C, H, W) of the database's first image."""
    with LmdbReader(db) as opened:
        c, h, w = decode_datum(opened.first()[1]).shape
    return c, h, w


def measure(db: str, mode: str, replicas: int, batch: int, processes: int,
            seconds: float, warmup: float, crop: int = 224) -> dict:
    """Images/s and host CPU microseconds per image of ``replicas`` feeds in ``mode``, each
    cropping ``crop`` x ``crop``."""
    shape = record_shape(db)
    with _settings(mode):
        return _measure(db, mode, shape, replicas, batch, processes, seconds, warmup, crop)


@contextlib.contextmanager
def _settings(mode: str) -> Iterator[None]:
    """``mode``'s reader settings while a measurement runs, as they were afterwards: the files
    left in the LMDB or not, and no database kept decoded (as an ImageNet-sized one)."""
    saved = LmdbReader.rereadable, reader_module.CACHE_BYTES
    LmdbReader.rereadable, reader_module.CACHE_BYTES = mode != "buffers", 0
    try:
        yield
    finally:
        LmdbReader.rereadable, reader_module.CACHE_BYTES = saved


def _measure(db: str, mode: str, shape: tuple[int, int, int], replicas: int, batch: int,
             processes: int, seconds: float, warmup: float, crop: int) -> dict:
    counts = [0] * replicas
    stop = threading.Event()
    errors: list[BaseException] = []
    options = DecodeOptions(processes, "off", processes="on")
    with ReaderPool(replicas, decode=options) as pool:
        queues = [pool.subscribe(FeedSpec(db, batch, 4, shape, encoded=True), "TRAIN/data",
                                 replica=r, seed=0) for r in range(replicas)]
        images = [BatchImages(db, shape, None, pool.workers, options, torch.device("cpu"),
                              pool.processes, replicas) for _ in range(replicas)]
        pool.start()

        slots = ([shared_buffer(batch * shape[0] * crop * crop, db) for _ in range(2 * replicas)]
                 if mode == "slots" else [])

        def feed(r: int) -> None:
            rng = np.random.default_rng(r)
            size = (batch, shape[0], crop, crop)
            mine = slots[2 * r:2 * r + 2]
            outs = ([np.ndarray(size, np.uint8, buffer=slot.buf) for slot in mine] if mine
                    else [np.empty(size, np.uint8) for _ in range(2)])
            names = [slot.name for slot in mine] if mine else [None, None]
            flying: list = []
            try:
                for index in itertools.count():
                    if stop.is_set():
                        break
                    records = queues[r].get_batch(batch)
                    queues[r].mark_consumed(batch)
                    choices = Choices(rng.integers(0, shape[1] - crop + 1, (batch, 2)),
                                      rng.integers(0, 2, batch).astype(bool))
                    # two batches in flight, each into its own buffer
                    flight = images[r].start_host(records, choices, outs[index % 2],
                                                  names[index % 2])
                    flying.append(flight)
                    if len(flying) == 2:
                        done = flying.pop(0)
                        if done is not None:
                            done.wait()
                    counts[r] += batch
            except BaseException as exc:  # noqa: BLE001 (reported by the main thread)
                if not stop.is_set():  # (after it: the reader closed under a waiting take)
                    errors.append(exc)
                stop.set()

        threads = [threading.Thread(target=feed, args=(r,), daemon=True)
                   for r in range(replicas)]
        for thread in threads:
            thread.start()
        time.sleep(warmup)
        done0, cpu0, t0 = sum(counts), time.process_time(), time.perf_counter()
        time.sleep(seconds)
        done1, cpu1, t1 = sum(counts), time.process_time(), time.perf_counter()
        stop.set()
        # a thread may wait for records the reader holds for another that stopped taking
        # them: closing the reader ends that wait
        pool.close()
        for thread in threads:
            thread.join(30)
        split = images[0].crops.summary() if images[0].crops is not None else ""
        for each in images:
            each.close()
    for slot in slots:
        release(slot)
    if errors:
        raise errors[0]
    n = max(1, done1 - done0)
    return {"mode": mode, "images_per_s": n / (t1 - t0), "host_us": 1e6 * (cpu1 - cpu0) / n,
            "feed": split}


def table(rows: list[dict], args, db: str) -> str:
    base = next(r for r in rows if r["mode"] == "buffers")
    lines = [
        f"Machine: {platform.node() or 'unknown'}, {usable_cores()} usable cores; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; torch "
        f"{torch.__version__}.",
        f"Command: `python benchmarks/decode_host_cost.py {db} --replicas {args.replicas} "
        f"--crop {args.crop} "
        f"--batch {args.batch} --processes {args.processes} --seconds {args.seconds:g} "
        f"--rounds {args.rounds}` ({' x '.join(map(str, record_shape(db)))} JPEG records, "
        f"crops {args.crop} x {args.crop}; each mode's round with the least CPU per image).",
        "",
        "| files | images/s | training-process CPU per image | vs buffers |",
        "|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row['mode']} | {row['images_per_s']:,.0f} | "
                     f"{row['host_us']:.1f} us | {row['host_us'] / base['host_us']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("db", help="an encoded LMDB of JPEGs of one size "
                                   "(benchmarks/make_imagenet_lmdb.py)")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--crop", type=int, default=224)
    parser.add_argument("--processes", type=int, default=max(1, usable_cores() - 2))
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2, help="each mode this many times, "
                                                              "interleaved")
    parser.add_argument("--save", type=Path, help="write the table into this markdown file")
    args = parser.parse_args(argv)
    runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            row = measure(args.db, mode, args.replicas, args.batch, args.processes,
                          args.seconds, args.warmup, args.crop)
            print(f"{mode}: {row['images_per_s']:,.0f} images/s, {row['host_us']:.1f} us of "
                  f"training-process CPU per image; feed 0: {row['feed']}", flush=True)
            runs[mode].append(row)
    rows = [min(runs[mode], key=lambda r: r["host_us"]) for mode in MODES]  # the least noisy
    text = table(rows, args, args.db)
    print(text)
    if args.save:
        save(args.save, "decode-host-cost", text)
    return rows


if __name__ == "__main__":
    main()
