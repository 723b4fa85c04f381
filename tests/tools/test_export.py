"""cpy export: the deploy form of the shipped LeNet as TorchScript, an exported program and ONNX,
each loaded back and compared with the Net on a new input."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import caffe_py
from caffe_py.cli import cli
from caffe_py.solver import snapshot as snap


@pytest.fixture
def lenet(tmp_path):
    spec = caffe_py.deploy_spec(caffe_py.configs_dir() / "lenet.yaml", {"data": (2, 1, 28, 28)})
    net = caffe_py.load_net(spec)
    for blob in net.layer_blobs().values():  # weights the fillers would not give
        for b in blob:
            b.data.normal_(0, 0.1, generator=torch.Generator().manual_seed(b.numel()))
    snap.save_weights(net.layer_blobs(), tmp_path / "w.pt")
    x = np.random.default_rng(3).normal(size=(2, 1, 28, 28)).astype(np.float32)
    return tmp_path, x, caffe_py.predict(net, data=x)["prob"]


def export(tmp_path, fmt):
    out = tmp_path / f"lenet.{fmt}"
    result = CliRunner().invoke(cli, ["export", str(caffe_py.configs_dir() / "lenet.yaml"),
                                      str(tmp_path / "w.pt"), "--format", fmt, "-o", str(out),
                                      "--input-shape", "data=2,1,28,28"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {out} ({fmt}); largest difference from the net: ")
    return out


def test_torchscript_and_pt2_compute_what_the_net_does(lenet):
    tmp_path, x, prob = lenet
    traced = torch.jit.load(export(tmp_path, "torchscript"))
    np.testing.assert_allclose(traced(torch.from_numpy(x))[0].detach().numpy(), prob, atol=1e-6)
    program = torch.export.load(export(tmp_path, "pt2")).module()
    np.testing.assert_allclose(program(torch.from_numpy(x))[0].detach().numpy(), prob, atol=1e-6)


def test_onnx_computes_what_the_net_does(lenet):
    onnxruntime = pytest.importorskip("onnxruntime")
    tmp_path, x, prob = lenet
    session = onnxruntime.InferenceSession(str(export(tmp_path, "onnx")))
    assert [i.name for i in session.get_inputs()] == ["data"]
    np.testing.assert_allclose(session.run(["prob"], {"data": x})[0], prob, atol=1e-6)


def test_a_net_without_inputs_needs_their_shapes(tmp_path, lenet):
    result = CliRunner().invoke(cli, ["export", str(caffe_py.configs_dir() / "lenet.yaml"),
                                      str(tmp_path / "w.pt"), "--format", "pt2", "-o", "x.pt2"])
    assert (result.exit_code, result.stderr.strip()) == (1, (
        "Error: LeNet: layer 'mnist' reads data; give --input-shape NAME=N,C,H,W for each data "
        "top (e.g. data=1,3,224,224) to export the deploy form"))
