"""Caffe's tools under their own names (convert_imageset, compute_image_mean,
convert_mnist_data, upgrade_net_proto_text, extract_features), their arguments read as gflags
reads them."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from support import error_line

from caffe_py.cli import cli
from caffe_py.commands.caffe_tools import GFlag, GFlagsError, parse_gflags

FLAGS = [GFlag("gray", bool, False, ""), GFlag("shuffle", bool, False, ""),
         GFlag("backend", str, "lmdb", ""), GFlag("resize_width", int, 0, "")]


def test_gflags_spellings():
    values, positional = parse_gflags("t", ["--resize_width=32", "ROOT/", "-backend", "leveldb",
                                            "--shuffle", "list.txt", "-gray=false", "DB"],
                                      FLAGS)
    assert values == {"gray": False, "shuffle": True, "backend": "leveldb", "resize_width": 32}
    assert positional == ["ROOT/", "list.txt", "DB"]
    values, positional = parse_gflags("t", ["-nogray", "--resize-width", "8", "-shuffle=yes",
                                            "--", "-x"], FLAGS)
    assert values == {"gray": False, "shuffle": True, "backend": "lmdb", "resize_width": 8}
    assert positional == ["-x"]
    cases = {("-bogus",): "t: unknown flag -bogus (its flags: -gray, -shuffle, -backend, "
                          "-resize_width)",
             ("-resize_width=x",): "t: -resize_width=x: expected an integer",
             ("-gray=maybe",): "t: -gray=maybe: expected true or false",
             ("-backend",): "t: flag -backend is missing its value"}
    for args, message in cases.items():
        with pytest.raises(GFlagsError) as err:
            parse_gflags("t", args, FLAGS)
        assert err.value.message == message


def test_a_tools_usage_error_is_one_line():
    result = CliRunner().invoke(cli, ["upgrade_net_proto_text", "-x", "a", "b"])
    assert (result.exit_code, error_line(result.stderr)) == (
        1, "Error: upgrade_net_proto_text: unknown flag -x (its flags: none)")
    result = CliRunner().invoke(cli, ["upgrade_net_proto_text", "--help"])
    assert result.exit_code == 0 and "Usage: cpy upgrade_net_proto_text v0_net_proto_file_in " \
        "net_proto_file_out" in result.stdout


def test_single_dash_flags_holding_an_h_run_the_tool(tmp_path):
    """-shuffle, -resize_height and -check_size are flags, not click's -h in a cluster of short
    options (which printed the help and converted nothing, exit status 0)."""
    import cv2
    import numpy as np

    (tmp_path / "img").mkdir()
    for i in range(3):
        cv2.imwrite(str(tmp_path / "img" / f"{i}.png"), np.full((6, 5, 3), 40 * i, np.uint8))
    (tmp_path / "list.txt").write_text("0.png 0\n1.png 1\n2.png 2\n")
    result = CliRunner().invoke(cli, ["convert_imageset", "-shuffle", "-resize_height=4",
                                      "-resize_width=3", "-check_size", f"{tmp_path}/img/",
                                      str(tmp_path / "list.txt"), str(tmp_path / "db")])
    assert result.exit_code == 0, result.output
    assert "Usage:" not in result.output
    from caffe_py.io.formats.datum import decode_datum

    shapes = {(d.channels, d.height, d.width) for d in
              (decode_datum(bytes.fromhex(v)) for _, v in _records(tmp_path / "db"))}
    assert (len(_records(tmp_path / "db")), shapes) == (3, {(3, 4, 3)})
    for flag in ("-h", "-help", "--help"):
        result = CliRunner().invoke(cli, ["convert_imageset", flag])
        assert result.exit_code == 0 and "Usage: cpy convert_imageset [FLAGS] ROOTFOLDER/ " \
            "LISTFILE DB_NAME" in result.stdout


FIXTURE = Path(__file__).resolve().parent / "fixtures" / "caffe_tools"


def _records(path: Path) -> list[list[str]]:
    from caffe_py.io.db.lmdb_store import open_db

    with open_db(path) as reader:
        return [[k.decode(), bytes(v).hex()] for k, v in reader]


def test_caffes_converters_under_their_names_write_what_caffes_wrote(tmp_path, monkeypatch):
    """The scripts' own lines (make_caffe_tools_fixture.RUNS), run with cpy in front: the same
    databases and mean file as the genuine tools wrote, byte for byte, and Caffe's log lines."""
    sys.path.insert(0, str(FIXTURE))
    try:
        from make_caffe_tools_fixture import RUNS, inputs
    finally:
        sys.path.remove(str(FIXTURE))
    monkeypatch.chdir(tmp_path)
    inputs(tmp_path)
    caffe = json.loads((FIXTURE / "caffe.json").read_text())
    logs = {}
    for name, (tool, args) in RUNS.items():
        result = CliRunner().invoke(cli, [*tool, *args])
        assert result.exit_code == 0, result.output
        assert _records(tmp_path / args[-1]) == caffe[name], name
        logs[name] = result.stderr.splitlines()
    assert logs["imageset_resized"] == ["A total of 5 images.", "Processed 5 files."]
    assert logs["mnist"] == ["A total of 4 items.", "Processed 4 files."]
    result = CliRunner().invoke(cli, ["compute_image_mean", "-backend", "lmdb", "resized_lmdb",
                                      "mean.binaryproto"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "mean.binaryproto").read_bytes().hex() == caffe["mean"]
    assert result.stderr.splitlines()[:4] == ["Starting iteration", "Processed 5 files.",
                                             "Write to mean.binaryproto",
                                             "Number of channels: 3"]
    assert [line.split(":")[0] for line in result.stderr.splitlines()[4:]] == [
        f"mean_value channel [{c}]" for c in range(3)]
    # without OUTPUT_FILE it only prints, as Caffe's
    result = CliRunner().invoke(cli, ["compute_image_mean", "resized_lmdb"])
    assert result.exit_code == 0 and "Write to" not in result.stderr


def test_a_caffe_tool_refuses_in_one_line(tmp_path):
    result = CliRunner().invoke(cli, ["convert_imageset", "--resize_height", "img/", "l", "db"])
    assert (result.exit_code, error_line(result.stderr)) == (
        1, "Error: convert_imageset: -resize_height=img/: expected an integer")
    result = CliRunner().invoke(cli, ["convert_imageset", "img/", "list.txt"])
    assert (result.exit_code, error_line(result.stderr)) == (
        1, "Error: convert_imageset: expected 3 arguments, got 2; usage: cpy convert_imageset "
           "[FLAGS] ROOTFOLDER/ LISTFILE DB_NAME")
    result = CliRunner().invoke(cli, ["compute_image_mean", "-backend", "lmdb",
                                      str(tmp_path / "none")])
    assert result.exit_code == 1 and error_line(result.stderr).startswith(
        f"Error: {tmp_path / 'none'}: ")
