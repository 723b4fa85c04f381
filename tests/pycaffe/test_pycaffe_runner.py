"""``python -m caffe_py.pycaffe SCRIPT`` and ``cpy pycaffe SCRIPT``: an unchanged pycaffe
script with ``import caffe`` resolved to caffe_py.pycaffe for that process only."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import caffe_py.pycaffe as caffe
from caffe_py.pycaffe import runner

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys
import caffe
import caffe.io
from caffe import layers as L
from caffe.proto import caffe_pb2
import caffe_py.pycaffe
print(caffe is caffe_py.pycaffe, caffe.io is caffe_py.pycaffe.io, L is caffe_py.pycaffe.layers)
print(caffe_pb2.__name__, sys.argv[1:], __name__)
"""


def _run(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


@pytest.mark.slow  # a new interpreter that imports torch
def test_python_m_runs_a_script_with_caffe_resolved(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    done = _run("-m", "caffe_py.pycaffe", str(script), "a", "--b")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["True True True",
                                        "caffe_py.pycaffe.proto.caffe_pb2 ['a', '--b'] __main__"]


@pytest.mark.slow  # a new interpreter that imports torch
def test_cpy_pycaffe_runs_it_too_with_the_log_on_stderr(tmp_path):
    script = tmp_path / "s.py"
    script.write_text(SCRIPT + textwrap.dedent("""
        open("n.prototxt", "w").write('input: "d" input_shape { dim: 1 }')
        caffe.Net("n.prototxt", caffe.TEST)
    """))
    done = _run(str(REPO / "cli.py"), "pycaffe", str(script), "--help", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == "caffe_py.pycaffe.proto.caffe_pb2 ['--help'] __main__"
    assert "n.prototxt is a Caffe prototxt" in done.stderr


@pytest.mark.slow  # a new interpreter that imports torch
def test_errors_exit_with_one_line(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import caffe\ncaffe.Net('missing.prototxt', caffe.TEST)\n")
    done = _run("-m", "caffe_py.pycaffe", str(script))
    assert (done.returncode, done.stderr.strip()) == (1, "Error: Could not open file "
                                                         "missing.prototxt")
    script.write_text("import caffe.coord_map\n")
    done = _run("-m", "caffe_py.pycaffe", str(script))
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "Error: caffe.coord_map is not covered by caffe-py's pycaffe; the nearest covered "
        "module is caffe.draw (docs/pycaffe.md lists what is covered)")
    done = _run("-m", "caffe_py.pycaffe", str(tmp_path / "none.py"))
    assert (done.returncode, done.stderr.strip()) == (
        2, f"Error: {tmp_path / 'none.py'}: no such file (give the pycaffe script to run)")
    done = _run("-m", "caffe_py.pycaffe")
    assert done.returncode == 2 and done.stderr.startswith("usage: python -m caffe_py.pycaffe")


def test_importing_the_package_does_not_shadow_a_real_caffe():
    assert "caffe" not in sys.modules or sys.modules["caffe"] is not caffe
    assert not any(isinstance(f, runner.CaffeAlias) for f in sys.meta_path)


def test_an_uncovered_module_name_is_one_line():
    with pytest.raises(AttributeError) as info:
        _ = caffe.Solverr
    assert str(info.value) == ("caffe.Solverr is not covered by caffe-py's pycaffe; the "
                               "nearest covered name is caffe.Solver (docs/pycaffe.md lists "
                               "what is covered)")
    assert caffe.__version__ == "1.0.0" and caffe.TRAIN == 0 and caffe.TEST == 1
    assert "Convolution" in caffe.layer_type_list()


def test_caffe_pb2_is_reached_through_the_package_after_a_plain_import(tmp_path):
    """``import caffe`` then ``caffe.proto.caffe_pb2``, as pycaffe's own package imports it."""
    script = tmp_path / "s.py"
    script.write_text("import caffe\nprint(caffe.proto.caffe_pb2.NetParameter().name == '')\n")
    done = subprocess.run([sys.executable, "-m", "caffe_py.pycaffe", str(script)],
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "True\n"), done.stderr[-2000:]
