"""Caffe's tools under their own names (convert_imageset, compute_image_mean,
convert_mnist_data, upgrade_net_proto_text, extract_features), their arguments read as gflags
reads them."""
from __future__ import annotations

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
