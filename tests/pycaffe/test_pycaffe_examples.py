"""BVLC's pycaffe examples, run unchanged under ``python -m caffe_py.pycaffe``, against what
the genuine pycaffe printed, plotted and wrote (fixtures/, made by
tools/oracles/pycaffe/make_fixtures.py; that directory's README says how).

Each case is prepared as the fixtures were (tools/oracles/pycaffe/prep.py: the exported
scripts, toy data and random weights instead of downloads, the documented substitutions),
checked to hold the very inputs the fixtures were made from, run, and compared by
tools/oracles/pycaffe/compare.py: every printed number and every recorded array within the
case's tolerance.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

ORACLE = Path(__file__).resolve().parents[2] / "tools" / "oracles" / "pycaffe"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
sys.path.insert(0, str(ORACLE))

from compare import compare  # noqa: E402
from prep import digest, prepare  # noqa: E402
from pycaffe_cases import CASES  # noqa: E402
from runs import run_case  # noqa: E402

pytest.importorskip("google.protobuf")
pytest.importorskip("skimage")


def _needs(name: str) -> None:
    if name.startswith("draw_net"):
        pytest.importorskip("pydot")
        if shutil.which("dot") is None:
            pytest.skip("Graphviz's dot is not installed (pycaffe's draw needs it too)")
    if name == "net_surgery" and shutil.which("diff") is None:
        pytest.skip("the notebook shells out to diff, which is not installed")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CASES))
def test_example_prints_and_draws_what_bvlc_pycaffe_does(name, tmp_path):
    _needs(name)
    case = CASES[name]
    work = tmp_path / "work"
    prepare(name, work)
    expected = json.loads((FIXTURES / name / "inputs.json").read_text())
    assert digest(work) == expected, "the prepared inputs are not the ones the fixtures were " \
                                     "made from: run make_fixtures.py again"
    run_case(case, work, tmp_path / "out", "caffe-py", timeout=900)
    assert compare(FIXTURES / name, tmp_path / "out", case) == []


def test_the_exported_scripts_are_unchanged_but_for_the_listed_substitutions(tmp_path):
    """prep.py's substitutions are the only edits between caffe_tree/ and a workspace."""
    import prep

    for name, case in CASES.items():
        script = case["script"]
        original = (prep.TREE / script).read_text() if (prep.TREE / script).exists() else None
        if original is None:
            continue
        expected = original
        for old, new, _why, _times in prep.SUBSTITUTIONS.get(script, []):
            expected = expected.replace(old, new)
        target = tmp_path / name / script
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(original)
        if script in prep.SUBSTITUTIONS:
            prep.substitute(target, script)
        assert target.read_text() == expected
