"""cpy export: the deploy form of the shipped LeNet as TorchScript, an exported program and ONNX,
each loaded back and compared with the Net on a new input, at the declared batch size and at
another (the batch dimension is free unless --static-batch)."""
from __future__ import annotations

import sys

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


def export(tmp_path, fmt, *flags, shape="data=2,1,28,28"):
    """``cpy export`` of the LeNet deploy form, the format from the file's suffix."""
    out = tmp_path / f"lenet.{ {'torchscript': 'pt'}.get(fmt, fmt)}"
    result = CliRunner().invoke(cli, ["export", str(caffe_py.configs_dir() / "lenet.yaml"),
                                      str(tmp_path / "w.pt"), "-o", str(out),
                                      "--input-shape", shape, *flags])
    assert result.exit_code == 0, result.output
    batch = "batch as declared" if "--static-batch" in flags else "any batch size"
    assert result.stdout.startswith(f"wrote {out} ({fmt}, {batch}); largest difference from "
                                    "the net: ")
    return out


def test_torchscript_and_pt2_compute_what_the_net_does(lenet):
    tmp_path, x, prob = lenet
    traced = torch.jit.load(export(tmp_path, "torchscript"))
    out = traced(torch.from_numpy(x))
    assert isinstance(out, torch.Tensor)  # the output itself, not a 1-tuple
    np.testing.assert_allclose(out.detach().numpy(), prob, atol=1e-6)
    program = torch.export.load(export(tmp_path, "pt2")).module()
    np.testing.assert_allclose(program(torch.from_numpy(x)).detach().numpy(), prob, atol=1e-6)


def test_the_batch_is_free_unless_static(lenet):
    """Exported at batch 1, run at batch 8 (and 1) in each format; --static-batch keeps 1."""
    onnxruntime = pytest.importorskip("onnxruntime")
    tmp_path, x, _ = lenet
    net = caffe_py.load_net(caffe_py.deploy_spec(caffe_py.configs_dir() / "lenet.yaml",
                                                 {"data": (1, 1, 28, 28)}),
                            weights=tmp_path / "w.pt")
    x8 = np.concatenate([x] * 4)
    want8 = caffe_py.predict(net, data=x8)["prob"]
    session = onnxruntime.InferenceSession(str(export(tmp_path, "onnx", shape="data=1,1,28,28")))
    np.testing.assert_allclose(session.run(["prob"], {"data": x8})[0], want8, atol=1e-6)
    np.testing.assert_allclose(session.run(["prob"], {"data": x8[:1]})[0], want8[:1], atol=1e-6)
    program = torch.export.load(export(tmp_path, "pt2", shape="data=1,1,28,28")).module()
    np.testing.assert_allclose(program(torch.from_numpy(x8)).detach().numpy(), want8, atol=1e-6)
    traced = torch.jit.load(export(tmp_path, "torchscript", shape="data=1,1,28,28"))
    np.testing.assert_allclose(traced(torch.from_numpy(x8)).detach().numpy(), want8, atol=1e-6)
    static = export(tmp_path, "onnx", "--static-batch", shape="data=1,1,28,28")
    session = onnxruntime.InferenceSession(str(static))
    assert session.get_inputs()[0].shape == [1, 1, 28, 28]
    with pytest.raises(Exception, match="dimensions"):
        session.run(["prob"], {"data": x8})


def test_several_outputs_come_back_by_name(tmp_path):
    spec = tmp_path / "two.yaml"
    spec.write_text("""
name: two
layer:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [1, 3]}}}
  - {name: ip, type: InnerProduct, bottom: data, top: ip,
     inner_product_param: {num_output: 2, weight_filler: {type: xavier}}}
  - {name: prob, type: Softmax, bottom: ip, top: prob}
  - {name: double, type: Power, bottom: data, top: double, power_param: {scale: 2}}
""")
    net = caffe_py.load_net(spec)
    snap.save_weights(net.layer_blobs(), tmp_path / "w.pt")
    result = CliRunner().invoke(cli, ["export", str(spec), str(tmp_path / "w.pt"), "-o",
                                      str(tmp_path / "two.pt2")])
    assert result.exit_code == 0, result.output
    program = torch.export.load(tmp_path / "two.pt2").module()
    x = torch.ones(4, 3)
    out = program(x)
    assert sorted(out) == ["double", "prob"]
    assert out["double"].tolist() == [[2.0] * 3] * 4
    torch.testing.assert_close(out["prob"], net({"data": x}).outputs["prob"])


