"""Every fork layer type against its genuine fork: the fixtures make_fork_golden.py wrote with
the fork's pycaffe (tools/oracles builds the forks), compared with caffe-py's layer on the same
bottoms and blobs (test_golden.py's comparison: every array within 1e-5 relative, float32), and
the forks' data layers' batches from the same inputs and seed.

The detection forks' fixtures (ssd/, fast_rcnn/, rfcn/) are compared the same way: SSD's from
its pycaffe (make_ssd_golden.py), Faster R-CNN's and R-FCN's from the forks' own CUDA kernels
compiled for the CPU (make_kernel_golden.py: those forks have no CPU code for these layers);
on a CUDA machine every case runs on the GPU too. AnnotatedData is held to SSD's fork by its
batches and databases (test_annotated_golden.py), and SSD training by the fork's losses
(test_ssd_training_golden.py).

Types of forks not built here have no fixture; FORK_REFERENCES names the test that holds each
to a plain reference from its fork's source and a float64 gradcheck.

``python tests/golden/forks/test_fork_golden.py`` prints the largest error per fork and type.
"""
from __future__ import annotations

import csv
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from fork_cases import DATA_CASES  # noqa: E402
from test_golden import TOLERANCE, run_case  # noqa: E402

from caffe_py.io import ReaderPool, attach_feeds  # noqa: E402
from caffe_py.layers import registry  # noqa: E402
from caffe_py.net import Net  # noqa: E402
from caffe_py.spec.layer_params.forks import BVLC_TYPES  # noqa: E402
from caffe_py.spec.net_spec import parse_net  # noqa: E402
from caffe_py.spec.schema import Source  # noqa: E402

INPUTS = HERE / "inputs"
FORKS = ("segnet", "pspnet", "ssd", "fast_rcnn", "rfcn")
# Fork types with no fixture of a built fork: the module whose tests compare them with a plain
# reference written from the fork's source (and gradcheck them in float64).
FORK_REFERENCES: dict[str, str] = {
    "ConvolutionDepthwise": "tests/layers/test_mobile.py",
    "ShuffleChannel": "tests/layers/test_mobile.py",
    "Axpy": "tests/layers/test_mobile.py",
    "MarginInnerProduct": "tests/layers/test_face.py",
    "LabelSpecificAdd": "tests/layers/test_face.py",
    "CenterLoss": "tests/layers/test_face.py",
    "MatWrite": "tests/layers/test_segmentation.py",  # writes files: their layout checked there
    "Lstm": "tests/layers/test_sequence.py",
    "Reverse": "tests/layers/test_sequence.py",
    "Transpose": "tests/layers/test_sequence.py",
    "CTCGreedyDecoder": "tests/layers/test_sequence.py",
    "WarpCTCLoss": "tests/layers/test_sequence.py",
}
# The data layers: compared by their batches (DATA_CASES), not by the layer cases.
DATA_TYPES = {"DenseImageData": "segnet", "ImageSegData": "pspnet"}
# Types held to their fork by a test of their own: type -> (fork, what is compared, module).
OTHER_PROOFS: dict[str, tuple[str, str, str]] = {
    "AnnotatedData": ("ssd", "batches and LMDB bytes",
                      "tests/golden/forks/test_annotated_golden.py"),
}


def load_cases() -> list[tuple[str, str, str]]:
    """(fork, type, case) of every fixture file."""
    out = []
    for fork in FORKS:
        for path in sorted((HERE / fork).glob("*.npz")):
            if path.stem == "data":
                continue
            with np.load(path) as arrays:
                out += [(fork, path.stem, key[:-len("__spec")]) for key in arrays.files
                        if key.endswith("__spec")]
    return out


CASES = load_cases()


@pytest.mark.parametrize(("fork", "type_name", "case"), CASES,
                         ids=[f"{f}/{t}/{c}" for f, t, c in CASES])
def test_layer_matches_its_fork(fork, type_name, case, tmp_path):
    errors = run_case(type_name, case, tmp_path, fixtures=HERE / fork)
    worst = {name: e for name, e in errors.items() if not e <= TOLERANCE}
    assert not worst, f"{fork} {type_name}/{case}: errors above {TOLERANCE}: {worst}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(("fork", "type_name", "case"), CASES,
                         ids=[f"{f}/{t}/{c}" for f, t, c in CASES])
