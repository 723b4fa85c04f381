"""Real Caffe prototxts (tests/fixtures/prototxts/corpus.yaml) import and build.

Each file is imported with ``cpy import-prototxt``'s library and built for its phases and
stages without its databases (the net option ``record_shapes``, as ``cpy net`` does). Where
the genuine Caffe 1.0 (or, for a net of a fork, the genuine fork: ``fork``) built the file
(``caffe``), the learnable values and every blob's name and shape must equal its; where a
published count exists (``published``), the count must equal it. A file that needs layer
types caffe-py does not have yet (``needs``, as far as the spec's table lacks them) is
expected to fail until they exist; a file of external/ that has not been collected is
skipped. ``templates`` are filled before the import, as the project's scripts fill them.
"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import yaml
from support import load_script

from caffe_py.errors import SpecError
from caffe_py.net import Net
from caffe_py.spec import layer_params
from caffe_py.spec.net_spec import load_net
from caffe_py.tools.to_yaml import import_file

CORPUS = Path(__file__).parent / "fixtures" / "prototxts"
ENTRIES = yaml.safe_load((CORPUS / "corpus.yaml").read_text())["files"]
BIG = 30_000_000  # learnable values: building takes seconds on two cores


def _caffe_counts():
    return load_script(CORPUS / "caffe_counts.py")


shapes_digest = _caffe_counts().shapes_digest


def _size(entry: dict) -> int:
    return max(entry.get("caffe", {}).get("params", 0),
               entry.get("published", {}).get("params", 0))


def _cases():
    for entry in ENTRIES:
        marks = []
        missing = [t for t in entry.get("needs", []) if t not in layer_params.LAYER_PARAMS]
        if missing:
            kinds = ", ".join(missing)
            marks.append(pytest.mark.xfail(strict=True, raises=SpecError,
                                           reason=f"needs layer type {kinds}"))
        if _size(entry) > BIG:
            marks.append(pytest.mark.slow)
        yield pytest.param(entry, id=entry["file"], marks=marks)


def _states(entry: dict, text: str) -> list[dict]:
    """The (phase, stage) pairs to build: as listed, else both phases for a file with phase
    rules and TEST for one without (a deploy net)."""
    if "states" in entry:
        return entry["states"]
    return [{"phase": "TRAIN"}, {"phase": "TEST"}] if "phase" in text else [{"phase": "TEST"}]


@pytest.fixture
def python_layers(monkeypatch):
    """The corpus's stand-in Python layer modules are importable (as on Caffe's PYTHONPATH)."""
    monkeypatch.syspath_prepend(str(CORPUS / "pylayers"))
    yield
    for name in ("_base", "pyloss", "voc_layers", "siftflow_layers", "sequence_input_layer",
                 "spatial_dropout", "roi_data_layer", "roi_data_layer.layer", "rpn",
                 "rpn._params", "rpn.anchor_target_layer", "rpn.proposal_layer",
                 "rpn.proposal_target_layer"):
        sys.modules.pop(name, None)


@pytest.mark.usefixtures("python_layers")
@pytest.mark.parametrize("entry", _cases())
def test_prototxt_imports_and_builds(entry, tmp_path):
    path = CORPUS / entry["file"]
    if not path.is_file():
        pytest.skip("not collected: python tests/fixtures/prototxts/collect.py --mirror DIR")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
    if "templates" in entry:  # filled as the project's scripts fill them before Caffe runs
        text = path.read_text()
        for name, value in entry["templates"].items():
            text = text.replace("${" + name + "}", str(value))
        path = tmp_path / path.name
        path.write_text(text)
    import_file(path, tmp_path / "net.yaml", root=path.parent)
    spec = load_net(tmp_path / "net.yaml")
    shapes = {name: tuple(shape) for name, shape in entry.get("record_shapes", {}).items()}
    counts = {}
    for state in _states(entry, path.read_text()):
        net = Net(spec, state["phase"], stages=state.get("stage", ()),
                  options={"record_shapes": shapes})
        counts[state["phase"]] = sum(row.params for row in net.summary())
        if state["phase"] == "TEST" and "caffe" in entry:
            assert counts["TEST"] == entry["caffe"]["params"]
            assert shapes_digest(net.blobs) == entry["caffe"]["blobs_sha256"]
        del net
    for expected in (entry.get("published", {}).get("params"), entry.get("params")):
        if expected is not None:
            assert set(counts.values()) == {expected}
