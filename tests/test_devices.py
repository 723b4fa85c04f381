"""--gpus parsing: cpu, cpu:N, CUDA ids checked against the machine."""
import pytest
import torch

from caffe_py.devices import DeviceError, describe, parse_devices

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only answers")


def test_cpu_forms():
    assert parse_devices("cpu") == [torch.device("cpu")]
    assert parse_devices("cpu:3") == [torch.device("cpu")] * 3
    assert describe(parse_devices("cpu:3")) == "cpu x 3"


@no_cuda
def test_default_without_cuda_is_the_cpu():
    assert parse_devices(None) == [torch.device("cpu")]
    assert parse_devices(None, solver_mode="GPU", device_id=3) == [torch.device("cpu")]


@no_cuda
@pytest.mark.parametrize("text, message", [
    ("0", "--gpus 0: no CUDA device is available on this machine; use --gpus cpu"),
    ("all", "--gpus all: no CUDA device is available; use --gpus cpu"),
])
def test_cuda_ids_without_cuda(text, message):
    with pytest.raises(DeviceError) as err:
        parse_devices(text)
    assert str(err.value) == message


@pytest.mark.parametrize("text, message", [
    ("gpu0", "--gpus gpu0: expected cpu, cpu:N, all, or GPU ids like 0,1"),
    ("cpu:x", "--gpus cpu:x: expected cpu:N with N >= 1 CPU replicas, e.g. cpu:2"),
    ("0,0", "--gpus 0,0: a GPU is listed twice; list each id once"),
])
def test_malformed(text, message):
    with pytest.raises(DeviceError) as err:
        parse_devices(text)
    assert str(err.value) == message


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_ids_are_checked():
    n = torch.cuda.device_count()
    assert parse_devices("all") == [torch.device("cuda", i) for i in range(n)]
    with pytest.raises(DeviceError, match=f"GPU {n} does not exist"):
        parse_devices(str(n))


def test_more_cpu_replicas_than_cores_is_a_warning(caplog, monkeypatch):
    import logging

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    caplog.set_level(logging.INFO, logger="caffe_py")
    assert len(parse_devices("cpu:3")) == 3
    assert caplog.messages == ["Warning: --gpus cpu:3: 3 CPU replicas on 2 cores; they take "
                               "turns, so the run is slower than with cpu:2 (the numbers are "
                               "the same)"]
    caplog.clear()
    parse_devices("cpu:2")
    assert caplog.messages == []
