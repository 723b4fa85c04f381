"""AnnotatedDatum databases both ways against SSD's Caffe fork (make_annotated_golden.py):

- `cpy convert annoset` writes, record for record, the bytes the fork's convert_annoset wrote
  from the same images, XML and label map (PNG-encoded and raw pixels);
- caffe-py's AnnotatedData reads the fork's databases, and its own, into the batches and box
  rows the fork's AnnotatedData makes of them (TEST phase, every case of annotated_cases.py),
  within 1e-5.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from caffe_py.io.db.lmdb_store import open_db
from caffe_py.net import Net
from caffe_py.solver.evaluate import fed
from caffe_py.spec.net_spec import load_net
from caffe_py.tools.annoset import AnnosetOptions, convert_annoset

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from annotated_cases import CASES  # noqa: E402

SET = HERE / "ssd" / "annotated"
TOLERANCE = 1e-5


def records(path: Path) -> list[tuple[bytes, bytes]]:
    with open_db(path) as db:
        cursor = db.cursor()
        keys, values = cursor.read(len(db))
        return [(bytes(k), bytes(v)) for k, v in zip(keys, values, strict=True)]


def fork_db(tmp: Path, encoded: bool) -> Path:
    """A copy of the fork's database: a Data layer takes LMDB's reader lock, which creates
    lock.mdb beside data.mdb, and the checkout stays as it is."""
    name = "fork_png_lmdb" if encoded else "fork_raw_lmdb"
    return Path(shutil.copytree(SET / name, tmp / name))


def convert(tmp: Path, encoded: bool) -> Path:
    db = tmp / ("cpy_png_lmdb" if encoded else "cpy_raw_lmdb")
    options = AnnosetOptions(label_map_file=str(SET / "labelmap.prototxt"), encoded=encoded,
                             encode_type="png" if encoded else "")
    convert_annoset(SET, SET / "list.txt", db, options)
    return db


@pytest.mark.parametrize("encoded", [True, False], ids=["png", "raw"])
def test_convert_annoset_writes_the_forks_bytes(encoded, tmp_path):
    ours = records(convert(tmp_path, encoded))
    theirs = records(fork_db(tmp_path, encoded))
    assert [k for k, _ in ours] == [k for k, _ in theirs]
    for (key, mine), (_, fork) in zip(ours, theirs, strict=True):
        assert mine == fork, f"record {key!r} differs from the fork's"


def run_layer(case: dict, source: Path, tmp: Path) -> list[np.ndarray]:
    net_yaml = tmp / "net.yaml"
    layer = {"name": "data", "type": "AnnotatedData", "top": ["data", "label"],
             "include": {"phase": "TEST"}, "transform_param": case["transform_param"],
             "data_param": {"source": str(source), "batch_size": case["batch_size"],
                            "backend": "LMDB"}}
    net_yaml.write_text(yaml.safe_dump({"name": "annotated", "layer": [layer]}))
    net = Net(load_net(net_yaml), "TEST")
    out = []
    with fed(net):
        for _ in range(2):
            result = net()
            out += [result.outputs["data"].numpy(), result.outputs["label"].numpy()]
    return out


def error(ours: np.ndarray, fork: np.ndarray) -> float:
    assert ours.shape == fork.shape, f"shape {ours.shape} vs the fork's {fork.shape}"
    return float(np.abs(ours.astype(np.float64) - fork).max() / max(np.abs(fork).max(), 1e-6))


@pytest.mark.parametrize("who", ["fork_db", "cpy_db"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_annotated_data_matches_fork(case, who, tmp_path):
    with np.load(SET / "fork_outputs.npz") as npz:
        expected = [npz[f"{case['name']}__{who}__{k}"] for k in range(4)]
        assert json.loads(str(npz[f"{case['name']}__spec"])) == case
    if who == "fork_db":
        source = fork_db(tmp_path, case["encoded"])
    else:
        source = convert(tmp_path, case["encoded"])
    ours = run_layer(case, source, tmp_path)
    for k, (mine, fork) in enumerate(zip(ours, expected, strict=True)):
        what = ("data", "label")[k % 2]
        assert error(mine, fork) <= TOLERANCE, f"{case['name']} pass {k // 2} {what}"


def test_a_batch_for_another_device_is_the_next_batch(tmp_path):
    """``next_on`` (a test pass on the root alone reading another replica's turn) hands over
    the batch ``next`` would have, on the device asked for."""
    import torch

    from caffe_py.io import feed_of

    case = CASES[0]
    source = convert(tmp_path, case["encoded"])
    batches = []
    for way in ("next", "next_on"):
        net_yaml = tmp_path / f"{way}.yaml"
        net_yaml.write_text(yaml.safe_dump({"name": "annotated", "layer": [
            {"name": "data", "type": "AnnotatedData", "top": ["data", "label"],
             "include": {"phase": "TEST"}, "transform_param": case["transform_param"],
             "data_param": {"source": str(source), "batch_size": case["batch_size"],
                            "backend": "LMDB"}}]}))
        net = Net(load_net(net_yaml), "TEST")
        with fed(net):
            feed: Any = feed_of(net.data_layers()[0])
            batches.append([feed.next() if way == "next" else feed.next_on(torch.device("cpu"))
                            for _ in range(2)])
    for (data, label), (other, other_label) in zip(*batches, strict=True):
        assert torch.equal(data, other) and torch.equal(label, other_label)
    assert not torch.equal(batches[0][0][0], batches[0][1][0])   # two different batches
