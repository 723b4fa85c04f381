"""The ImageNet benchmark's data (benchmarks/make_imagenet_lmdb.py): written as
convert_imageset writes its raw and --encoded databases, with compute_image_mean's mean; and the
benchmark's toy run from end to end (slow), its rows of several replicas run by `cpy train`
or by the older lockstep script."""
from __future__ import annotations

import dataclasses
import io
import json
import re
import statistics
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
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


def test_specs_only_writes_the_rows_solvers_for_replica_profile(tmp_path):
    data = tmp_path / "data"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "imagenet_data.py"), "--smoke",
                           "--specs-only", "--data", str(data), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    specs = tmp_path / "imagenet_specs"
    assert done.stdout.strip().splitlines()[-3:] == [
        f"dummy: {specs / 'dummy_solver.yaml'}", f"raw: {specs / 'raw_lmdb_solver.yaml'}",
        f"jpeg: {specs / 'jpeg_lmdb_solver.yaml'}"]
    for stem, source in (("raw_lmdb", data / "raw_lmdb"), ("jpeg_lmdb", data / "jpeg_lmdb")):
        solver = yaml.safe_load((specs / f"{stem}_solver.yaml").read_text())
        net = yaml.safe_load(open(solver["net"]).read())
        assert net["layer"][0]["data_param"]["source"] == str(source)
        assert source.is_dir()
    rp = load_benchmark("replica_profile")   # what replica_profile.py --solver runs
    path = rp._solver(tmp_path, "resnet50", "4", False, specs / "raw_lmdb_solver.yaml")
    assert yaml.safe_load(path.read_text())["net"] == str(specs / "raw_lmdb_net.yaml")


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
    """--replicas 2 on the CPU: every caffe-py row is `cpy train --gpus cpu:2` in its own
    process, on a solver that fixes max_iter and display and neither tests nor snapshots; the
    table gives each its median display rate x 16 images and a ratio to DummyData."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / "imagenet_data.py"), "--smoke",
                           "--replicas", "2", "--skip-decode", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    table = (tmp_path / "imagenet_data.md").read_text()
    assert ("ResNet-50 training steps on 2 CPU replicas (batch 8 each; caffe-py: `cpy train "
            "--gpus cpu:N` with no flag, eager; the peer under torchrun DDP over gloo) (bf16 "
            "autocast, channels_last, Caffe's SGD; caffe-py's rows: `cpy train` to max_iter 5, "
            "the median of its display rates (every iteration) after the first two; the "
            "peer's: 1 warm-up + 3 timed steps per row;") in table
    rows = ["DummyData (constant), first", "Data, raw LMDB", "Data, JPEG LMDB",
            "DummyData (constant), last"]
    results = [json.loads(line) for line in
               (tmp_path / "imagenet_multigpu.jsonl").read_text().splitlines()]
    assert [r["row"] for r in results] == rows
    specs = tmp_path / "imagenet_specs"
    for k, (row, result, stem) in enumerate(zip(rows, results, ["dummy", "raw_lmdb",
                                                                "jpeg_lmdb", "dummy"],
                                                strict=True)):
        solver = specs / f"{stem}_solver_x2_{k}.yaml"
        assert result["command"] == [sys.executable, str(ROOT / "cli.py"), "train",
                                     "--solver", str(solver), "--gpus", "cpu:2",
                                     "--log-format", "plain"]
        spec = yaml.safe_load(solver.read_text())
        assert (spec["max_iter"], spec["display"], spec["snapshot_after_train"]) == (5, 1, False)
        assert spec["snapshot_prefix"] == str(specs / f"snap_{stem}_solver_x2_{k}" / "s")
        assert "test_interval" not in spec and "test_iter" not in spec
        assert result["ok"] and result["gpus"] == 2
        assert result["images_per_s"] == pytest.approx(16 * result["iter_per_s"], rel=1e-12)
        # every display line's rate is kept (iterations 0-4), the median taken after two
        assert len(result["rates"]) == 5
        assert result["iter_per_s"] == statistics.median(result["rates"][2:])
        assert (f"train x2: {row}: {result['images_per_s']:,.1f} images/s (display lines: "
                + " ".join(f"{r:.2f}" for r in result["rates"]) + " iter/s)") in done.stdout
        assert re.search(rf"\| {re.escape(row)} \| {result['images_per_s']:,.1f} \| [\d.]+ \| "
                         r"\d\.\d{3} \|", table), row
    log = (tmp_path / "imagenet_multigpu.log").read_text()
    # display lines at iterations 0-4 (the first two not counted); none at max_iter 5
    assert len(re.findall(r"^Iteration \d \([\d.e+]+ iter/s", log, re.M)) == 4 * 5


def test_the_cpy_rows_display_often_enough_and_their_heading_says_how_they_ran():
    bench = load_benchmark("imagenet_data")
    assert bench.cpy_schedule(bench.REAL) == (10, 190)  # 25 + 150 -> 180, + 10 undisplayed
    assert bench.cpy_schedule(bench.SMOKE) == (1, 5)
    assert bench.cpy_schedule(dataclasses.replace(bench.REAL, warmup=0, steps=20)) == (4, 24)
    heading = bench.train_table([("DummyData (constant), first", None, 1000.0)], bench.REAL, 4,
                                "cuda")[1]
    assert heading == (
        "ResNet-50 training steps on 4 GPUs (batch 256 per GPU; caffe-py: `cpy train --gpus "
        "0,...,N-1` with no flag: whole iterations captured on every replica, NCCL's "
        "all-reduce; the peer under torchrun DDP) (bf16 autocast, channels_last, Caffe's SGD; "
        "caffe-py's rows: `cpy train` to max_iter 190, the median of its display rates (every "
        "10 iterations) after the first two; the peer's: 25 warm-up + 150 timed steps per row; "
        "ratios against the mean of the DummyData rows):")


@pytest.mark.slow
def test_the_lockstep_trainer_still_runs_multigpu_py(tmp_path, monkeypatch):
    """--multi-trainer lockstep: caffe-py's rows go to benchmarks/multigpu.py caffe, its
    JSON line read back; the table's heading says so."""
    bench = load_benchmark("imagenet_data")
    s = bench.SMOKE
    calls = []

    def lockstep(self, name, solver, extra_env):
        calls.append((name, solver.name, extra_env))
        return {"ok": True, "images_per_s": 100.0}

    monkeypatch.setattr(bench.Replicas, "lockstep", lockstep)
    rows = bench.multi_train_rows(tmp_path / "db", s, 2, 2, tmp_path, torch.device("cpu"),
                                  frozenset({"peer"}), trainer="lockstep")
    assert calls == [("DummyData (constant), first", "dummy_solver.yaml", {}),
                     ("Data, raw LMDB", "raw_lmdb_solver.yaml", {}),
                     ("Data, JPEG LMDB", "jpeg_lmdb_solver.yaml", {}),
                     ("DummyData (constant), last", "dummy_solver.yaml", {})]
    assert [images for _, _, images in rows] == [100.0] * 4
    heading = bench.train_table(rows, s, 2, "cuda", "lockstep")[1]
    assert heading.startswith(
        "ResNet-50 training steps on 2 GPUs (batch 8 per GPU; caffe-py: benchmarks/multigpu.py "
        "caffe --graphs: the reduction tree, CUDA graphs, one thread (lockstep); the peer under "
        "torchrun DDP) (bf16 autocast, channels_last, Caffe's SGD; 1 warm-up + 3 timed steps "
        "per row;")
    monkeypatch.undo()
    replicas = bench.Replicas(s, 2, False, tmp_path)
    solver = tmp_path / "imagenet_specs" / "dummy_solver.yaml"
    result = replicas.lockstep("DummyData (constant), first", solver, {})
    assert result["ok"], result["why"]
    record = json.loads(replicas.results.read_text().splitlines()[-1])
    assert (record["run"], record["gpus"], record["batch"]) == ("caffe-py tree", 2, 8)
    assert result["images_per_s"] == record["images_per_s"]
    assert (f"$ {sys.executable} {BENCHMARKS / 'multigpu.py'} caffe --gpus cpu:2 "
            f"--channels-last --solver {solver} --warmup 1 --iters 3 --json "
            f"{replicas.results}\n") in (tmp_path / "imagenet_multigpu.log").read_text()


