"""Importing what caffe-py cannot build yet: layer types it lacks still get their paths moved
and the YAML written, with one warning; blocks of other types move their paths too."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from caffe_py.cli import cli
from caffe_py.errors import SpecError
from caffe_py.spec import yamlio
from caffe_py.spec.net_spec import load_net
from caffe_py.tools.to_yaml import import_file

# FlowNet 2.0's CustomData and Correlation are types of a Caffe fork caffe-py does not have.
SSD_LIKE = """\
name: "flow_like"
layer {
  name: "data"
  type: "CustomData"
  top: "data"
  transform_param { mean_file: "data/mean.binaryproto" }
  data_param { source: "data/FlyingChairs/train_lmdb" batch_size: 2 }
  custom_data_param { label_map_file: "data/labelmap.prototxt" }
}
layer { name: "relu" type: "ReLU" bottom: "data" top: "data" }
layer {
  name: "norm"
  type: "Correlation"
  bottom: "data"
  top: "norm"
}
layer {
  name: "norm2"
  type: "Correlation"
  bottom: "norm"
  top: "norm2"
}
layer {
  name: "conv"
  type: "Convolution"
  bottom: "norm2"
  top: "conv"
  convolution_param { num_output: 2 kernel_size: 1 }
  data_param { source: "data/other_lmdb" }
}
"""


@pytest.fixture
def ssd(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    path = tmp_path / "models" / "ssd.prototxt"
    path.write_text(SSD_LIKE)
    return path


def test_unsupported_types_are_written_with_their_paths_moved(ssd, tmp_path, caplog):
    caplog.set_level(logging.INFO, "caffe_py")
    out = tmp_path / "configs" / "ssd.yaml"
    report = import_file(ssd, out, root=tmp_path)
    assert report.summary == "5 layers"
    assert report.warnings == [
        f"{out}:24: layer[4].data_param: 'data_param' does not apply to a Convolution layer, so "
        "it is ignored (as Caffe ignores it); a Convolution layer takes convolution_param",
        f"the net uses layer type(s) caffe-py does not have yet: CustomData ('data' at "
        f"{ssd}:3), Correlation (2 layers, first 'norm' at {ssd}:12); the rest was checked, and "
        "`cpy net` / `cpy train` will build it once those types exist"]
    assert caplog.records == []  # the import reports them itself
    layers = yamlio.load(out)["layer"]
    assert layers[0]["data_param"]["source"] == "../data/FlyingChairs/train_lmdb"
    assert layers[0]["transform_param"]["mean_file"] == "../data/mean.binaryproto"
    # a fork's own block is carried as written: caffe-py cannot know which fields are paths
    assert layers[0]["custom_data_param"] == {"label_map_file": "data/labelmap.prototxt"}
    # a block Caffe knows on a layer of another type: ignored by Caffe, still moved
    assert layers[4]["data_param"]["source"] == "../data/other_lmdb"
    with pytest.raises(SpecError, match="the net uses 2 layer types caffe-py does not have: "
                                        "'CustomData' "):
        load_net(out)


def test_the_supported_layers_are_still_checked(ssd, tmp_path):
    ssd.write_text(SSD_LIKE.replace("kernel_size: 1", "kernel_sise: 1"))
    out = tmp_path / "ssd.yaml"
    with pytest.raises(SpecError) as info:
        import_file(ssd, out, root=tmp_path)
    assert str(info.value).startswith(
        f"{out}:23: layer[4].convolution_param.kernel_sise: unknown key 'kernel_sise'")


def test_the_command_exits_0_with_a_warning(ssd, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["import-prototxt", "models/ssd.prototxt", "ssd.yaml"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "wrote ssd.yaml: 5 layers\n"
    assert result.stderr.splitlines()[-2:] == [
        "warning: ssd.yaml:24: layer[4].data_param: 'data_param' does not apply to a "
        "Convolution layer, so it is ignored (as Caffe ignores it); a Convolution layer takes "
        "convolution_param",
        "warning: the net uses layer type(s) caffe-py does not have yet: CustomData ('data' "
        "at models/ssd.prototxt:3), Correlation (2 layers, first 'norm' at "
        "models/ssd.prototxt:12); the rest was checked, and `cpy net` / `cpy train` will build "
        "it once those types exist"]
