"""Record the genuine Caffe's training losses for whole nets (tests/golden/whole_nets/).

For each net this writes, beside its ``net.prototxt``: a ``solver.prototxt``, a tiny LMDB
written by Caffe's own ``convert_imageset`` from images this script draws (seeded), and, for
CIFAR-10 quick, the mean file from Caffe's ``compute_image_mean``. It then fills the TRAIN
net's blobs with :func:`initial_blobs` (seeded, in layer and blob order), saves them as a
``.caffemodel`` with pycaffe, and trains from it twice: with pycaffe's ``solver.step(1)``
(the loss blob after each iteration, in full float32) and with ``caffe train --weights``
(the printed ``Iteration N, loss = X`` lines, which must equal the pycaffe losses printed
with six significant digits). ``expected.json`` keeps the losses, the printed lines and a
checksum of every initial blob as Caffe read it back, so that the tests
(tests/golden/test_whole_nets.py) can rebuild the same weights without a .caffemodel and
compare caffe-py's Solver with Caffe without Caffe.

Run it with the Python that has pycaffe (BVLC Caffe 1.0 built by ../shared/caffe):

    PYTHONPATH=/opt/caffe/python /usr/bin/python3 tests/golden/make_whole_nets.py

Options: ``--caffe DIR`` (default /opt/caffe), ``--only NAME`` (repeatable). It needs only
numpy and pycaffe, and imports nothing of caffe_py: the tests import this module for
:func:`initial_blobs` and :data:`NETS`.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent / "whole_nets"
CAFFE_SRC = Path("/opt/caffe-src/caffe")
SEED = 1


@dataclass(frozen=True)
class Records:
    """A tiny LMDB: ``count`` records of (channels, height, width), seeded images or (with
    ``mnist``) the first Fashion-MNIST training images through Caffe's convert_mnist_data."""

    folder: str
    shape: tuple[int, int, int]
    count: int
    classes: int
    mean_file: bool = False
    mnist: Path | None = None


@dataclass(frozen=True)
class Case:
    """One net: its folder, the solver fields, the iterations recorded, its records."""

    name: str
    records: Records
    solver: dict[str, object]
    iterations: int
    bvlc: str | None = None
    """The BVLC prototxt the net.prototxt is made from (else net.prototxt is written by hand)."""
    edits: tuple[tuple[str, str], ...] = ()
    needs: tuple[str, ...] = field(default=())
    """Layer types caffe-py must have for the comparison to run."""
    gain: float = 1.0
    """Scales the initial weights (CIFAR-10 quick reads unscaled pixels)."""


FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
MNIST = Records("lenet/train_lmdb", (1, 28, 28), 128, 10, mnist=FASHION_MNIST)
CIFAR = Records("cifar10_quick/train_lmdb", (3, 32, 32), 40, 10, mean_file=True)
STEPS = Records("lstm/train_lmdb", (1, 1, 8), 40, 3)

LENET_SOLVER = {"base_lr": 0.01, "momentum": 0.9, "weight_decay": 0.0005, "lr_policy": "inv",
                "gamma": 0.0001, "power": 0.75}
QUICK_SOLVER = {"base_lr": 0.001, "momentum": 0.9, "weight_decay": 0.004, "lr_policy": "fixed"}

NETS = {c.name: c for c in [
    Case("lenet", MNIST, LENET_SOLVER, 20, bvlc="examples/mnist/lenet_train_test.prototxt",
         edits=(('"examples/mnist/mnist_train_lmdb"', '"train_lmdb"'),
                ('"examples/mnist/mnist_test_lmdb"', '"train_lmdb"'))),
    Case("cifar10_quick", CIFAR, QUICK_SOLVER, 10,
         bvlc="examples/cifar10/cifar10_quick_train_test.prototxt",
         edits=(('"examples/cifar10/cifar10_train_lmdb"', '"train_lmdb"'),
                ('"examples/cifar10/cifar10_test_lmdb"', '"train_lmdb"'),
                ('"examples/cifar10/mean.binaryproto"', '"mean.binaryproto"'),
                ("batch_size: 100", "batch_size: 10")), gain=0.4),
    Case("mini_googlenet", CIFAR, {**QUICK_SOLVER, "base_lr": 0.01}, 8),
    Case("mini_fcn", CIFAR, {**QUICK_SOLVER, "base_lr": 0.01}, 8, needs=("Crop",)),
    Case("lstm", STEPS, {"base_lr": 0.1, "momentum": 0.9, "weight_decay": 0.0005,
                         "lr_policy": "step", "gamma": 0.5, "stepsize": 4,
                         "clip_gradients": 0.5}, 10),
]}


