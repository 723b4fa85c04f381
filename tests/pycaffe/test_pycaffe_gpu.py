"""caffe_py.pycaffe in GPU mode: the same numbers as on the CPU, and the weights' host copies
written back and refreshed around every pass (skipped without CUDA)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import caffe_py.pycaffe as caffe

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

NET = """
force_backward: true
layer { name: "in" type: "Input" top: "data" input_param { shape { dim: 4 dim: 2 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "Reduction" bottom: "ip" top: "loss" loss_weight: 1 }
"""


def _run(path, gpu):
    (caffe.set_mode_gpu if gpu else caffe.set_mode_cpu)()
    caffe.set_random_seed(1)
    net = caffe.Net(str(path), caffe.TEST)
    net.blobs["data"].data[...] = np.random.RandomState(0).normal(0, 1, (4, 2, 6, 6))
    net.params["conv"][1].data[...] = 0.25  # surgery on the host copy
    net.forward()
    net.backward()
    return net


def test_gpu_mode_gives_the_cpu_numbers(tmp_path):
    path = tmp_path / "n.prototxt"
    path.write_text(NET)
    try:
        cpu, gpu = _run(path, False), _run(path, True)
    finally:
        caffe.set_mode_cpu()
    assert gpu._net.device.type == "cuda"
    for name in ("conv", "ip", "loss"):
        np.testing.assert_allclose(gpu.blobs[name].data, cpu.blobs[name].data, rtol=1e-4,
                                   atol=1e-5)
    np.testing.assert_allclose(gpu.blobs["data"].diff, cpu.blobs["data"].diff, rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(gpu.params["ip"][0].diff, cpu.params["ip"][0].diff, rtol=1e-4,
                               atol=1e-5)
    assert float(gpu._net.layer_by_name("conv").blobs()[1][0]) == 0.25
