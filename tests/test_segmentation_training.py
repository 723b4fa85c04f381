"""A SegNet-style net trained from its prototxt (configs/segnet_toy) with `cpy train` on a
synthetic segmentation set made here (data/toy_segmentation.py: toy shapes with known masks):
the test phase's mean IoU (SegAccuracy's third value) must rise well above the untrained
net's. docs/segmentation.md shows a longer run of the same."""
from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import load_script

from caffe_py.cli import cli

ROOT = Path(__file__).resolve().parents[1]


def toy_module():
    return load_script("data/toy_segmentation.py")


def test_the_toy_set_has_every_class_and_its_masks(tmp_path):
    import numpy as np
    from PIL import Image

    out = toy_module().write_set(tmp_path, train=8, test=2, size=24, seed=3)
    lines = (out / "train.txt").read_text().split()
    assert len(lines) == 16 and lines[:2] == ["train/0000.png", "train/0000_label.png"]
    labels = np.stack([np.array(Image.open(out / name)) for name in lines[1::2]])
    assert set(np.unique(labels)) == {0, 1, 2, 3}
    image = np.array(Image.open(out / "train" / "0000.png"))
    assert image.shape == (24, 24, 3) and labels.shape == (8, 24, 24)


@pytest.mark.slow
def test_segnet_style_net_learns_the_toy_masks(tmp_path, monkeypatch):
    toy_module().write_set(tmp_path, train=32, test=16, size=32, seed=0)
    for name in ("segnet_toy.prototxt", "solver.prototxt"):
        shutil.copy(ROOT / "configs" / "segnet_toy" / name, tmp_path)
    monkeypatch.chdir(tmp_path)  # Caffe reads the nets' lists from where it runs
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.prototxt", "--gpus", "cpu",
                                      "--set", "max_iter=60", "--set", "test_interval=60"])
    assert result.exit_code == 0, result.output
    with (tmp_path / "snaps" / "segnet_toy_metrics.csv").open(newline="") as f:
        tests = [row for row in csv.DictReader(f) if row["phase"] == "test0"]
    assert [row["iteration"] for row in tests] == ["0", "60"]
    before, after = (float(row["test0/accuracy[2]"]) for row in tests)  # mean IoU
    assert before < 0.2 and after > 0.4, (before, after)
    assert float(tests[1]["test0/accuracy[0]"]) > 0.8  # pixel accuracy