def test_the_format_comes_from_the_suffix_or_is_asked_for(tmp_path, lenet):
    args = ["export", str(caffe_py.configs_dir() / "lenet.yaml"), str(tmp_path / "w.pt"),
            "--input-shape", "data=1,1,28,28", "-o"]
    result = CliRunner().invoke(cli, [*args, str(tmp_path / "lenet.bin")])
    assert (result.exit_code, result.stderr.strip()) == (1, (
        f"Error: {tmp_path / 'lenet.bin'}: the suffix '.bin' names no format; end the file "
        "name in .onnx, .pt2 or .pt (TorchScript), or give --format"))
    result = CliRunner().invoke(cli, [*args, str(tmp_path / "lenet.bin"), "--format", "pt2"])
    assert result.exit_code == 0, result.output
    assert torch.export.load(tmp_path / "lenet.bin").module()(torch.zeros(3, 1, 28, 28)).shape \
        == (3, 10)


def test_onnx_without_its_packages_names_the_extra(tmp_path, lenet, monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if not installed
    result = CliRunner().invoke(cli, ["export", str(caffe_py.configs_dir() / "lenet.yaml"),
                                      str(tmp_path / "w.pt"), "--input-shape",
                                      "data=1,1,28,28", "-o", str(tmp_path / "x.onnx")])
    assert (result.exit_code, result.stderr.strip()) == (
        1, "Error: --format onnx needs onnx and onnxruntime: pip install 'caffe-py[export]'")
    assert not (tmp_path / "x.onnx").exists()


def test_a_net_without_inputs_needs_their_shapes(tmp_path, lenet):
    result = CliRunner().invoke(cli, ["export", str(caffe_py.configs_dir() / "lenet.yaml"),
                                      str(tmp_path / "w.pt"), "--format", "pt2", "-o", "x.pt2"])
    assert (result.exit_code, result.stderr.strip()) == (1, (
        "Error: LeNet: layer 'mnist' reads data; give --input-shape NAME=N,C,H,W for each data "
        "top (e.g. data=1,3,224,224) to export the deploy form"))


def test_a_net_fixed_to_its_batch_says_static_batch(tmp_path):
    spec = tmp_path / "fixed.yaml"
    spec.write_text("""
name: fixed
layer:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [1, 3, 2, 2]}}}
  - {name: flat, type: Reshape, bottom: data, top: flat, reshape_param: {shape: {dim: [1, 12]}}}
""")
    snap.save_weights({}, tmp_path / "w.pt")
    args = ["export", str(spec), str(tmp_path / "w.pt"), "-o", str(tmp_path / "fixed.pt2")]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("Error: the net does not run at batch 2 (declared 1): ")
    assert result.stderr.strip().endswith("; export with --static-batch")
    result = CliRunner().invoke(cli, [*args, "--static-batch"])
    assert result.exit_code == 0, result.output


def test_a_net_without_outputs_has_nothing_to_export(tmp_path):
    """Every top consumed (here by Silence): onnxruntime's own log and an error naming its
    initializer step before; the .pt form a tracer error."""
    spec = tmp_path / "sil.yaml"
    spec.write_text("""
name: sil
input: data
input_shape: {dim: [2, 1, 8, 8]}
layer:
  - {name: conv1, type: Convolution, bottom: data, top: conv1,
     convolution_param: {num_output: 2, kernel_size: 3}}
  - {name: s, type: Silence, bottom: conv1}
""")
    snap.save_weights({"conv1": [torch.ones(2, 1, 3, 3), torch.zeros(2)]}, tmp_path / "w.pt")
    result = CliRunner().invoke(cli, ["export", str(spec), str(tmp_path / "w.pt"), "-o",
                                      str(tmp_path / "sil.pt")])
    assert (result.exit_code, result.stderr.strip()) == (1, (
        "Error: sil: the net has no output blob (every top is a later layer's bottom, or "
        "Silence's); there is nothing to export: leave the blob to export unconsumed"))
    assert not (tmp_path / "sil.pt").exists()


def test_an_input_shape_the_net_cannot_take_is_named_in_the_error(tmp_path, lenet):
    """The error blamed the net's layer alone; the shape given on the command line is the
    likely cause, and the line says so."""
    result = CliRunner().invoke(cli, ["export", str(caffe_py.configs_dir() / "lenet.yaml"),
                                      str(tmp_path / "w.pt"), "--input-shape", "data=",
                                      "-o", str(tmp_path / "x.pt")])
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert line.startswith("Error: ") and "\n" not in line
    assert line.endswith("(with --input-shape data=: the net was built for those shapes; check "
                         "them)")
