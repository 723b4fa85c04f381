"""The extension build: cache directory, one-line errors, one attempt and one warning, and
`cpy build-ext`. The compiler itself is replaced here; the GPU tests build for real."""
from __future__ import annotations

import logging
import types
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from caffe_py.cli import cli
from caffe_py.kernels import build


@pytest.fixture(autouse=True)
def fresh_build_state():
    build.reset()
    yield
    build.reset()


def test_build_dir_honours_torch_extensions_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    d = build.build_dir()
    assert d.parent == tmp_path / "caffe_py"
    assert d.name.startswith("torch") and "_cu" in d.name
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert build.build_dir().parent == tmp_path / "home" / ".cache" / "caffe_py" / \
        "torch_extensions"


def test_first_error_line_is_picked_from_compiler_output():
    exc = RuntimeError("Error building extension 'caffe_py_kernels': [1/3] nvcc ...\n"
                       "FAILED: channel.cuda.o\n"
                       "channel.cu(12): error: identifier \"foo\" is undefined\n"
                       "2 errors detected")
    assert build._first_error(exc) == 'channel.cu(12): error: identifier "foo" is undefined'
    assert build._first_error(OSError("Ninja is required to load C++ extensions")) == \
        "Ninja is required to load C++ extensions"


@pytest.mark.skipif(torch.version.cuda is not None, reason="checks a CPU-only PyTorch")
def test_cpu_only_torch_is_a_build_error():
    with pytest.raises(build.BuildError) as err:
        build.load()
    assert str(err.value) == f"this PyTorch ({torch.__version__}) was built without CUDA"


def test_a_failed_build_is_tried_once_and_warned_once(monkeypatch, caplog, capsys):
    calls = []

    def fail(verbose):
        calls.append(verbose)
        raise build.BuildError("no CUDA toolkit found (nvcc)")

    monkeypatch.setattr(build, "_compile", fail)
    with caplog.at_level(logging.WARNING, logger="caffe_py"):
        assert build.available() is False
        assert build.available() is False
    with pytest.raises(build.BuildError, match="no CUDA toolkit"):
        build.load()
    assert calls == [False]
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("caffe_py.kernels.build", "WARNING", "The CUDA activation kernels are unavailable (no "
         "CUDA toolkit found (nvcc)); the activation layers use PyTorch's ops instead")]
    assert capsys.readouterr() == ("", "")  # through the logger only


def test_the_first_compile_is_announced_in_the_log(monkeypatch, tmp_path, caplog, capsys):
    from torch.utils import cpp_extension

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda")
    monkeypatch.setattr(build, "_smoke_test", lambda module: None)
    module = types.ModuleType("caffe_py_kernels")

    def load(name, sources, extra_cflags, extra_cuda_cflags, build_directory, verbose):
        (Path(build_directory) / f"{name}.so").write_bytes(b"")  # what a build leaves
        return module

    monkeypatch.setattr(cpp_extension, "load", load)
    with caplog.at_level(logging.INFO, logger="caffe_py"):
        assert build.load() is module
        build.reset()
        assert build.load() is module  # built: loaded without a word
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", f"Compiling the CUDA kernels for 9.0 in {build.build_dir()} (first use only; "
                 "about a minute)")]
    assert capsys.readouterr() == ("", "")


def test_a_successful_build_is_loaded_once(monkeypatch):
    module = types.ModuleType("caffe_py_kernels")
    calls = []
    monkeypatch.setattr(build, "_compile", lambda verbose: calls.append(verbose) or module)
    assert build.load() is module and build.load() is module and build.available()
    assert calls == [False]


def test_cpy_build_ext_reports_where_and_how_long(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    seen = []
    monkeypatch.setattr(build, "_compile",
                        lambda verbose: seen.append(verbose) or types.ModuleType("m"))
    result = CliRunner().invoke(cli, ["build-ext", "--verbose"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"built caffe_py_kernels in {build.build_dir()} (")
    assert result.output.endswith(" s)\n")
    assert seen == [True]


def test_cpy_build_ext_failure_is_one_line_and_exit_1(monkeypatch):
    def fail(verbose):
        raise build.BuildError("building the CUDA kernels in /x failed: nvcc fatal")

    monkeypatch.setattr(build, "_compile", fail)
    result = CliRunner().invoke(cli, ["build-ext"])
    assert result.exit_code == 1
    assert result.output == "Error: building the CUDA kernels in /x failed: nvcc fatal\n"


def test_threads_share_one_build(monkeypatch):
    import threading
    import time

    module = types.ModuleType("caffe_py_kernels")
    calls = []

    def slow(verbose):
        calls.append(verbose)
        time.sleep(0.2)
        return module

    monkeypatch.setattr(build, "_compile", slow)
    got = []
    threads = [threading.Thread(target=lambda: got.append(build.load())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert calls == [False] and got == [module] * 4
