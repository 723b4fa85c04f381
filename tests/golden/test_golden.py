"""Every layer type against the genuine BVLC Caffe 1.0: the fixtures make_golden.py wrote with
pycaffe, compared with the same layer built by caffe-py on the same bottoms and blobs.

Compared per case: each top's shape and values, the gradients of the bottoms Caffe
back-propagated into (the top diffs seeded), each learnable blob's gradient, and every blob
after the pass (BatchNorm's statistics). All in float32. The error of an array is
max|caffe_py - caffe| / max(max|caffe|, 1e-6), the largest difference relative to the
array's largest magnitude; every one must be <= 1e-5.

``python tests/golden/test_golden.py`` prints the largest error per layer type.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from caffe_py.io.formats.blobproto import blob_from_array, write_blob_file
from caffe_py.layers import BuildContext, Layer, lookup, registry
from caffe_py.spec.net_spec import parse_layer
from caffe_py.spec.schema import Source

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
sys.path.insert(0, str(HERE.parent / "layers"))  # python_layers, the Python layer cases' module
TOLERANCE = 1e-5

# Types with no fixture, and why.
NOT_COMPARED = {
    "Data": "reads a database; tests/io compares it with Caffe-written LMDBs",
    "Input": "copies the net's inputs: no computation (every case feeds its bottoms through "
             "one)",
    "Silence": "has no top, so nothing of it can be compared",
    "ImageData": "a data source: test_data_golden.py compares its batches with Caffe's",
    "HDF5Data": "a data source: test_data_golden.py compares its batches with Caffe's",
    "WindowData": "a data source: test_data_golden.py compares its batches with Caffe's",
    "HDF5Output": "writes a file: test_data_golden.py compares it with Caffe's",
    "MemoryData": "copies the arrays it is given, as Input: no computation",
}


def load_cases() -> list[tuple[str, str]]:
    """(type, case) for every case of every fixture file."""
    out = []
    for path in sorted(FIXTURES.glob("*.npz")):
        with np.load(path) as arrays:
            out += [(path.stem, key[:-len("__spec")]) for key in arrays.files
                    if key.endswith("__spec")]
    return out


CASES = load_cases()


def error(ours: np.ndarray, caffe: np.ndarray) -> float:
    """max|ours - caffe| relative to max|caffe| (1e-6 at least)."""
    if ours.size == 0:
        return 0.0
    scale = max(float(np.abs(caffe).max()), 1e-6)
    return float(np.abs(ours.astype(np.float64) - caffe).max()) / scale


def build_layer(spec: dict, arrays: dict, tmp: Path, device: str = "cpu") -> Layer:
    """The case's layer, built by caffe-py with the fixture's files and blobs."""
    params = json.loads(json.dumps(spec["params"]), object_hook=lambda d: {
        k: str(_write_file(v[1:], arrays, tmp)) if isinstance(v, str) and v.startswith("@")
        else v for k, v in d.items()})
    node = {"name": "test", "type": spec["type"],
            "bottom": [f"b{i}" for i in range(len(spec["bottoms"]))],
            "top": [f"t{k}" for k in range(spec["tops"])], **params}
    layer_spec = parse_layer(node, Source(), "layer[0]")
    shapes = [tuple(b["shape"]) for b in spec["bottoms"]]
    ctx = BuildContext(phase=spec["phase"], device=torch.device(device),
                       generator=torch.Generator().manual_seed(0))
    layer = lookup(spec["type"])(layer_spec, shapes, ctx)  # on ctx.device, as in a Net
    blobs = layer.blobs()
    assert len(blobs) == len([k for k in arrays if k.startswith("blob") and k[4:].isdigit()])
    with torch.no_grad():
        for j, blob in enumerate(blobs):
            blob.copy_(torch.from_numpy(arrays[f"blob{j}"]).reshape(blob.shape).to(device))
    return layer


def _write_file(name: str, arrays: dict, tmp: Path) -> Path:
    path = tmp / f"{name}.binaryproto"
    write_blob_file(path, blob_from_array(arrays[f"file_{name}"]))
    return path


def run_case(type_name: str, case: str, tmp: Path, device: str = "cpu",
             fixtures: Path = FIXTURES) -> dict[str, float]:
    """Forward and backward of one fixture case in caffe-py: the error of each array."""
    with np.load(fixtures / f"{type_name}.npz") as npz:
        arrays = {k.split("__", 1)[1]: npz[k] for k in npz.files if k.startswith(case + "__")}
    spec = json.loads(str(arrays.pop("spec")))
    layer = build_layer(spec, arrays, tmp, device)
    bottoms = [torch.from_numpy(arrays[f"bottom{i}"]).to(device).requires_grad_(
        i in spec["grad"]) for i in range(len(spec["bottoms"]))]
    tops = layer(*bottoms)
    tops = (tops,) if isinstance(tops, torch.Tensor) else tuple(tops)
    errors = {}
    for k, top in enumerate(tops):
        expected = arrays[f"top{k}"]
        assert tuple(top.shape) == expected.shape, f"top{k}: {tuple(top.shape)} vs Caffe's " \
                                                   f"{expected.shape}"
        errors[f"top{k}"] = error(top.detach().cpu().numpy(), expected)
    pairs = [(t, torch.from_numpy(arrays[f"top_diff{k}"]).to(device))
             for k, t in enumerate(tops) if t.requires_grad]
    if pairs:
        torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
    for i in spec["grad"]:
        grad = bottoms[i].grad
        ours = np.zeros_like(arrays[f"bottom{i}"]) if grad is None else grad.cpu().numpy()
        errors[f"bottom_diff{i}"] = error(ours, arrays[f"bottom_diff{i}"])
    for j, blob in enumerate(layer.blobs()):
        errors[f"blob_after{j}"] = error(blob.detach().cpu().numpy(), arrays[f"blob_after{j}"])
        if isinstance(blob, torch.nn.Parameter):
            ours = (np.zeros(blob.shape, np.float32) if blob.grad is None
                    else blob.grad.cpu().numpy())
            errors[f"blob_diff{j}"] = error(ours, arrays[f"blob_diff{j}"].reshape(blob.shape))
    return errors


@pytest.mark.parametrize(("type_name", "case"), CASES, ids=[f"{t}/{c}" for t, c in CASES])
def test_layer_matches_caffe(type_name, case, tmp_path):
    errors = run_case(type_name, case, tmp_path)
    worst = {name: e for name, e in errors.items() if not e <= TOLERANCE}
    assert not worst, f"{type_name}/{case}: errors above {TOLERANCE}: {worst}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("type_name", "case"), CASES, ids=[f"{t}/{c}" for t, c in CASES])
def test_layer_matches_caffe_on_cuda(type_name, case, tmp_path, monkeypatch):
    """The same comparison on a CUDA net, TF32 off (cuDNN's algorithms round differently:
    1e-4)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    errors = run_case(type_name, case, tmp_path, "cuda")
    worst = {name: e for name, e in errors.items() if not e <= 1e-4}
    assert not worst, f"{type_name}/{case} on CUDA: errors above 1e-4: {worst}"