def test_a_cpy_row_that_fails_says_why(tmp_path):
    bench = load_benchmark("imagenet_data")
    solver = tmp_path / "broken_solver.yaml"
    solver.write_text(f"net: {tmp_path / 'none_net.yaml'}\nbase_lr: 0.01\nmax_iter: 5\n")
    result = bench.Replicas(bench.SMOKE, 2, False, tmp_path).cpy_train("DummyData", solver,
                                                                        "x2_0", {})
    assert not result["ok"]
    assert result["why"].startswith(f"exit 1: Error: {tmp_path / 'none_net.yaml'}: file not "
                                    "found;")


def test_the_decode_host_cost_benchmark_runs_both_ways(tmp_path):
    """benchmarks/decode_host_cost.py on a toy set: every mode feeds batches of the
    database's own shape (into shared slots: no crop copied out), and the table compares
    them; no shared buffer is left behind."""
    from pathlib import Path

    def shm() -> set[str]:
        return {p.name for p in Path("/dev/shm").iterdir()}

    make = load_benchmark("make_imagenet_lmdb")
    make.main([str(tmp_path), "--images", "24", "--size", "40", "--workers", "1"])
    bench = load_benchmark("decode_host_cost")
    db = str(tmp_path / "jpeg_lmdb")
    assert bench.record_shape(db) == (3, 40, 40)
    cache = reader.CACHE_BYTES
    before = shm()
    rows = bench.main([db, "--replicas", "2", "--batch", "4", "--crop", "32", "--processes",
                       "1", "--seconds", "0.5", "--warmup", "0.3", "--rounds", "1",
                       "--save", str(tmp_path / "out.md")])
    assert [r["mode"] for r in rows] == ["slots", "stored", "buffers"] and shm() == before
    assert LmdbReader.rereadable and reader.CACHE_BYTES == cache  # as they were
    assert all(r["images_per_s"] > 0 and r["host_us"] > 0 for r in rows)
    assert all(re.fullmatch(r"\d+ batches; per batch: write files and submit \d+\.\d ms, wait "
                            r"for the processes \d+\.\d ms, copy the crops out \d+\.\d ms",
                            r["feed"]) for r in rows)
    assert rows[0]["feed"].endswith("copy the crops out 0.0 ms")
    text = (tmp_path / "out.md").read_text()
    assert "--crop 32 --batch 4 --processes 1" in text and "(3 x 40 x 40 JPEG records" in text
    assert re.search(r"\| slots \| [\d,]+ \| \d+\.\d us \| \d\.\d\dx \|\n"
                     r"\| stored \| [\d,]+ \| \d+\.\d us \| \d\.\d\dx \|\n\| buffers \| [\d,]+ "
                     r"\| \d+\.\d us \| 1\.00x \|", text)


