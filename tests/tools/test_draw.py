"""cpy draw: the DOT graph of a net (layers, blobs, edges), one phase's layers, and a picture
through Graphviz when it is installed."""
from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner
from support import TINY_NET

from caffe_py.cli import cli


def test_the_dot_text_names_every_layer_blob_and_edge(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(TINY_NET)
    result = CliRunner().invoke(cli, ["draw", "net.yaml", "-o", "net.dot", "--phase", "TRAIN",
                                      "--rankdir", "TB"])
    assert (result.exit_code, result.stdout) == (0, "wrote net.dot\n")
    lines = (tmp_path / "net.dot").read_text().splitlines()
    assert lines[:2] == ['digraph "tiny" {', "  rankdir=TB;"]
    assert '  layer1 [shape=record, style=filled, fillcolor="#CC33FF", label="ip\\n' \
           '(InnerProduct)\\nnum_output 3"];' in lines
    edges = [line.strip() for line in lines if "->" in line]
    assert edges == ['layer0 -> "blob data";', 'layer0 -> "blob label";',
                     '"blob data" -> layer1;', 'layer1 -> "blob ip";', '"blob ip" -> layer2;',
                     '"blob label" -> layer2;', 'layer2 -> "blob loss";']  # acc is TEST-only
    result = CliRunner().invoke(cli, ["draw", "net.yaml", "-o", "net.jpg"])
    assert (result.exit_code, result.stderr.strip()) == (
        1, "Error: net.jpg: draw writes .dot, .gv, .svg, .png, .pdf; name the file with one "
           "of those")


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")
def test_a_picture_through_graphviz(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(TINY_NET)
    assert CliRunner().invoke(cli, ["draw", "net.yaml", "-o", "net.png"]).exit_code == 0
    assert (tmp_path / "net.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert CliRunner().invoke(cli, ["draw", "net.yaml", "-o", "net.svg"]).exit_code == 0
    assert "<svg" in (tmp_path / "net.svg").read_text()


def test_record_characters_in_a_layer_name_are_escaped(tmp_path):
    """A layer named 'a{b' made a .dot file Graphviz rejects ('bad label format'), and a '|'
    split its node in two fields."""
    from caffe_py.spec.net_spec import parse_net
    from caffe_py.spec.schema import Source
    from caffe_py.spec.yamlio import loads
    from caffe_py.tools.draw import to_dot

    net = parse_net(loads('name: n\ninput: data\ninput_shape: {dim: [2, 3]}\nlayer:\n'
                          '  - {name: "a{b|c<d>\\\\e\\"f", type: ReLU, bottom: data, top: r}\n'),
                    Source())
    text = to_dot(net)
    assert 'label="a\\{b\\|c\\<d\\>\\\\e\\"f\\n(ReLU)"' in text
    if shutil.which("dot"):
        (tmp_path / "n.dot").write_text(text)
        import subprocess

        done = subprocess.run(["dot", "-Tsvg", str(tmp_path / "n.dot")], capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "a{b|c&lt;d&gt;\\e&quot;f" in done.stdout
