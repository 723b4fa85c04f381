"""The solver's memory_format field: AUTO is channels_last on CPUs, and on CUDA for nets with a
convolution at least 64 channels wide (NCHW for narrower ones); the layout changes no
number."""
from __future__ import annotations

import torch

from caffe_py.solver.solver import Solver, memory_format_for

CONV_NET = """\
name: conv
layer:
  - name: data
    type: DummyData
    top: [data, label]
    dummy_data_param:
      shape: [{dim: [4, 2, 5, 5]}, {dim: [4]}]
      data_filler: [{type: gaussian}, {type: uniform, min: 0, max: 2.99}]
  - name: conv
    type: Convolution
    bottom: data
    top: conv
    convolution_param: {num_output: 3, kernel_size: 3, weight_filler: {type: xavier}}
  - name: ip
    type: InnerProduct
    bottom: conv
    top: ip
    inner_product_param: {num_output: 3, weight_filler: {type: xavier}}
  - name: loss
    type: SoftmaxWithLoss
    bottom: [ip, label]
    top: loss
"""


def test_auto_means_channels_last_on_cpus():
    assert memory_format_for("AUTO") == torch.channels_last
    assert memory_format_for("CHANNELS_LAST") == torch.channels_last
    assert memory_format_for("CONTIGUOUS") == torch.contiguous_format


def test_auto_on_cuda_follows_the_widest_convolution(ws):
    """The net is built on the CPU; the choice for CUDA reads its convolutions' widths."""
    narrow_channels, wide_channels = 63, 64
    nets = {}
    for channels in (narrow_channels, wide_channels):
        ws.net(CONV_NET.replace("dim: [4, 2, 5, 5]", f"dim: [4, {channels}, 5, 5]"))
        nets[channels] = Solver(ws.load(max_iter=1)).net
    assert memory_format_for("AUTO", "cuda", nets[narrow_channels]) == torch.contiguous_format
    assert memory_format_for("AUTO", "cuda", nets[wide_channels]) == torch.channels_last
    assert memory_format_for("AUTO", "cpu", nets[narrow_channels]) == torch.channels_last
    assert memory_format_for("CHANNELS_LAST", "cuda", nets[narrow_channels]) == \
        torch.channels_last
    assert memory_format_for("CONTIGUOUS", "cuda", nets[wide_channels]) == \
        torch.contiguous_format


def test_a_cpu_solver_lays_out_its_net_channels_last_by_default(ws):
    ws.net(CONV_NET)
    solver = Solver(ws.load(max_iter=1))
    assert solver.memory_format == torch.channels_last
    conv = solver.net.layer_by_name("conv").blobs()[0]
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()


def _train(ws, fmt: str) -> tuple[Solver, list[torch.Tensor]]:
    ws.net(CONV_NET)
    solver = Solver(ws.load(max_iter=3, memory_format=fmt))
    solver.solve()
    return solver, [lp.param.detach().contiguous() for lp in solver.net.learnable_params()]


def test_channels_last_lays_out_weights_and_history_and_trains_the_same(ws):
    flat, plain = _train(ws, "CONTIGUOUS")
    last, laid_out = _train(ws, "CHANNELS_LAST")
    conv = last.net.layer_by_name("conv").blobs()[0]
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    assert all(h.is_contiguous(memory_format=torch.channels_last)
               for h in last.updater.history if h.dim() == 4)
    assert flat.net.layer_by_name("conv").blobs()[0].is_contiguous()
    for a, b in zip(plain, laid_out, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
