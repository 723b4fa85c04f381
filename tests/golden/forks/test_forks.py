"""The layers of Caffe's forks against the forks themselves: the fixtures
make_ssd_golden.py wrote with each fork's pycaffe (tests/golden/forks/<fork>/<Type>.npz),
compared with the same layer built by caffe-py on the same bottoms and blobs, exactly as
tests/golden/test_golden.py compares the BVLC types (its layer building and error measure are
reused): every top, every compared bottom's gradient and every blob's, within 1e-5 of the
fork's in float32.

``python tests/golden/forks/test_forks.py`` prints the largest error per fork and type.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from test_golden import TOLERANCE, build_layer, error  # noqa: E402

# the detection forks' fixtures (SSD's from its pycaffe, the R-CNN forks' from their kernels)
FORKS = [f for f in ("fast_rcnn", "rfcn", "ssd") if list((HERE / f).glob("*.npz"))]


def load_cases() -> list[tuple[str, str, str]]:
    """(fork, type, case) for every case of every fork's fixtures."""
    out = []
    for fork in FORKS:
        for path in sorted((HERE / fork).glob("*.npz")):
            with np.load(path) as arrays:
                out += [(fork, path.stem, key[:-len("__spec")]) for key in arrays.files
                        if key.endswith("__spec")]
    return out


CASES = load_cases()


def fixture(fork: str, type_name: str, case: str) -> tuple[dict, dict[str, np.ndarray]]:
    with np.load(HERE / fork / f"{type_name}.npz") as npz:
        arrays = {k.split("__", 1)[1]: npz[k] for k in npz.files if k.startswith(case + "__")}
    return json.loads(str(arrays.pop("spec"))), arrays


def run_case(fork: str, type_name: str, case: str, tmp: Path,
             device: str = "cpu") -> dict[str, float]:
    """Forward and backward of one fixture case in caffe-py: the error of each array."""
    spec, arrays = fixture(fork, type_name, case)
    layer = build_layer(spec, arrays, tmp, device)
    bottoms = [torch.from_numpy(arrays[f"bottom{i}"]).to(device).requires_grad_(
        i in spec["grad"]) for i in range(len(spec["bottoms"]))]
    tops = layer(*bottoms)
    tops = (tops,) if isinstance(tops, torch.Tensor) else tuple(tops)
    errors = {}
    for k, top in enumerate(tops):
        expected = arrays[f"top{k}"]
        assert tuple(top.shape) == expected.shape, \
            f"top{k}: {tuple(top.shape)} vs the fork's {expected.shape}"
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


def test_every_fork_has_fixtures():
    assert {"ssd", "fast_rcnn", "rfcn"} <= set(FORKS)


def test_every_detection_type_is_held_to_its_fork():
    """Each fork type caffe-py has from the detection forks has fixture cases here;
    AnnotatedData's are its batches and databases (test_annotated_golden.py)."""
    from caffe_py.spec.layer_params.forks import IMPLEMENTED
    covered = {t for _, t, _ in CASES} | {"AnnotatedData"}
    assert sorted(set(IMPLEMENTED) - covered) == []


@pytest.mark.parametrize(("fork", "type_name", "case"), CASES,
                         ids=[f"{f}/{t}/{c}" for f, t, c in CASES])
def test_layer_matches_fork(fork, type_name, case, tmp_path):
    errors = run_case(fork, type_name, case, tmp_path)
    worst = {name: e for name, e in errors.items() if not e <= TOLERANCE}
    assert not worst, f"{fork}/{type_name}/{case}: errors above {TOLERANCE}: {worst}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("fork", "type_name", "case"), CASES,
                         ids=[f"{f}/{t}/{c}" for f, t, c in CASES])
def test_layer_matches_fork_on_cuda(fork, type_name, case, tmp_path, monkeypatch):
    """The same on a CUDA net (DetectionOutput's decoding and NMS run there as tensor
    operations), TF32 off."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    errors = run_case(fork, type_name, case, tmp_path, device="cuda")
    worst = {name: e for name, e in errors.items() if not e <= TOLERANCE}
    assert not worst, f"{fork}/{type_name}/{case} on CUDA: errors above {TOLERANCE}: {worst}"


if __name__ == "__main__":
    import tempfile
    from collections import defaultdict

    largest: dict[tuple[str, str], float] = defaultdict(float)
    with tempfile.TemporaryDirectory() as tmp:
        for fork, type_name, case in CASES:
            errors = run_case(fork, type_name, case, Path(tmp))
            largest[(fork, type_name)] = max(largest[(fork, type_name)], *errors.values())
    for (fork, type_name), value in sorted(largest.items()):
        print(f"{fork:10s} {type_name:20s} {value:.2e}")