# --- what the tests share ---------------------------------------------------------------------
def initial_blobs(shapes: list[tuple[int, ...]], gain: float = 1.0,
                  seed: int = SEED) -> list[np.ndarray]:
    """The initial value of every learnable blob, in net order: U(-a, a) with
    a = gain * sqrt(3 / fan_in) for weights (fan_in: the product of the shape past axis 0)
    and a = 0.1 for 1-D blobs (biases), drawn in turn from one RandomState(seed) stream."""
    rng = np.random.RandomState(seed)
    out = []
    for shape in shapes:
        a = gain * np.sqrt(3.0 / int(np.prod(shape[1:]))) if len(shape) >= 2 else 0.1
        out.append(rng.uniform(-a, a, size=tuple(shape)).astype(np.float32))
    return out


def blob_sums(blobs: list[np.ndarray]) -> list[str]:
    """Per blob: the SHA-256 of its float32 values (the first 16 hex digits)."""
    return [hashlib.sha256(np.ascontiguousarray(b, np.float32).tobytes()).hexdigest()[:16]
            for b in blobs]


def printed(loss: float) -> str:
    """A loss as Caffe's log prints it (an ostream's default: six significant digits)."""
    return f"{loss:.6g}"


def smoothed(losses: list[float]) -> list[float]:
    """What ``caffe train`` prints with average_loss 1: Caffe's UpdateSmoothedLoss keeps a
    float32 running value, s += loss - previous loss, which drifts from the loss itself by
    rounding (pycaffe's step(1) restarts it every call, so it prints the loss)."""
    out = [np.float32(losses[0])]
    for prev, loss in zip(losses[:-1], losses[1:], strict=True):
        out.append(np.float32(out[-1] + np.float32(np.float32(loss) - np.float32(prev))))
    return [float(x) for x in out]


# --- records ----------------------------------------------------------------------------------
def draw_images(rec: Records, seed: int = SEED) -> list[tuple[np.ndarray, int]]:
    """Seeded uint8 images (H, W) or (H, W, 3) whose label shows: class k brightens row band,
    column band or tint k, over noise."""
    rng = np.random.RandomState(seed)
    c, h, w = rec.shape
    out = []
    for i in range(rec.count):
        label = i % rec.classes
        img = rng.randint(0, 90, size=(h, w, c)).astype(np.int32)
        if h > 1:
            band = 2 * label % h
            img[band:band + 3, :, :] += 120
            img[:, (3 * label) % w:(3 * label) % w + 2, :] += 40
        else:
            img[:, label::rec.classes, :] += 140
        if c == 3:
            img[..., label % 3] += 30
        out.append((np.clip(img, 0, 255).astype(np.uint8), label))
    return out


def write_image(path: Path, img: np.ndarray) -> None:
    """A binary PGM (gray) or PPM (RGB): formats OpenCV's imread reads."""
    h, w, c = img.shape
    magic = b"P5" if c == 1 else b"P6"
    path.write_bytes(magic + f"\n{w} {h}\n255\n".encode() + img.tobytes())


def make_mnist_records(rec: Records, caffe: Path, db: Path) -> None:
    """The first ``count`` Fashion-MNIST training images through convert_mnist_data (which
    converts whole IDX files: these are cut to ``count`` items)."""
    with tempfile.TemporaryDirectory() as tmp:
        for kind, item in (("images", rec.shape[1] * rec.shape[2]), ("labels", 1)):
            raw = gzip.decompress((rec.mnist / f"train-{kind}-idx{3 if item > 1 else 1}"
                                   "-ubyte.gz").read_bytes())
            head = 16 if item > 1 else 8
            cut = raw[:4] + rec.count.to_bytes(4, "big") + raw[8:head]
            (Path(tmp) / kind).write_bytes(cut + raw[head:head + rec.count * item])
        run([str(caffe / "bin" / "convert_mnist_data"), f"{tmp}/images", f"{tmp}/labels",
             str(db), "--backend", "lmdb"])


def make_records(rec: Records, caffe: Path) -> None:
    """The LMDB through Caffe's convert_imageset or convert_mnist_data (and
    compute_image_mean when wanted)."""
    db = HERE / rec.folder
    shutil.rmtree(db, ignore_errors=True)
    db.parent.mkdir(parents=True, exist_ok=True)
    if rec.mnist is not None:
        make_mnist_records(rec, caffe, db)
        return
    with tempfile.TemporaryDirectory() as tmp:
        lines = []
        for i, (img, label) in enumerate(draw_images(rec)):
            name = f"{i:04d}.{'pgm' if rec.shape[0] == 1 else 'ppm'}"
            write_image(Path(tmp) / name, img)
            lines.append(f"{name} {label}\n")
        listfile = Path(tmp) / "list.txt"
        listfile.write_text("".join(lines))
        gray = ["--gray"] if rec.shape[0] == 1 else []
        run([str(caffe / "bin" / "convert_imageset"), *gray, "--backend", "lmdb",
             f"{tmp}/", str(listfile), str(db)])
    if rec.mean_file:
        run([str(caffe / "bin" / "compute_image_mean"), str(db),
             str(db.parent / "mean.binaryproto")])