def test_every_layer_type_has_a_fixture():
    """Every BVLC type (the forks' types: tests/golden/forks)."""
    from caffe_py.spec.layer_params.forks import BVLC_TYPES
    library = {t for t in registry.known_types()
               if registry.lookup(t).__module__.startswith("caffe_py.layers.")} & BVLC_TYPES
    covered = {t for t, _ in CASES}
    missing = library - covered - set(NOT_COMPARED)
    assert not missing, (f"layer types without a golden fixture: {', '.join(sorted(missing))}; "
                         "add cases to tests/golden/cases.py and run make_golden.py")


def test_the_fixtures_are_small():
    total = sum(p.stat().st_size for p in FIXTURES.glob("*.npz"))
    assert total < 3_000_000, f"the fixtures take {total} bytes"


def report() -> None:
    """Print the largest error per layer type (and the case it came from)."""
    import tempfile
    worst: dict[str, tuple[float, str, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for type_name, case in CASES:
            errors = run_case(type_name, case, Path(tmp))
            e, where = max((v, k) for k, v in errors.items()) if errors else (0.0, "-")
            best = worst.get(type_name, (-1.0, "", 0))
            if e > best[0]:
                worst[type_name] = (e, f"{case} {where}", best[2] + 1)
            else:
                worst[type_name] = (best[0], best[1], best[2] + 1)
    print("| type | cases | max error | where |\n|---|---|---|---|")
    for type_name, (e, where, n) in sorted(worst.items()):
        print(f"| {type_name} | {n} | {e:.1e} | {where} |")


if __name__ == "__main__":
    report()
