"""A few SSD training iterations against SSD's Caffe fork (make_ssd_training_golden.py): the
same prototxts, the fork's initial weights and its AnnotatedDatum LMDB, run by `cpy train`,
give the fork's loss at every iteration (the fork's printed digits: 6 significant)."""
from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from caffe_py.api import train_solver
from caffe_py.spec import yamlio
from caffe_py.tools.to_yaml import prototxt_as_yaml

HERE = Path(__file__).resolve().parent / "ssd" / "training"


@pytest.mark.slow
def test_ssd_losses_match_the_fork(tmp_path, monkeypatch):
    expected = json.loads((HERE / "losses.json").read_text())["losses"]
    # the prototxts' paths are relative to where Caffe ran; a copy of both folders, because a
    # Data layer takes LMDB's reader lock, which creates lock.mdb beside data.mdb
    work = tmp_path / "ssd"
    shutil.copytree(HERE, work / "training")
    lmdb = HERE.parent / "annotated" / "fork_png_lmdb"
    shutil.copytree(lmdb, work / "annotated" / lmdb.name)
    monkeypatch.chdir(work / "training")
    monkeypatch.setitem(yamlio.FOREIGN, ".prototxt", prototxt_as_yaml)  # as the CLI reads them
    train_solver("solver.prototxt", weights=["init.caffemodel"],
                 sets=[f"snapshot_prefix={tmp_path / 'run'}"])
    with open(tmp_path / "run_metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["phase"] == "train"]
    losses = [float(r["loss"]) for r in rows][:len(expected)]
    assert len(losses) == len(expected)
    for i, (ours, fork) in enumerate(zip(losses, expected, strict=True)):
        assert ours == pytest.approx(fork, rel=1e-5), f"iteration {i}: {ours} vs {fork}"
