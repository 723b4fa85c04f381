"""Specs and states that once crashed: each class from the fuzzing that found it, now a
one-line error naming the file, line and key."""
from __future__ import annotations

import os
import pickle
import struct
import zlib
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from support import error_line

from caffe_py.cli import cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LENET = Path(ROOT, "configs", "lenet.yaml").read_text()


def cpy(*args: str) -> tuple[int, str]:
    """(exit status, the error line, or the whole stderr of a run that succeeded)."""
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, error_line(result.stderr) if result.exit_code else \
        result.stderr.strip()


def lenet(tmp_path, change) -> str:
    net = yaml.safe_load(LENET)
    change(net["layer"])
    path = tmp_path / "net.yaml"
    path.write_text(yaml.safe_dump(net, sort_keys=False))
    return str(path)


CASES = {
    "no batch_size": (lambda layers: layers[0]["data_param"].pop("batch_size"),
                      ":13: layer[0].data_param.batch_size: 'batch_size' is missing from "
                      "DataParameter (records per batch (per replica)); give batch_size: a "
                      "value >= 1"),
    "uniform min > max": (lambda layers: layers[2]["convolution_param"].update(
        weight_filler={"type": "uniform", "min": 1, "max": 0}),
        "layer[2].convolution_param.weight_filler.max: uniform filler with min 1 > max 0; "
        "give min <= max"),
    "past int64": (lambda layers: layers[2]["convolution_param"].update(
        num_output=18446744073709551616),
        "layer[2].convolution_param.num_output: 18446744073709551616 does not fit in 64 bits; "
        "use a value between -2^63 and 2^63 - 1"),
    "past float32": (lambda layers: layers[2]["convolution_param"].update(
        weight_filler={"type": "constant", "value": -1e300}),
        "layer[2].convolution_param.weight_filler.value: -1e+300 does not fit in a 32-bit "
        "float, as Caffe's float fields are (at most 3.4e+38); use a smaller value"),
    "kernel over the input": (lambda layers: layers[2]["convolution_param"].update(
        kernel_size=500),
        "layer 'conv1' (Convolution): bottom 'data' (index 0) of spatial size [28, 28] padded "
        "to [28, 28] is smaller than the (dilated) kernel [500, 500]; use a smaller "
        "kernel_size or dilation, or more pad"),
    "weights past memory": (lambda layers: layers[2]["convolution_param"].update(
        num_output=10**12),
        "layer 'conv1' (Convolution): blob 'weight' of shape [1000000000000, 1, 5, 5] needs "),
    "activations past memory": (lambda layers: layers[0]["data_param"].update(
        batch_size=10**9),
        "layer 'mnist' (Data): top 'data' of shape [1000000000, 1, 28, 28] needs "),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_net_is_one_line(tmp_path, case):
    change, message = CASES[case]
    code, err = cpy("net", lenet(tmp_path, change), "--input-shape", "data=1,28,28")
    assert code == 1
    assert len(err.splitlines()) == 1 and err.startswith(f"Error: {tmp_path / 'net.yaml'}:")
    assert message in err


def test_a_solver_value_past_float32_is_one_line(tmp_path):
    """weight_decay 1e300 ended in torch's overflow error at the first update."""
    (tmp_path / "s.yaml").write_text("net: n.yaml\nbase_lr: 0.1\nweight_decay: 1e300\n")
    code, err = cpy("train", "--solver", str(tmp_path / "s.yaml"))
    assert (code, err) == (1, f"Error: {tmp_path / 's.yaml'}:3: weight_decay: 1e+300 does not "
                              "fit in a 32-bit float, as Caffe's float fields are (at most "
                              "3.4e+38); use a smaller value")


def test_values_with_newlines_stay_one_line(tmp_path):
    (tmp_path / "s.yaml").write_text('net: n.yaml\nbase_lr: 0.1\nlr_policy: "fi\\nxed"\n')
    code, err = cpy("train", "--solver", str(tmp_path / "s.yaml"))
    assert (code, err) == (1, f"Error: {tmp_path / 's.yaml'}:3: lr_policy: 'fi\\nxed' is not "
                              "one of fixed, step, exp, inv, multistep, poly, sigmoid; did you "
                              "mean 'fixed'?")
    code, err = cpy("net", str(tmp_path / "a\nb.yaml"))
    assert code == 1 and err == (f"Error: {tmp_path}/a\\nb.yaml: file not found; check the path "
                                 "(relative to the current directory)")


def test_a_usage_error_exits_1():
    code, err = cpy("frobnicate")
    assert code == 1 and err.startswith("Error: No such command 'frobnicate' (see '")


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def _varint(n: int) -> bytes:
    out = b""
    while True:
        low, n = n & 0x7F, n >> 7
        out += bytes([low | (0x80 if n else 0)])
        if not n:
            return out


def test_a_pickle_in_a_caffe_solverstate_never_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    payload = pickle.dumps(Exploit())
    (tmp_path / "evil.solverstate").write_bytes(
        _varint(8) + _varint(5) + _varint(1000 << 3 | 2) + _varint(len(payload)) + payload)
    from caffe_py.solver.caffemodel import read_state

    with pytest.raises(Exception) as err:
        read_state("evil.solverstate")
    assert str(err.value).startswith("evil.solverstate: not a Caffe SolverState (.solverstate) "
                                     "(field 1000, caffe-py's extras, does not load safely: ")
    assert not (tmp_path / "PWNED").exists()


def test_wrong_typed_solver_state_entries_are_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(
        "name: t\nlayer:\n  - {name: d, type: DummyData, top: [x, y], dummy_data_param: "
        "{shape: [{dim: [2, 3]}, {dim: [2]}]}}\n  - {name: ip, type: InnerProduct, bottom: x, "
        "top: z, inner_product_param: {num_output: 2}}\n  - {name: l, type: SoftmaxWithLoss, "
        "bottom: [z, y], top: l}\n")
    (tmp_path / "s.yaml").write_text("net: net.yaml\nbase_lr: 0.1\nmax_iter: 2\n"
                                     "snapshot_prefix: s/t\n")
    assert cpy("train", "--solver", "s.yaml")[0] == 0
    state = torch.load("s/t_iter_2.solverstate.pt", weights_only=True)
    state["rng"] = "hello"
    torch.save(state, "s/t_iter_2.solverstate.pt")
    code, err = cpy("train", "--solver", "s.yaml", "--snapshot", "s/t_iter_2.solverstate.pt")
    assert (code, err) == (1, "Error: s/t_iter_2.solverstate.pt: the solver state's 'rng' "
                              "entry is damaged ('str' object has no attribute 'get'); use an "
                              "earlier snapshot")


def _png_header(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + \
            struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0,
                                                             0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b""))


