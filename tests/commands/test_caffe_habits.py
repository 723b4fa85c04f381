"""Caffe's habits: its single-dash flags and action names, and prototxts wherever a YAML spec
is taken (read in memory as `cpy import-prototxt` converts them)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from support import write_records

from caffe_py.cli import caffe_spellings, cli

BVLC = Path(__file__).resolve().parents[1] / "fixtures/prototxts/bvlc/examples/mnist"
SOLVER = """\
net: "examples/mnist/lenet_train_test.prototxt"
test_iter: 2
test_interval: 4
base_lr: 0.01
momentum: 0.9
lr_policy: "inv"
gamma: 0.0001
power: 0.75
display: 2
max_iter: 4
snapshot_prefix: "examples/mnist/lenet"
solver_mode: CPU
random_seed: 1
"""


def test_caffe_flag_spellings():
    assert caffe_spellings(["train", "-solver", "s.prototxt", "-gpu=0,1", "-weights", "w"]) == [
        "train", "--solver", "s.prototxt", "--gpus=0,1", "--weights", "w"]
    assert caffe_spellings(["test", "-model", "m", "-iterations", "5", "-snapshot", "x"]) == [
        "test", "--model", "m", "--iterations", "5", "--snapshot", "x"]
    assert caffe_spellings(["device_query"]) == ["device-query"]
    assert caffe_spellings(["net", "-solverx"]) == ["net", "-solverx"]  # only Caffe's flags


def test_caffe_train_command_line_on_bvlc_prototxts(tmp_path, monkeypatch):
    """`caffe train -solver examples/mnist/lenet_solver.prototxt`, from Caffe's root."""
    monkeypatch.chdir(tmp_path)
    mnist = tmp_path / "examples" / "mnist"
    mnist.mkdir(parents=True)
    shutil.copy(BVLC / "lenet_train_test.prototxt", mnist)
    (mnist / "lenet_solver.prototxt").write_text(SOLVER)
    for split in ("train", "test"):
        write_records(mnist / f"mnist_{split}_lmdb",
                      ((np.full((1, 28, 28), 9 * i, np.uint8), i % 10) for i in range(20)))
    result = CliRunner().invoke(cli, ["train", "-solver", "examples/mnist/lenet_solver.prototxt",
                                      "-gpu", "cpu"])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[0] == ("Note: examples/mnist/lenet_solver.prototxt is a Caffe prototxt, read "
                        "in memory as its YAML spec (cpy import-prototxt "
                        "examples/mnist/lenet_solver.prototxt OUT.yaml writes it)")
    assert lines[-1] == "Optimization Done."
    assert (mnist / "lenet_iter_4.pt").is_file()
    result = CliRunner().invoke(cli, ["test", "-model",
                                      "examples/mnist/lenet_train_test.prototxt", "-weights",
                                      "examples/mnist/lenet_iter_4.pt", "-iterations", "2"])
    assert result.exit_code == 0, result.output
    assert any(line.startswith("accuracy = ") for line in result.stderr.splitlines())