# --- nets and solvers -------------------------------------------------------------------------
def write_net(case: Case) -> None:
    if case.bvlc is None:
        return
    text = (CAFFE_SRC / case.bvlc).read_text()
    for old, new in case.edits:
        if old not in text:
            raise SystemExit(f"{case.bvlc}: '{old}' not found")
        text = text.replace(old, new)
    head = (f"# BVLC Caffe's {case.bvlc} (BSD 2-Clause), its paths pointing at this folder"
            + ("; batch_size 10" if "batch_size: 10" in text else "") + ".\n")
    (HERE / case.name / "net.prototxt").write_text(head + text)


def write_solver(case: Case) -> None:
    fields = {"net": "net.prototxt", **case.solver, "display": 1, "max_iter": case.iterations,
              "snapshot_after_train": False, "random_seed": 1701, "solver_mode": "CPU"}
    lines = [f"{k}: {json.dumps(v) if isinstance(v, str) and k in ('net', 'lr_policy') else v}"
             for k, v in fields.items()]
    text = "\n".join(lines).replace("False", "false") + "\n"
    (HERE / case.name / "solver.prototxt").write_text(text)


def run(cmd: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return done.stderr


# --- training with Caffe ----------------------------------------------------------------------
def record(case: Case, caffe_dir: Path) -> dict[str, object]:
    import caffe

    caffe.set_mode_cpu()
    folder = HERE / case.name
    os.chdir(folder)  # Caffe resolves the relative paths in the prototxts against the cwd
    with tempfile.TemporaryDirectory() as tmp:
        init = Path(tmp) / "init.caffemodel"
        net = caffe.Net("net.prototxt", caffe.TRAIN)
        shapes = [tuple(b.data.shape) for blobs in net.params.values() for b in blobs]
        values = iter(initial_blobs(shapes, case.gain))
        for blobs in net.params.values():
            for b in blobs:
                b.data[...] = next(values)
        net.save(str(init))
        solver = caffe.get_solver("solver.prototxt")
        solver.net.copy_from(str(init))
        sums = blob_sums([b.data for blobs in solver.net.params.values() for b in blobs])
        losses = []
        for _ in range(case.iterations):
            solver.step(1)
            losses.append(float(solver.net.blobs["loss"].data))
        log = run([str(caffe_dir / "bin" / "caffe"), "train", "--solver", "solver.prototxt",
                   "--weights", str(init)], cwd=folder)
    lines = re.findall(r"Iteration (\d+) \([^)]*\), loss = (\S+)", log)
    caffe_printed = [value for _, value in lines][:case.iterations]
    if caffe_printed != [printed(x) for x in smoothed(losses)]:
        raise SystemExit(f"{case.name}: caffe train printed {caffe_printed}, pycaffe's losses "
                         f"smoothed as Caffe does {[printed(x) for x in smoothed(losses)]}")
    return {"iterations": case.iterations, "gain": case.gain, "losses": losses,
            "printed": caffe_printed,
            "blob_sums": sums, "blob_shapes": [list(s) for s in shapes]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--caffe", type=Path, default=Path("/opt/caffe"))
    parser.add_argument("--only", action="append", choices=list(NETS))
    args = parser.parse_args()
    expected_path = HERE / "expected.json"
    expected = json.loads(expected_path.read_text()) if expected_path.exists() else {}
    made: set[str] = set()
    for name in args.only or list(NETS):
        case = NETS[name]
        if case.records.folder not in made:
            make_records(case.records, args.caffe)
            made.add(case.records.folder)
        write_net(case)
        write_solver(case)
        expected[name] = record(case, args.caffe.resolve())
        print(f"{name}: {' '.join(expected[name]['printed'])}")
    for folder in made:
        (HERE / folder / "lock.mdb").unlink(missing_ok=True)  # readers need only data.mdb
    expected["_about"] = {
        "caffe": "BVLC Caffe 1.0.0 (master 9b89154), CPU, built by ../shared/caffe",
        "command": "PYTHONPATH=/opt/caffe/python /usr/bin/python3 "
                   "tests/golden/make_whole_nets.py",
        "python": sys.version.split()[0], "numpy": np.__version__}
    expected_path.write_text(json.dumps(dict(sorted(expected.items())), indent=1) + "\n")


if __name__ == "__main__":
    main()