def test_layer_matches_its_fork_on_cuda(fork, type_name, case, tmp_path, monkeypatch):
    """The same on a CUDA net (DetectionOutput's decoding and NMS, the R-CNN poolings run
    there as tensor operations), TF32 off."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    errors = run_case(type_name, case, tmp_path, device="cuda", fixtures=HERE / fork)
    worst = {name: e for name, e in errors.items() if not e <= TOLERANCE}
    assert not worst, f"{fork} {type_name}/{case} on CUDA: errors above {TOLERANCE}: {worst}"


def data_cases() -> list[tuple[str, str]]:
    return [(fork, name) for fork in FORKS if (HERE / fork / "data.npz").exists()
            for name in DATA_CASES[fork]]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    copy = tmp_path_factory.mktemp("fork_inputs") / "inputs"
    shutil.copytree(INPUTS, copy)
    return copy


def caffe_py_batches(case: dict, inputs: Path) -> dict[str, np.ndarray]:
    spec = parse_net({"name": "data", "layer": [case["layer"]]},
                     Source(str(inputs / "net.yaml"), inputs))
    net = Net(spec, case["phase"], seed=case["seed"])
    tops: dict[str, list[np.ndarray]] = {top: [] for top in case["layer"]["top"]}
    with ReaderPool() as pool:
        attach_feeds(net, pool, seed=case["seed"])
        pool.start()
        for _ in range(case["forwards"]):
            out = net().outputs
            for top in tops:
                tops[top].append(out[top].to("cpu", torch.float32).numpy())
    return {top: np.stack(values) for top, values in tops.items()}


@pytest.mark.parametrize(("fork", "name"), data_cases(), ids=[f"{f}/{n}" for f, n in
                                                             data_cases()])
def test_data_layer_gives_its_forks_batches(fork, name, inputs):
    case = DATA_CASES[fork][name]
    ours = caffe_py_batches(case, inputs)
    with np.load(HERE / fork / "data.npz") as theirs:
        for top in case["layer"]["top"]:
            want = theirs[f"{name}/{top}"]
            assert ours[top].shape == want.shape, f"{name}: {top}"
            np.testing.assert_allclose(ours[top], want, rtol=1e-6, atol=1e-5,
                                       err_msg=f"{fork} {name}: {top}")


def test_every_fork_type_has_fixtures_or_a_reference():
    library = {t for t in registry.known_types()
               if registry.lookup(t).__module__.startswith("caffe_py.layers.")} - BVLC_TYPES
    covered = ({t for _, t, _ in CASES} | set(FORK_REFERENCES) | set(DATA_TYPES)
               | set(OTHER_PROOFS))
    missing = library - covered
    assert not missing, (f"fork layer types with neither fixtures nor a reference: "
                         f"{', '.join(sorted(missing))}")
    for type_name, fork in DATA_TYPES.items():
        assert any(c["layer"]["type"] == type_name for c in DATA_CASES[fork].values())


def test_the_fixtures_are_small():
    total = sum(p.stat().st_size for p in HERE.rglob("*.npz"))
    total += sum(p.stat().st_size for p in INPUTS.rglob("*") if p.is_file())
    assert total < 1_000_000, f"the fork fixtures take {total} bytes"


def summary() -> dict[tuple[str, str], tuple[int, float]]:
    """(fork, type) -> (cases, largest error) over the layer fixtures."""
    import tempfile

    out: dict[tuple[str, str], tuple[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fork, type_name, case in CASES:
            errors = run_case(type_name, case, Path(tmp), fixtures=HERE / fork)
            n, worst = out.get((fork, type_name), (0, 0.0))
            out[(fork, type_name)] = (n + 1, max([worst, *errors.values()]))
    return out


if __name__ == "__main__":
    print("| fork | type | cases | max error |\n|---|---|---|---|")
    for (fork, type_name), (n, worst) in sorted(summary().items()):
        print(f"| {fork} | {type_name} | {n} | {worst:.1e} |")


def test_training_gives_segnets_losses(tmp_path, monkeypatch):
    """configs/segnet_toy's net as make_fork_golden.py's training_prototxt() adapts it, trained
    by `cpy train` from the initial weights SegNet's Caffe saved: the same losses, step by
    step, as the fork's first steps."""
    from click.testing import CliRunner

    from caffe_py.cli import cli

    fork = HERE / "segnet"
    shutil.copytree(INPUTS / "toy", tmp_path / "toy")
    shutil.copy(fork / "segnet_toy_train.prototxt", tmp_path / "toy")
    (tmp_path / "toy" / "solver.prototxt").write_text(
        'net: "segnet_toy_train.prototxt"\nbase_lr: 0.01\nlr_policy: "fixed"\nmomentum: 0.9\n'
        "weight_decay: 0.0005\nmax_iter: 8\ndisplay: 1\nrandom_seed: 1701\n"
        'snapshot_prefix: "snaps/toy"\nsnapshot_after_train: false\nsolver_mode: CPU\n')
    monkeypatch.chdir(tmp_path / "toy")
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.prototxt", "--gpus", "cpu",
                                      "--weights", str(fork / "segnet_toy_init.caffemodel")])
    assert result.exit_code == 0, result.output
    with (tmp_path / "toy" / "snaps" / "toy_metrics.csv").open(newline="") as f:
        # the rows of the 8 steps (the table's last row is the final iteration's, after them)
        ours = [float(row["train/loss"]) for row in csv.DictReader(f)
                if row["phase"] == "train" and int(row["iteration"]) < 8]
    with np.load(fork / "train.npz") as theirs:
        np.testing.assert_allclose(ours, theirs["losses"], rtol=1e-5)
