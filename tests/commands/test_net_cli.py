"""`cpy net`: a net is built without its databases; a missing one needs --input-shape."""
from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner
from support import write_db

from caffe_py.cli import cli
from caffe_py.io.formats.datum import Datum

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CIFAR_DATA = """
name: crop
state: {phase: TEST}
layer:
  - name: cifar
    type: Data
    top: [data, label]
    transform_param: {crop_size: 24, mirror: true, mean_file: missing_mean.binaryproto}
    data_param: {source: no_such_lmdb, batch_size: 10}
  - {name: ip, type: InnerProduct, bottom: data, top: ip, inner_product_param: {num_output: 2}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label]}
"""

CROPPED = ["cifar", "Data", "data", "[10,", "3,", "24,", "24]", "0"]


def run(*args: str):
    return CliRunner().invoke(cli, ["net", *args])


def test_a_missing_database_asks_for_the_record_shape(tmp_path):
    config = tmp_path / "lenet.yaml"
    shutil.copy(CONFIGS / "lenet.yaml", config)
    result = run(str(config))
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {config}:5: layer[0]: layer 'mnist' (Data): database "
        f"{tmp_path.parent / 'data' / 'fashion_mnist' / 'train_lmdb'} does not exist, so its "
        "record shape is unknown; give it, e.g. cpy net --input-shape data=C,H,W (or create "
        "the database)\n")
    result = run(str(config), "--input-shape", "data=1,28,28")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2].split() == ["mnist", "Data", "data", "[64,", "1,",
                                                     "28,", "28]", "0"]


def test_the_crop_decides_the_shape_and_no_mean_file_is_read(tmp_path):
    config = tmp_path / "crop.yaml"
    config.write_text(CIFAR_DATA)
    result = run(str(config), "--input-shape", "cifar=3,32,32")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "net 'crop' (TEST)"  # the net's own state.phase
    assert lines[2].split() == CROPPED
    assert lines[-2:] == ["3 layers, 3,458 learnable parameters (0.01 MiB as float32)",
                          "inputs: none; outputs: none; loss: 1 * (automatic)"]


def test_an_existing_database_gives_the_record_shape(tmp_path):
    config = tmp_path / "crop.yaml"
    config.write_text(CIFAR_DATA.replace(", mean_file: missing_mean.binaryproto", ""))
    write_db(tmp_path / "no_such_lmdb", [Datum(3, 30, 28, data=bytes(3 * 30 * 28), label=1)])
    result = run(str(config), "--phase", "TRAIN")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[2].split() == CROPPED


def test_a_bad_input_shape_is_a_usage_error(tmp_path):
    config = tmp_path / "crop.yaml"
    config.write_text(CIFAR_DATA)
    result = run(str(config), "--input-shape", "cifar=3,0,32")
    assert result.exit_code == 1
    assert "Invalid value for --input-shape: 'cifar=3,0,32' is not NAME=C,H,W (positive sizes, " \
           "e.g. data=3,256,256; an HDF5Data top: one row's shape, label= for a scalar)" \
        in result.stderr
    result = run(str(config), "--input-shape", "cifar=3,32")
    assert result.exit_code == 1
    assert result.stderr.endswith("layer 'cifar' (Data): the record shape given for 'cifar' has "
                                  "2 sizes; its records are C,H,W; give e.g. --input-shape "
                                  "cifar=3,256,256\n")
    result = run(str(config), "--input-shape", "cifar=3,16,16")
    assert result.exit_code == 1
    assert result.stderr.endswith("layer 'cifar' (Data): transform_param.crop_size 24 is larger "
                                  "than the records (3 x 16 x 16); use a smaller crop_size\n")