def test_a_decompression_bomb_is_refused(tmp_path):
    (tmp_path / "bomb.png").write_bytes(_png_header(30000, 30000))  # 900 megapixels
    (tmp_path / "list.txt").write_text("bomb.png 1\n")
    code, err = cpy("convert", "imageset", str(tmp_path), str(tmp_path / "list.txt"),
                    str(tmp_path / "db"))
    assert code == 1
    assert err.startswith(f"Error: {tmp_path / 'list.txt'}:1: {tmp_path / 'bomb.png'}: the "
                          "image is too large to decode safely (Image size (900000000 pixels) "
                          "exceeds limit of ")
    assert not (tmp_path / "db").exists()


FORK_HEAD = ("name: t\nlayer:\n  - {name: data, type: DummyData, top: [d0, d1], "
             "dummy_data_param: {shape: [{dim: [1, 2, 4, 4]}, {dim: [1, 3, 16, 16]}]}}\n")
ROIS = ("  - {name: r, type: DummyData, top: rois, dummy_data_param: {shape: {dim: [1, 5]}, "
        "data_filler: {type: constant, value: 1}}}\n")

FORK_CASES = {
    # a ZeroDivisionError, a math domain error, or NaN priors
    "prior aspect ratio 0": (
        "  - {name: L, type: PriorBox, bottom: [d0, d1], top: out, prior_box_param: "
        "{min_size: 4, aspect_ratio: 0}}\n",
        ":4: layer[1].prior_box_param.aspect_ratio: aspect ratio 0 is not a positive finite "
        "number (a prior's width over its height); give ratios > 0"),
    "prior aspect ratio -2": (
        "  - {name: L, type: PriorBox, bottom: [d0, d1], top: out, prior_box_param: "
        "{min_size: 4, aspect_ratio: -2}}\n",
        ":4: layer[1].prior_box_param.aspect_ratio: aspect ratio -2 is not a positive finite "
        "number (a prior's width over its height); give ratios > 0"),
    # every region pooled from one pixel, or NaN's conversion error
    "roi spatial_scale 0": (
        ROIS + "  - {name: L, type: ROIPooling, bottom: [d0, rois], top: out, "
               "roi_pooling_param: {pooled_h: 2, pooled_w: 2, spatial_scale: 0}}\n",
        ":5: layer[2].roi_pooling_param.spatial_scale: spatial_scale 0 is not a positive finite "
        "number; give the feature map's scale, e.g. 0.0625 (1/16)"),
    # a ZeroDivisionError at the first forward
    "smooth l1 sigma 0": (
        "  - {name: L, type: SmoothL1Loss, bottom: [d0, d0], top: loss, smooth_l1_loss_param: "
        "{sigma: 0}}\n",
        ":4: layer[1].smooth_l1_loss_param.sigma: sigma 0 is not a positive finite number; give "
        "sigma > 0 (Faster R-CNN's RPN uses 3, its head 1)"),
    # minutes of building per-axis tables, then the OOM killer
    "interp zoom 1e9": (
        "  - {name: L, type: Interp, bottom: d0, top: out, interp_param: "
        "{zoom_factor: 1000000000}}\n",
        ":4: layer[1]: layer 'L' (Interp): top 'out' of shape [1, 2, 3000000001, 3000000001] "
        "needs "),
    # a size mismatch at the first forward
    "detection output prior of 3 rows": (
        "  - {name: p, type: DummyData, top: [loc, conf, prior], dummy_data_param: {shape: "
        "[{dim: [1, 16]}, {dim: [1, 12]}, {dim: [1, 3, 16]}]}}\n"
        "  - {name: L, type: DetectionOutput, bottom: [loc, conf, prior], top: det, "
        "detection_output_param: {num_classes: 3}}\n",
        ":5: layer[2]: layer 'L' (DetectionOutput): bottom 'prior' (index 2) has shape "
        "[1, 3, 16]; expected PriorBox's (1, 2, P x 4)"),
}


