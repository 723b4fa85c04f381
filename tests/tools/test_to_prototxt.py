"""A net written back as Caffe's text format, and `cpy upgrade_net_proto_text` against the
genuine tool's output (fixtures made by BVLC Caffe 1.0's upgrade_net_proto_text)."""
from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner
from support import error_line

from caffe_py.cli import cli
from caffe_py.spec.net_spec import load_net
from caffe_py.tools.prototxt import Ident, Message, parse, parse_file
from caffe_py.tools.to_prototxt import net_prototxt

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def proto(value):
    """A parsed prototxt as protobuf compares it: each field's values in order, fields in any
    order, enums apart from strings. (Caffe's data_param.backend defaults to LEVELDB, which
    caffe-py's YAML writes out, so that default is left out.)"""
    if isinstance(value, Message):
        out: dict = {}
        for f in value.fields:
            if f.name == "backend" and f.value == "LEVELDB":
                continue
            out.setdefault(f.name, []).append(proto(f.value))
        return out
    if isinstance(value, Ident):
        return ("word", str(value))
    return ("text", value) if isinstance(value, str) else ("number", float(value))


def upgrade(tmp_path, source, out_name="out.prototxt"):
    result = CliRunner().invoke(cli, ["upgrade_net_proto_text", str(source),
                                      str(tmp_path / out_name)])
    assert result.exit_code == 0, result.output
    return result, tmp_path / out_name


def test_v1_and_v0_nets_upgrade_to_what_caffes_tool_writes(tmp_path):
    for source, caffes in ((FIXTURES / "lenet_v1.prototxt", "lenet_v1_upgraded.prototxt"),
                           (FIXTURES / "v0" / "twotops_v0.prototxt", "v0/twotops_v2.prototxt")):
        result, out = upgrade(tmp_path, source)
        assert proto(parse_file(out)) == proto(parse_file(FIXTURES / caffes)), source
    assert result.stderr.splitlines() == [
        f"Attempting to upgrade input file specified using deprecated V0LayerParameter: "
        f"{source}",
        "Successfully upgraded file specified using deprecated V0LayerParameter",
        f"Attempting to upgrade input file specified using deprecated V1LayerParameter: "
        f"{source}",
        "Successfully upgraded file specified using deprecated V1LayerParameter",
        f"Wrote upgraded NetParameter text proto to {out}"]


def test_strings_enums_and_blocks_are_written_as_protobuf_prints_them():
    data = {"name": "n", "layer": [
        {"name": "pool", "type": "Pooling", "bottom": "x", "top": ["y"],
         "include": [{"phase": "TEST"}],
         "pooling_param": {"pool": "MAX", "kernel_size": 2, "global_pooling": False},
         "convolution_param": {"weight_filler": {"type": "xavier", "std": 0.5}}},
        {"name": "fork", "type": "Upsample", "upsample_param": {"mode": "NEAREST",
                                                                 "scale": 2}}]}
    assert net_prototxt(data) == """\
name: "n"
layer {
  name: "pool"
  type: "Pooling"
  bottom: "x"
  top: "y"
  include {
    phase: TEST
  }
  pooling_param {
    pool: MAX
    kernel_size: 2
    global_pooling: false
  }
  convolution_param {
    weight_filler {
      type: "xavier"
      std: 0.5
    }
  }
}
layer {
  name: "fork"
  type: "Upsample"
  upsample_param {
    mode: NEAREST
    scale: 2
  }
}
"""
    assert proto(parse(net_prototxt({"name": 'a "quoted"\nname'}))) == {
        "name": [("text", 'a "quoted"\nname')]}


def test_a_current_net_is_kept_and_a_yaml_out_is_caffe_pys_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    current = FIXTURES / "lenet_v1_upgraded.prototxt"
    result, out = upgrade(tmp_path, current)
    assert result.stderr.splitlines()[0] == f"File already in latest proto format: {current}"
    assert proto(parse_file(out)) == proto(parse_file(current))
    result, out = upgrade(tmp_path, FIXTURES / "lenet_v1.prototxt", "lenet.yaml")
    assert result.stderr.splitlines()[-1] == (
        f"Wrote upgraded NetParameter as caffe-py's YAML spec to {out}")
    net = load_net(out)
    assert [layer.type for layer in net.layer][:3] == ["Data", "Data", "Convolution"]
    assert yaml.safe_load(out.read_text())["layer"][0]["transform_param"] == {
        "scale": 0.00390625}


def test_upgrade_errors_are_one_line(tmp_path):
    result = CliRunner().invoke(cli, ["upgrade_net_proto_text", str(tmp_path / "none.prototxt"),
                                      "out.prototxt"])
    assert (result.exit_code, error_line(result.stderr)) == (
        1, f"Error: {tmp_path / 'none.prototxt'}: file not found; check the path (relative to "
           "the current directory)")
    result = CliRunner().invoke(cli, ["upgrade_net_proto_text", "only_one.prototxt"])
    assert (result.exit_code, error_line(result.stderr)) == (
        1, "Error: upgrade_net_proto_text: expected 2 arguments, got 1; usage: cpy "
           "upgrade_net_proto_text v0_net_proto_file_in net_proto_file_out")
