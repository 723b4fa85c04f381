"""errors.one_line, the one formatter of every message that points into a spec, and
one_line_reason, which quotes another library's message inside one."""
from __future__ import annotations

import pytest

from caffe_py.errors import SpecError, one_line, one_line_reason


@pytest.mark.parametrize(("kwargs", "text"), [
    ({}, "bad"),
    ({"fix": "do this"}, "bad; do this"),
    ({"file": "n.yaml"}, "n.yaml: bad"),
    ({"file": "n.yaml", "line": 3, "path": "layer[0].top"}, "n.yaml:3: layer[0].top: bad"),
    ({"file": "n.prototxt", "line": 3, "column": 7, "fix": "do this"},
     "n.prototxt:3:7: bad; do this"),
    ({"path": "base_lr"}, "base_lr: bad"),
    ({"layer": ("conv1", "Convolution"), "fix": "do this"},
     "layer 'conv1' (Convolution): bad; do this"),
    ({"file": "n.yaml", "line": 5, "path": "layer[1]", "layer": ("ip", "InnerProduct")},
     "n.yaml:5: layer[1]: layer 'ip' (InnerProduct): bad"),
])
def test_one_line_leaves_out_what_is_unknown(kwargs, text):
    assert one_line("bad", **kwargs) == text


def test_spec_error_keeps_its_parts():
    err = SpecError("bad", file="s.yaml", line=2, path="momentum", fix="use 0.9")
    assert (str(err), err.problem, err.file, err.line, err.path, err.fix) == \
        ("s.yaml:2: momentum: bad; use 0.9", "bad", "s.yaml", 2, "momentum", "use 0.9")


@pytest.mark.parametrize("message,want", [
    ("", "ValueError"),
    ("short  and\n spread", "short and spread"),
    ("a first sentence. Then a long paragraph of advice " + "x" * 150,
     "a first sentence"),
    ("word " * 40, ("word " * 23).strip() + "..."),
])
def test_one_line_reason(message, want):
    assert one_line_reason(ValueError(message)) == want
    assert one_line_reason(ValueError("a b c d e f g h"), limit=8) == "a b c..."