@pytest.mark.parametrize("case", list(FORK_CASES))
def test_a_fork_layers_hostile_parameter_is_one_line(tmp_path, case):
    body, message = FORK_CASES[case]
    (tmp_path / "net.yaml").write_text(FORK_HEAD + body)
    code, err = cpy("net", str(tmp_path / "net.yaml"))
    assert code == 1
    assert err.startswith(f"Error: {tmp_path / 'net.yaml'}{message}")


@pytest.mark.parametrize("layer,param,fix", [
    ("HDF5Data", "hdf5_data_param: {source: SRC, batch_size: 2}",
     "hdf5_data_param.source names a text file listing the .h5 files, one per line"),
    ("ImageData", "image_data_param: {source: SRC, batch_size: 2}",
     "the source names a list file, one 'path label' line per image"),
])
def test_a_data_source_that_is_a_directory_is_one_line(tmp_path, layer, param, fix):
    """IsADirectoryError tracebacks before."""
    (tmp_path / "net.yaml").write_text(
        f"name: t\nlayer:\n  - {{name: d, type: {layer}, top: [data, label], "
        f"{param.replace('SRC', str(tmp_path))}}}\n")
    code, err = cpy("net", str(tmp_path / "net.yaml"))
    assert (code, err) == (1, f"Error: {tmp_path / 'net.yaml'}:3: layer[0]: layer 'd' "
                              f"({layer}): {tmp_path}: is a directory; {fix}")
