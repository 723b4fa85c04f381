"""Caffe's habits: its single-dash flags and action names, and prototxts wherever a YAML spec
is taken (read in memory as `cpy import-prototxt` converts them)."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner
from support import error_line, snapshot_names, write_records

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


def test_gflags_spellings_of_caffes_flags():
    """gflags takes -flag and --flag, each with =value or the value after it."""
    assert caffe_spellings(["train", "--gpu=0,1", "--solver=s.prototxt"]) == [
        "train", "--gpus=0,1", "--solver=s.prototxt"]
    assert caffe_spellings(["train", "-gpu", "all", "--sigint_effect", "none"]) == [
        "train", "--gpus", "all", "--sigint-effect", "none"]
    assert caffe_spellings(["time", "-phase", "TEST", "-level=1", "--stage", "a,b"]) == [
        "time", "--phase", "TEST", "--level=1", "--stage", "a,b"]
    assert caffe_spellings(["device_query", "-gpu", "0"]) == ["device-query", "--gpus", "0"]
    # a pycaffe script's flags and a Caffe tool's are theirs
    assert caffe_spellings(["pycaffe", "classify.py", "--gpu", "in.jpg"]) == [
        "pycaffe", "classify.py", "--gpu", "in.jpg"]
    assert caffe_spellings(["extract_features", "-gpu"]) == ["extract_features", "-gpu"]


STAGED = """\
name: staged
layer:
  - {name: data, type: DummyData, top: [data, label],
     dummy_data_param: {shape: [{dim: [2, 6]}, {dim: [2]}],
                        data_filler: [{type: gaussian}, {type: constant, value: 1}]}}
  - {name: ip, type: InnerProduct, bottom: data, top: ip,
     inner_product_param: {num_output: 3, weight_filler: {type: xavier}}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
  - {name: deep, type: Power, bottom: ip, top: deep, include: {min_level: 1}}
  - {name: staged, type: Power, bottom: ip, top: staged, include: {stage: [x, y]}}
  - {name: trained, type: Power, bottom: ip, top: trained, include: {phase: TRAIN}}
"""


def test_phase_level_and_stage_on_test_and_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(STAGED)
    (tmp_path / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.1\nmax_iter: 2\n"
                                          "snapshot_prefix: s/t\nrandom_seed: 1\n")
    assert CliRunner().invoke(cli, ["train", "-solver", "solver.yaml"]).exit_code == 0

    def outputs(*args):
        result = CliRunner().invoke(cli, ["test", "-model", "net.yaml", "-weights",
                                          "s/t_iter_2.pt", "-iterations", "1", *args])
        assert result.exit_code == 0, result.output
        return sorted({line.split(" = ")[0] for line in result.stderr.splitlines()
                       if " = " in line and not line.startswith(("Batch", "Loss"))})

    assert outputs() == ["loss"]
    assert outputs("-level", "1") == ["deep", "loss"]
    assert outputs("-stage", "x,y", "--level=1") == ["deep", "loss", "staged"]
    assert outputs("-stage", "x") == ["loss"]  # both stages are needed
    assert outputs("-phase", "TRAIN") == ["loss", "trained"]
    # caffe time: -phase (default TRAIN), -level, -stage, and -weights
    result = CliRunner().invoke(cli, ["time", "-model", "net.yaml", "-iterations", "1",
                                      "-phase", "TEST", "-stage", "x,y", "-weights",
                                      "s/t_iter_2.pt"])
    assert result.exit_code == 0, result.output
    timed = [line.split("\t")[0].strip() for line in result.stderr.splitlines()
             if "\tforward: " in line]
    assert timed == ["data", "ip", "loss", "staged"]
    result = CliRunner().invoke(cli, ["time", "-model", "net.yaml", "-iterations", "1",
                                      "-weights", "s/t_iter_9.pt"])
    assert (result.exit_code, error_line(result.stderr)) == (
        1, "Error: s/t_iter_9.pt: file not found; check the path")
    # caffe train's -level and -stage: the TRAIN net's state
    result = CliRunner().invoke(cli, ["train", "-solver", "solver.yaml", "-level", "1",
                                      "-stage", "x,y", "--overwrite"])
    assert result.exit_code == 0, result.output
    solver = yaml.safe_load((tmp_path / "s" / "t_solver.yaml").read_text())
    assert solver["train_state"] == {"level": 1, "stage": ["x", "y"]}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA messages")
def test_gpu_flags_without_cuda(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(STAGED)
    (tmp_path / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.1\nmax_iter: 2\n"
                                          "snapshot_prefix: s/t\n")
    for flags, message in ((["-gpu", "all"], "--gpus all: no CUDA device is available; use "
                                             "--gpus cpu"),
                           (["--gpu=0,1"], "--gpus 0,1: no CUDA device is available on this "
                                           "machine; use --gpus cpu")):
        result = CliRunner().invoke(cli, ["train", "-solver", "solver.yaml", *flags])
        assert (result.exit_code, error_line(result.stderr)) == (1, f"Error: {message}")
    result = CliRunner().invoke(cli, ["device_query", "-gpu", "0"])
    assert (result.exit_code, error_line(result.stderr)) == (
        1, "Error: --gpus 0: no CUDA device is available on this machine; use --gpus cpu")
    result = CliRunner().invoke(cli, ["device_query"])
    assert result.exit_code == 0 and result.stdout.startswith("No CUDA device is available")


def test_weights_named_in_the_other_format_name_the_snapshot_that_exists(tmp_path, monkeypatch):
    """-weights x.caffemodel where the run wrote x.pt (and the reverse)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(STAGED)
    (tmp_path / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.1\nmax_iter: 2\n"
                                          "snapshot_prefix: s/t\n")
    assert CliRunner().invoke(cli, ["train", "-solver", "solver.yaml"]).exit_code == 0
    for command in (["test", "-model", "net.yaml", "-iterations", "1"],
                    ["train", "-solver", "solver.yaml", "--overwrite"]):
        result = CliRunner().invoke(cli, [*command, "-weights", "s/t_iter_2.caffemodel"])
        assert (result.exit_code, error_line(result.stderr)) == (1, (
            "Error: s/t_iter_2.caffemodel: file not found; that snapshot is s/t_iter_2.pt "
            "(snapshot_format: pt): give that file, or train with snapshot_format: caffemodel "
            "for .caffemodel files"))
    result = CliRunner().invoke(cli, ["train", "-solver", "solver.yaml", "-snapshot",
                                      "s/t_iter_2.solverstate"])
    assert (result.exit_code, error_line(result.stderr)) == (1, (
        "Error: s/t_iter_2.solverstate: file not found; that snapshot is "
        "s/t_iter_2.solverstate.pt (snapshot_format: pt): give that file, or train with "
        "snapshot_format: caffemodel for .solverstate files"))
    (tmp_path / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.1\nmax_iter: 2\n"
                                          "snapshot_prefix: c/t\nsnapshot_format: BINARYPROTO\n")
    assert CliRunner().invoke(cli, ["train", "-solver", "solver.yaml"]).exit_code == 0
    result = CliRunner().invoke(cli, ["test", "-model", "net.yaml", "-iterations", "1",
                                      "-weights", "c/t_iter_2.pt"])
    assert error_line(result.stderr) == (
        "Error: c/t_iter_2.pt: file not found; that snapshot is c/t_iter_2.caffemodel "
        "(snapshot_format: caffemodel): give that file, or train with snapshot_format: pt for "
        ".pt files")


# What the genuine Caffe 1.0 wrote and printed for snapshot: 2, max_iter: 4, snapshot_prefix:
# "csnaps/t", snapshot_format: BINARYPROTO (/opt/caffe/bin/caffe train, 2026-11-27), and the
# learned_net its solver state names
CAFFE_BINARYPROTO_FILES = ["t_iter_2.caffemodel", "t_iter_2.solverstate",
                           "t_iter_4.caffemodel", "t_iter_4.solverstate"]
CAFFE_SNAPSHOT_LINES = ["Snapshotting to binary proto file csnaps/t_iter_4.caffemodel",
                        "Snapshotting solver state to binary proto file "
                        "csnaps/t_iter_4.solverstate"]


def test_binaryproto_snapshots_have_caffes_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(STAGED)
    (tmp_path / "solver.prototxt").write_text(
        'net: "net.yaml"\nbase_lr: 0.1\nmax_iter: 4\nsnapshot: 2\nsnapshot_prefix: "csnaps/t"\n'
        'snapshot_format: BINARYPROTO\nlr_policy: "fixed"\nsolver_mode: CPU\n')
    (tmp_path / "csnaps").mkdir()
    result = CliRunner().invoke(cli, ["train", "-solver", "solver.prototxt"])
    assert result.exit_code == 0, result.output
    assert snapshot_names(tmp_path / "csnaps") == CAFFE_BINARYPROTO_FILES
    lines = [line.replace(f"{tmp_path}/", "") for line in result.stderr.splitlines()
             if line.startswith("Snapshotting")]
    assert lines[-2:] == CAFFE_SNAPSHOT_LINES
    # SolverState.learned_net (field 2) as Caffe writes it: the path it opened
    state = (tmp_path / "csnaps" / "t_iter_4.solverstate").read_bytes()
    assert state[2:4] == b"\x12\x1a" and state[4:30] == b"csnaps/t_iter_4.caffemodel"
