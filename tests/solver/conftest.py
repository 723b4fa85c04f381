"""Small nets and solvers for the solver tests: DummyData or a tiny LMDB, one InnerProduct."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from support import write_db

from caffe_py.io.formats.datum import Datum
from caffe_py.spec.solver_spec import load_solver

DUMMY_NET = """\
name: tiny
layer:
  - name: data
    type: DummyData
    top: [data, label]
    dummy_data_param:
      shape: [{dim: [4, 6]}, {dim: [4]}]
      data_filler: [{type: gaussian}, {type: uniform, min: 0, max: 2.99}]
  - name: ip
    type: InnerProduct
    bottom: data
    top: ip
    param: [{lr_mult: 1}, {lr_mult: 2, decay_mult: 0}]
    inner_product_param: {num_output: 3, weight_filler: {type: xavier}}
  - name: drop
    type: Dropout
    bottom: ip
    top: ip
    include: {phase: TRAIN}
  - name: loss
    type: SoftmaxWithLoss
    bottom: [ip, label]
    top: loss
"""

LMDB_NET = """\
name: tiny_lmdb
layer:
  - name: data
    type: Data
    top: [data, label]
    include: {phase: TRAIN}
    transform_param: {scale: 0.0078125, mirror: true, crop_size: 2}
    data_param: {source: train_lmdb, batch_size: BATCH}
  - name: data
    type: Data
    top: [data, label]
    include: {phase: TEST}
    transform_param: {scale: 0.0078125, crop_size: 2}
    data_param: {source: train_lmdb, batch_size: 3}
  - name: ip
    type: InnerProduct
    bottom: data
    top: ip
    inner_product_param: {num_output: 3, weight_filler: {type: gaussian, std: 0.1}}
  - name: loss
    type: SoftmaxWithLoss
    bottom: [ip, label]
    top: loss
  - name: acc
    type: Accuracy
    bottom: [ip, label]
    top: acc
    include: {phase: TEST}
"""


def write_lmdb(path: Path, n: int = 13) -> None:
    """n records of 1 x 3 x 3 pixels, labels 0..2, keys in order."""
    write_db(path, [Datum(1, 3, 3, data=bytes((i * 37 + j * 11) % 256 for j in range(9)),
                          label=i % 3) for i in range(n)])


class Workspace:
    """A directory with a net file and solver files written on request."""

    LMDB_NET = LMDB_NET

    def __init__(self, root: Path):
        self.root = root

    def net(self, text: str = DUMMY_NET, name: str = "net.yaml", batch: int = 4) -> Path:
        if "source: train_lmdb" in text and not (self.root / "train_lmdb").exists():
            write_lmdb(self.root / "train_lmdb")
        path = self.root / name
        path.write_text(text.replace("BATCH", str(batch)))
        return path

    def solver(self, name: str = "solver.yaml", **fields) -> Path:
        base = {"net": "net.yaml", "base_lr": 0.1, "momentum": 0.9, "max_iter": 6,
                "random_seed": 5, "snapshot_prefix": "snaps/tiny"}
        base.update(fields)
        lines = []
        for key, value in base.items():
            if isinstance(value, bool):
                value = "true" if value else "false"
            lines.append(f"{key}: {value}")
        path = self.root / name
        path.write_text(textwrap.dedent("\n".join(lines)) + "\n")
        return path

    def load(self, **fields):
        return load_solver(self.solver(**fields))


@pytest.fixture
def ws(tmp_path) -> Workspace:
    w = Workspace(tmp_path)
    w.net()
    return w
