"""--gpus parsing: cpu, cpu:N, CUDA ids checked against the machine; the host's preparation."""
import subprocess
import sys

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


@pytest.mark.parametrize("count", ["5000", "99999999999999999999999"])
def test_cpu_replicas_are_bounded(monkeypatch, count):
    """Thousands of CPU replicas exhausted memory (OOM-killed, or a segfault under ulimit -v)
    or ran past a stop signal before the first iteration; an integer past 64 bits overflowed."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    with pytest.raises(DeviceError) as err:
        parse_devices(f"cpu:{count}")
    assert str(err.value) == (f"--gpus cpu:{count}: {count} CPU replicas is more than cpu:64 "
                              "(2 cores here; each replica is a thread with a copy of the net); "
                              "use at most cpu:64")
    assert len(parse_devices("cpu:64")) == 64


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


MAPPED = """
import ctypes, ctypes.util, sys
import torch
from caffe_py.devices import prepare_host
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                              "usmblks", "fsmblks", "uordblks", "fordblks",
                                              "keepcost")]
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = MallInfo2
prepare_host([torch.device(sys.argv[1])])
before = libc.mallinfo2().hblkhd
x = torch.empty(24 << 20, dtype=torch.uint8)
print(libc.mallinfo2().hblkhd - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_a_cpu_run_keeps_freed_host_memory_instead_of_mapping_each_block():
    """24 MiB is mapped on its own by default (it is over the 128 KiB threshold); once a run
    on the CPU has prepared the host it comes from the heap, to be reused after it is freed."""
    mapped = {device: int(subprocess.run([sys.executable, "-c", MAPPED, device],
                                         capture_output=True, text=True, check=True,
                                         timeout=120).stdout)
              for device in ("meta", "cpu")}
    assert mapped["meta"] >= 24 << 20 and mapped["cpu"] == 0


FLOAT32 = """
import sys
import torch
from caffe_py.devices import prepare_host
prepare_host([torch.device(sys.argv[1])])
print(torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
"""


def test_a_gpu_run_computes_float32_in_ieee_single_precision():
    """PyTorch's default lets cuDNN use TF32 for float32 convolutions; a run on a GPU turns
    that off (Caffe's arithmetic), a CPU run leaves the defaults alone."""
    flags = {device: subprocess.run([sys.executable, "-c", FLOAT32, device],
                                    capture_output=True, text=True, check=True,
                                    timeout=120).stdout.split()
             for device in ("cpu", "cuda:0")}
    assert flags == {"cpu": ["True", "False"], "cuda:0": ["False", "False"]}
