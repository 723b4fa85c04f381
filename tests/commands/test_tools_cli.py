"""`cpy import-prototxt`: output lines, notes, files left behind and exact error messages."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from caffe_py.cli import cli
from caffe_py.spec.solver_spec import load_solver

FIXTURES = Path(__file__).resolve().parents[1] / "tools" / "fixtures"


def _run(*args: str):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert "Traceback" not in result.output + result.stderr
    return result


@pytest.fixture
def caffe_root(tmp_path, monkeypatch):
    """Run from a miniature Caffe checkout, as Caffe users do."""
    (tmp_path / "examples" / "mnist").mkdir(parents=True)
    for name in ("lenet_train_test", "lenet_solver", "lenet_v1"):
        shutil.copy(FIXTURES / f"{name}.prototxt", tmp_path / "examples" / "mnist")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_solver_then_the_net_it_names(caffe_root):
    result = _run("import-prototxt", "examples/mnist/lenet_solver.prototxt",
                  "configs/lenet_solver.yaml")
    assert result.exit_code == 0
    assert result.stdout == ("wrote configs/lenet_solver.yaml: solver SGD, lr_policy inv, "
                             "max_iter 10000\n")
    assert result.stderr.splitlines() == [
        "note: net: examples/mnist/lenet_train_test.prototxt is now lenet_train_test.yaml; "
        "import it too: cpy import-prototxt examples/mnist/lenet_train_test.prototxt "
        "configs/lenet_train_test.yaml",
        f"note: relative paths were rewritten from {caffe_root} (where Caffe ran; --caffe-root) "
        f"to be relative to {caffe_root / 'configs'}"]
    # follow the note, then the solver finds its net
    result = _run("import-prototxt", "examples/mnist/lenet_train_test.prototxt",
                  "configs/lenet_train_test.yaml")
    assert result.exit_code == 0
    assert result.stdout == "wrote configs/lenet_train_test.yaml: 11 layers\n"
    net, state = load_solver(caffe_root / "configs" / "lenet_solver.yaml").train_net_spec()
    assert state.phase == "TRAIN" and net.name == "LeNet" and len(net.layer) == 11
    assert sorted(p.name for p in (caffe_root / "configs").iterdir()) == [
        "lenet_solver.yaml", "lenet_train_test.yaml"]  # no temp files left behind


def test_v1_net_and_kind_flag(caffe_root):
    result = _run("import-prototxt", "examples/mnist/lenet_v1.prototxt", "v1.yaml",
                  "--kind", "net")
    assert result.exit_code == 0
    assert result.stdout == "wrote v1.yaml: 9 layers\n"
    assert result.stderr.splitlines() == [
        "note: moved scale from data_param to transform_param (as Caffe's "
        "UpgradeNetDataTransformation)",
        "note: upgraded 9 V1 'layers' blocks to 'layer' (as Caffe's UpgradeV1Net)"]
    assert "  - name: conv1\n    type: Convolution\n" in (caffe_root / "v1.yaml").read_text()


def test_caffe_root_option(caffe_root, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    out = elsewhere / "lenet.yaml"
    result = _run("import-prototxt", caffe_root / "examples/mnist/lenet_train_test.prototxt", out,
                  "--caffe-root", caffe_root)
    assert result.exit_code == 0
    text = out.read_text()
    source = Path(elsewhere, _line_value(text, "source")).resolve()
    assert source == (caffe_root / "examples/mnist/mnist_train_lmdb").resolve()


def _line_value(text: str, key: str) -> str:
    return next(line.split(": ", 1)[1] for line in text.splitlines()
                if line.strip().startswith(f"{key}:"))


def test_kind_given_wrongly_fails_validation(caffe_root):
    result = _run("import-prototxt", "examples/mnist/lenet_solver.prototxt", "s.yaml",
                  "--kind", "net")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: s.yaml:3: net: unknown key 'net' in NetParameter; ")
    assert result.stderr.endswith("it comes from examples/mnist/lenet_solver.prototxt:2; s.yaml "
                                  "was written, so fix it there (or fix the prototxt and import "
                                  "again)\n")


@pytest.mark.parametrize("text, error", [
    ("layer {\n  name: 'a'\n", "Error: bad.prototxt:3:1: end of file inside the block opened "
                               "at 1:7; close it with '}'\n"),
    ("name: 'x'\n", "Error: bad.prototxt: cannot tell whether this is a net or a solver: it has "
                    "no 'layer'/'layers' and no 'base_lr'/'net'/'train_net'; pass --kind net or "
                    "--kind solver\n"),
    ("layers { type: CONV }", "Error: bad.prototxt:1:10: unknown V1 layer type 'CONV'; did you "
                              "mean CONCAT? V1 types: "),
])
def test_errors_are_one_line_and_write_nothing(caffe_root, text, error):
    Path("bad.prototxt").write_text(text)
    result = _run("import-prototxt", "bad.prototxt", "out/bad.yaml")
    assert result.exit_code == 1
    assert result.stderr.startswith(error) and result.stderr.count("\n") == 1
    assert not Path("out/bad.yaml").exists()


def test_missing_input(caffe_root):
    result = _run("import-prototxt", "nope.prototxt", "x.yaml")
    assert result.exit_code == 1
    assert result.stderr == ("Error: nope.prototxt: file not found; check the path (relative to "
                             "the current directory)\n")


def test_listed_in_help():
    result = _run("--help")
    assert "import-prototxt" in result.stdout
    result = _run("import-prototxt", "--help")
    assert "Convert the Caffe prototxt IN to the YAML spec OUT" in result.stdout
