"""The package metadata: every subpackage is listed, and a wheel carries the code, the CUDA
sources and the shipped configs."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import caffe_py
from caffe_py.cli import cli

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_subpackage_is_listed_for_the_wheel():
    tree = {".".join(p.parent.relative_to(ROOT).parts)
            for p in (ROOT / "caffe_py").rglob("__init__.py")}
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    assert listed == tree | {"caffe_py.configs"}


def test_configs_dir_is_the_checkouts_configs_folder():
    assert caffe_py.configs_dir() == ROOT / "configs"


def test_cpy_prints_the_configs_dir():
    result = CliRunner().invoke(cli, ["--configs-dir"])
    assert (result.exit_code, result.output) == (0, f"{ROOT / 'configs'}\n")


def test_the_version_comes_from_the_package():
    assert _pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "caffe_py.__version__"}
    result = CliRunner().invoke(cli, ["--version"])
    assert result.output == f"cpy, version {caffe_py.__version__}\n"


def test_the_wheel_carries_code_kernel_sources_and_configs(tmp_path):
    # built with the installed setuptools, which must meet pyproject.toml's build requirement
    pytest.importorskip("setuptools", minversion="77")
    source = tmp_path / "src"
    for name in ("pyproject.toml", "setup.cfg", "README.md"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    for folder in ("caffe_py", "configs"):
        shutil.copytree(ROOT / folder, source / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist"), str(source)], check=True,
                   capture_output=True, timeout=300)
    wheel, = (tmp_path / "dist").glob("caffe_py-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = archive.read(
            f"caffe_py-{caffe_py.__version__}.dist-info/entry_points.txt").decode()
    configs = {f"caffe_py/configs/{p.name}" for p in (ROOT / "configs").glob("*.yaml")}
    csrc = ROOT / "caffe_py" / "kernels" / "csrc"
    sources = {f"caffe_py/kernels/csrc/{p.name}" for p in csrc.iterdir()}
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "caffe_py").rglob("*.py")}
    assert configs | sources | modules <= names
    assert {"caffe_py/py.typed", "caffe_py/__main__.py"} <= names
    assert "caffe_py/configs/mnist.yaml" in configs
    assert "cpy = caffe_py.cli:main" in entry_points


def test_python_dash_m_caffe_py_runs_the_command_line():
    result = subprocess.run([sys.executable, "-m", "caffe_py", "--version"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout) == (0, f"cpy, version {caffe_py.__version__}\n")
    result = subprocess.run([sys.executable, "-m", "caffe_py", "train", "--solver",
                             "missing.yaml"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith("Error: ")


def test_the_api_names_are_listed_and_typed_for_checkers():
    import ast

    api = {"load_net", "deploy_spec", "predict", "train_solver"}
    assert api <= set(dir(caffe_py)) and api <= set(caffe_py.__all__)
    assert {"configs_dir", "CaffePyError"} <= set(dir(caffe_py))
    # mypy and IDEs read plain imports under TYPE_CHECKING (at run time they load on use)
    tree = ast.parse((ROOT / "caffe_py" / "__init__.py").read_text())
    guarded = [node for node in tree.body if isinstance(node, ast.If)
               and ast.unparse(node.test) == "TYPE_CHECKING"]
    imported = {alias.name for node in guarded for stmt in node.body
                if isinstance(stmt, ast.ImportFrom) and stmt.module == "api"
                for alias in stmt.names}
    assert imported == api
    assert (ROOT / "caffe_py" / "py.typed").is_file()
    assert caffe_py.load_net.__module__ == "caffe_py.api"