def test_the_reader_gil_benchmark_compares_the_cursor_with_the_index(tmp_path):
    """benchmarks/reader_gil.py on a toy set: the cursor rows never index, the index rows
    are timed once the first pass has indexed the database, and the settings it changes are
    as they were afterwards."""
    make = load_benchmark("make_imagenet_lmdb")
    make.main([str(tmp_path), "--images", "24", "--size", "40", "--workers", "1"])
    bench = load_benchmark("reader_gil")
    db = str(tmp_path / "jpeg_lmdb")
    saved = reader.CACHE_BYTES, reader.STORED_INDEX_RECORDS
    rows = bench.main([db, "--replicas", "2", "--batch", "4", "--busy", "0,1", "--seconds",
                       "0.3", "--warmup", "0.2", "--rounds", "1", "--save",
                       str(tmp_path / "out.md")])
    assert [(r["busy"], r["mode"], r["indexed"]) for r in rows] == [
        (0, "cursor", False), (0, "index", True), (1, "cursor", False), (1, "index", True)]
    assert all(r["records_per_s"] > 0 for r in rows)
    assert (reader.CACHE_BYTES, reader.STORED_INDEX_RECORDS) == saved
    assert LmdbReader.rereadable
    text = (tmp_path / "out.md").read_text()
    assert "--replicas 2 --batch 4 --busy 0,1 --seconds 0.3 --rounds 1" in text
    assert re.search(r"\| 0 \| [\d,]+ records/s \| [\d,]+ records/s \| \d+\.\d\dx \|\n"
                     r"\| 1 \| [\d,]+ records/s \| [\d,]+ records/s \| \d+\.\d\dx \|", text)
