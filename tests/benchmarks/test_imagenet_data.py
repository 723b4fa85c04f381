"""The ImageNet benchmark's data (benchmarks/make_imagenet_lmdb.py): written as
convert_imageset writes its raw and --encoded databases, with compute_image_mean's mean; and the
benchmark's toy run from end to end (slow)."""
from __future__ import annotations

import io
import re
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from support import ROOT, load_benchmark

from caffe_py.io.db.lmdb_store import LmdbReader
from caffe_py.io.formats.blobproto import read_mean_file
from caffe_py.io.formats.datum import decode_datum
from caffe_py.io.reader import reader

BENCHMARKS = ROOT / "benchmarks"


def test_the_databases_are_convert_imagesets_with_their_mean(tmp_path):
    make = load_benchmark("make_imagenet_lmdb")
    info = make.main([str(tmp_path), "--images", "10", "--size", "48", "--workers", "1"])
    done = subprocess.run([sys.executable, str(BENCHMARKS / "make_imagenet_lmdb.py"),
                           str(tmp_path / "two"), "--images", "10", "--size", "48",
                           "--workers", "2"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    for name in ("raw_lmdb", "jpeg_lmdb"):  # worker processes make the same images
        with LmdbReader(tmp_path / name) as one, LmdbReader(tmp_path / "two" / name) as two:
            assert list(one) == list(two)
    assert info["images"] == 10 and info["jpeg_kb_mean"] > 1
    with LmdbReader(tmp_path / "raw_lmdb") as raw, LmdbReader(tmp_path / "jpeg_lmdb") as jpeg:
        raws, jpegs = list(raw), list(jpeg)
    assert [k for k, _ in raws] == [k for k, _ in jpegs] == [make.key_of(i) for i in range(10)]
    assert raws[3][0] == b"00000003_n%04d/img_00000003.JPEG" % make.label_of(3)
    total = np.zeros((3, 48, 48))
    for (_, raw_value), (_, jpeg_value) in zip(raws, jpegs, strict=True):
        r, j = decode_datum(raw_value), decode_datum(jpeg_value)
        assert (r.channels, r.height, r.width, r.encoded) == (3, 48, 48, False)
        assert (j.channels, j.height, j.width, j.encoded, j.label) == (0, 0, 0, True, r.label)
        bgr = np.frombuffer(r.data, np.uint8).reshape(3, 48, 48)
        total += bgr
        with Image.open(io.BytesIO(j.data)) as image:
            assert image.format == "JPEG" and image.mode == "RGB"
            rgb = np.asarray(image).transpose(2, 0, 1).astype(float)
        # the same picture (BGR in the raw record), up to JPEG's loss on fine texture
        assert np.corrcoef(rgb[::-1].ravel(), bgr.ravel())[0, 1] > 0.9
        assert bgr.std() > 20  # structure, not a flat field
    np.testing.assert_allclose(read_mean_file(tmp_path / "mean.binaryproto"), total / 10,
                               rtol=1e-6)
    again = make.main([str(tmp_path), "--images", "10", "--size", "48", "--check"])
    assert again == info  # reused, not made again


@pytest.mark.slow
def test_the_benchmark_runs_at_toy_size(tmp_path):
    done = subprocess.run([sys.executable, str(BENCHMARKS / "imagenet_data.py"), "--smoke",
                           "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    table = (tmp_path / "imagenet_data.md").read_text()
    assert "| JPEG | PIL, CPU threads | 2 |" in table
    assert "| JPEG | PIL, CPU processes | 2 |" in table
    assert any(line.startswith("| PIL, CPU processes | 2 |")  # the workers alone
               for line in table.splitlines())
    assert re.search(r"\| Data, JPEG LMDB \(\d+ CPU threads?, PIL\) \| [\d,.]+ \|", table)


@pytest.mark.slow
def test_the_several_replica_rows_run_at_toy_size(tmp_path):
    """--replicas 2 on the CPU: every training row is its own process (the replicated run on
    cpu:2), and the table gives each a rate and a ratio to DummyData."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "imagenet_data.py"), "--smoke",
                           "--replicas", "2", "--skip-decode", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    table = (tmp_path / "imagenet_data.md").read_text()
    assert "ResNet-50 training steps on 2 CPU replicas (batch 8 each;" in table
    for row in ("DummyData (constant), first", "Data, raw LMDB", "Data, JPEG LMDB",
                "DummyData (constant), last"):
        assert re.search(rf"\| {re.escape(row)} \| [\d,]+\.\d \| [\d.]+ \| \d\.\d{{3}} \|",
                         table), row
    results = (tmp_path / "imagenet_multigpu.jsonl").read_text().splitlines()
    assert len(results) == 4 and all('"gpus": 2' in line for line in results)


def test_the_decode_host_cost_benchmark_runs_both_ways(tmp_path):
    """benchmarks/decode_host_cost.py on a toy set: both modes feed batches of the database's
    own shape, and the table compares them."""
    make = load_benchmark("make_imagenet_lmdb")
    make.main([str(tmp_path), "--images", "24", "--size", "40", "--workers", "1"])
    bench = load_benchmark("decode_host_cost")
    db = str(tmp_path / "jpeg_lmdb")
    assert bench.record_shape(db) == (3, 40, 40)
    cache = reader.CACHE_BYTES
    rows = bench.main([db, "--replicas", "2", "--batch", "4", "--crop", "32", "--processes",
                       "1", "--seconds", "0.5", "--warmup", "0.3", "--rounds", "1",
                       "--save", str(tmp_path / "out.md")])
    assert [r["mode"] for r in rows] == ["stored", "buffers"]
    assert LmdbReader.rereadable and reader.CACHE_BYTES == cache  # as they were
    assert all(r["images_per_s"] > 0 and r["host_us"] > 0 for r in rows)
    assert all(re.fullmatch(r"\d+ batches; per batch: write files and submit \d+\.\d ms, wait "
                            r"for the processes \d+\.\d ms, copy the crops out \d+\.\d ms",
                            r["feed"]) for r in rows)
    text = (tmp_path / "out.md").read_text()
    assert "--crop 32 --batch 4 --processes 1" in text and "(3 x 40 x 40 JPEG records" in text
    assert re.search(r"\| stored \| [\d,]+ \| \d+\.\d us \| \d\.\d\dx \|\n\| buffers \| [\d,]+ "
                     r"\| \d+\.\d us \| 1\.00x \|", text)
