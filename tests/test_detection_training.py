"""Detection end to end: a synthetic VOC-style set (data/shapes_detection.py), converted by `cpy
convert annoset`, trains the small SSD of configs/ssd_shapes from its prototxts with `cpy
train` until the test phase's mAP clearly rises, and `cpy test` prints the trained net's mAP.
A toy run (the longer one and its curve: docs/detection.md)."""
from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from support import load_script

from caffe_py.cli import cli

ROOT = Path(__file__).resolve().parents[1]


def make_set(out: Path, train: int, test: int) -> None:
    load_script("data/shapes_detection.py").write_set(out, train, test, size=64, seed=0)


@pytest.fixture
def one_thread():
    """One intra-op thread: this small net runs 4x faster so on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_ssd_on_shapes_learns_to_detect(tmp_path, monkeypatch, one_thread):
    monkeypatch.chdir(tmp_path)  # the prototxts' paths are relative to where Caffe runs
    shutil.copytree(ROOT / "configs" / "ssd_shapes", tmp_path / "configs" / "ssd_shapes")
    make_set(tmp_path / "data" / "shapes", train=160, test=40)
    runner = CliRunner()
    for split in ("trainval", "test"):
        done = runner.invoke(cli, ["convert", "annoset", "data/shapes/", f"data/shapes/{split}.txt",
                                   f"data/shapes/{split}_lmdb", "--label-map-file",
                                   "data/shapes/labelmap.prototxt", "--encoded",
                                   "--encode-type", "png"])
        assert done.exit_code == 0, done.output
    done = runner.invoke(cli, ["train", "--solver", "configs/ssd_shapes/solver.prototxt",
                               "--set", "max_iter=300", "--set", "test_interval=300",
                               "--set", "test_iter=4", "--set", "snapshot=300",
                               "--set", "display=40"])
    assert done.exit_code == 0, done.output
    with open("snapshots/ssd_shapes_metrics.csv", newline="") as f:
        tests = [r for r in csv.DictReader(f) if r["phase"] == "test0"]
    maps = [float(r["test0/detection_eval"]) for r in tests]
    assert [int(r["iteration"]) for r in tests] == [0, 300]
    assert maps[0] < 0.05 and maps[1] > 0.12, maps  # from chance to detecting shapes
    done = runner.invoke(cli, ["test", "--model", "configs/ssd_shapes/ssd_shapes.prototxt",
                               "--weights", "snapshots/ssd_shapes_iter_300.pt",
                               "--iterations", "4", "--ap-version", "11point"])
    assert done.exit_code == 0, done.output
    found = re.search(r"detection_eval = ([0-9.e-]+)", done.output)
    assert found is not None, done.output
    assert float(found.group(1)) == pytest.approx(maps[1], rel=1e-5)
