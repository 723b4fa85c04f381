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


TORCH_CUDA_ERROR = ("CUDA error: an illegal instruction was encountered\n"
                    "Search for `cudaErrorIllegalInstruction' in https://docs.nvidia.com/cuda/"
                    "cuda-runtime-api/group__CUDART__TYPES.html for more information.\n"
                    "CUDA kernel errors might be asynchronously reported at some other API "
                    "call, so the stacktrace below might be incorrect.\n"
                    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n")
FAULT_FIX = ("this process's CUDA context is lost, so the run stops here; resume from the last "
             "snapshot with --snapshot, and if it happens again check the GPUs with nvidia-smi "
             "and rerun with CUDA_LAUNCH_BLOCKING=1 to name the kernel")


@pytest.mark.parametrize("exc,want", [
    (RuntimeError(TORCH_CUDA_ERROR),
     "the GPU failed: CUDA error: an illegal instruction was encountered; " + FAULT_FIX),
    (RuntimeError("NCCL Error 5: invalid usage (run with NCCL_DEBUG=WARN for details)"),
     "the GPU failed: NCCL Error 5: invalid usage (run with NCCL_DEBUG=WARN for details); "
     + FAULT_FIX),
    (RuntimeError("shape '[2, 3]' is invalid for input of size 5"), None),
    (ValueError("CUDA error: not a RuntimeError"), None),
])
def test_device_fault(exc, want):
    from caffe_py.errors import device_fault

    assert device_fault(exc) == want


def test_an_accelerator_error_is_a_device_fault_whatever_it_says():
    import torch

    from caffe_py.errors import device_fault

    assert device_fault(torch.AcceleratorError("unspecified launch failure\nmore")) == \
        "the GPU failed: unspecified launch failure; " + FAULT_FIX


def test_cpy_train_reports_a_gpu_failure_in_one_line_and_a_bug_as_it_is(monkeypatch, tmp_path):
    from click.testing import CliRunner

    from caffe_py import train as train_module
    from caffe_py.cli import cli

    def fails(*a, **kw):
        raise RuntimeError(TORCH_CUDA_ERROR)

    monkeypatch.setattr(train_module, "train", fails)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("net: n.yaml\n")
    result = CliRunner().invoke(cli, ["train", "--solver", "s.yaml"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == \
        "Error: the GPU failed: CUDA error: an illegal instruction was encountered; " + FAULT_FIX

    def bug(*a, **kw):
        raise RuntimeError("shape '[2, 3]' is invalid for input of size 5")

    monkeypatch.setattr(train_module, "train", bug)
    result = CliRunner().invoke(cli, ["train", "--solver", "s.yaml"])
    assert isinstance(result.exception, RuntimeError)


def test_a_replicas_gpu_failure_names_the_replica_in_one_line():
    import torch

    from caffe_py.parallel.sync import Failure, replica_error

    err = replica_error(Failure(2, torch.device("cuda", 2), RuntimeError(TORCH_CUDA_ERROR)))
    assert str(err) == ("replica 2 (cuda:2): the GPU failed: CUDA error: an illegal instruction "
                        "was encountered; " + FAULT_FIX)
