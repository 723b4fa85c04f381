"""Writes the data-layer fixtures from the genuine BVLC Caffe 1.0: the inputs (images, image
lists, HDF5 files, a window file; databases and mean files written by Caffe's own tools and by
caffe-py's) under tests/golden/data_layers/inputs, and what pycaffe's data layers produce from
them (tests/golden/data_layers/caffe.npz) for every case of data_cases.py.

Run from the repository root, with Caffe built into /opt/caffe (../shared/caffe):

    GLOG_minloglevel=2 PYTHONPATH=/opt/caffe/python:$PWD python tests/golden/make_data_golden.py

The inputs are made from a fixed numpy seed, so running it again writes the same inputs (the
LevelDB directories' LOG files aside) and the same fixture. CI never runs it: the tests read
the committed files.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from data_cases import CASES, FIXTURE, HDF5_OUTPUT_NET, INPUTS, net_dict  # noqa: E402

CAFFE_BIN = Path(os.environ.get("CAFFE_ROOT", "/opt/caffe")) / "bin"
IMAGE_SIZES = [(5, 7), (9, 6), (6, 8), (12, 10), (4, 4), (7, 11)]  # (H, W) of images 0..5
WINDOW_IMAGES = [(14, 18), (12, 12), (16, 10)]


def write_inputs(out: Path) -> None:
    """Images, lists, HDF5 files and the window file, from numpy seed 0."""
    import h5py
    from PIL import Image

    rng = np.random.default_rng(0)
    (out / "img").mkdir(parents=True)
    lines = []
    for i, (h, w) in enumerate(IMAGE_SIZES):
        pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        name = f"{i}.jpg" if i == len(IMAGE_SIZES) - 1 else f"{i}.png"  # and one JPEG
        Image.fromarray(pixels).save(out / "img" / name, quality=90)
        lines.append(f"img/{name} {i % 3}")
    (out / "images.txt").write_text("\n".join(lines) + "\n")
    for name, rows in (("a.h5", 5), ("b.h5", 3)):
        with h5py.File(out / name, "w") as f:
            f["data"] = rng.standard_normal((rows, 2, 3)).astype(np.float32)
            f["label"] = rng.integers(0, 10, rows).astype(np.float64)  # read as float
    (out / "h5_list.txt").write_text("a.h5\nb.h5\n")
    (out / "h5_one.txt").write_text("a.h5\n")
    write_windows(out, rng)


def write_windows(out: Path, rng: np.random.Generator) -> None:
    from PIL import Image

    entries = []
    for i, (h, w) in enumerate(WINDOW_IMAGES):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
            out / "img" / f"w{i}.png")
        boxes = []
        for _ in range(5):
            x1, y1 = int(rng.integers(0, w - 3)), int(rng.integers(0, h - 3))
            x2, y2 = int(rng.integers(x1 + 1, w)), int(rng.integers(y1 + 1, h))
            overlap = float(rng.choice([0.1, 0.2, 0.5, 0.7, 0.9]))
            label = int(rng.integers(1, 4))
            boxes.append(f"{label} {overlap} {x1} {y1} {x2} {y2}")
        entries.append(f"# {i}\nimg/w{i}.png\n3\n{h}\n{w}\n{len(boxes)}\n" + "\n".join(boxes))
    (out / "windows.txt").write_text("\n".join(entries) + "\n")
    mean = rng.uniform(0, 255, (1, 3, 9, 9)).astype(np.float32)
    write_mean(out / "window_mean.binaryproto", mean)


def write_mean(path: Path, mean: np.ndarray) -> None:
    import caffe

    path.write_bytes(caffe.io.array_to_blobproto(mean).SerializeToString())


def caffe_tools(out: Path) -> None:
    """Databases and a mean file written by Caffe's convert_imageset and compute_image_mean."""
    for backend in ("lmdb", "leveldb"):
        subprocess.run([str(CAFFE_BIN / "convert_imageset"), "--resize_height=6",
                        "--resize_width=8", f"--backend={backend}", str(out) + "/",
                        str(out / "images.txt"), str(out / f"images_{backend}")], check=True,
                       capture_output=True)
    subprocess.run([str(CAFFE_BIN / "compute_image_mean"), str(out / "images_lmdb"),
                    str(out / "images_mean.binaryproto")], check=True, capture_output=True)


def caffe_py_tools(out: Path) -> None:
    """The same databases and mean written by caffe-py (for Caffe to read)."""
    from caffe_py.tools.convert import ImagesetOptions, convert_imageset
    from caffe_py.tools.mean import compute_mean

    for backend in ("lmdb", "leveldb"):
        convert_imageset(out, out / "images.txt", out / f"ours_{backend}",
                         ImagesetOptions(resize_height=6, resize_width=8), backend=backend)
    compute_mean(out / "ours_lmdb", out / "ours_mean.binaryproto")


ENUMS = ("backend", "phase", "snapshot_format", "solver_mode")  # written bare in a prototxt


def prototxt(value, indent: int = 0) -> str:
    """A caffe-py YAML-form dict as protobuf text (enums and booleans bare, strings quoted)."""
    pad = "  " * indent
    lines = []
    for key, item in value.items():
        for one in item if isinstance(item, list) else [item]:
            if isinstance(one, dict):
                lines.append(f"{pad}{key} {{\n{prototxt(one, indent + 1)}{pad}}}")
            elif isinstance(one, bool):
                lines.append(f"{pad}{key}: {str(one).lower()}")
            elif isinstance(one, str) and not (one.isupper() and key in ENUMS):
                lines.append(f'{pad}{key}: "{one}"')
            else:
                lines.append(f"{pad}{key}: {one}")
    return "\n".join(lines) + "\n"


def run_case(name: str, case: dict) -> dict[str, np.ndarray]:
    """A case's batches from pycaffe: {"<name>/<top>": (forwards, ...)}."""
    import caffe

    caffe.set_mode_cpu()
    caffe.set_random_seed(case["seed"])
    path = Path(f"{name}.prototxt")
    path.write_text(prototxt(net_dict(case)))
    net = caffe.Net(str(path), getattr(caffe, case["phase"]))
    path.unlink()
    batches: dict[str, list[np.ndarray]] = {top: [] for top in case["layer"]["top"]}
    for _ in range(case["forwards"]):
        net.forward()
        for top in batches:
            batches[top].append(net.blobs[top].data.copy())
    del net
    return {f"{name}/{top}": np.stack(values) for top, values in batches.items()}


def main() -> None:
    if INPUTS.exists():
        shutil.rmtree(INPUTS)
    write_inputs(INPUTS)
    caffe_tools(INPUTS)
    caffe_py_tools(INPUTS)
    arrays: dict[str, np.ndarray] = {}
    for name, case in CASES.items():
        # one process per case: HDF5Data's shuffle draws from the process's rand(), which a
        # case run before it would have advanced
        out = INPUTS.parent / f"{name}.npz"
        subprocess.run([sys.executable, __file__, "--case", name, str(out)], check=True)
        with np.load(out) as f:
            arrays.update(f)
        out.unlink()
        print(f"{name}: {case['forwards']} batches")
    subprocess.run([sys.executable, __file__, "--hdf5-output"], check=True)
    np.savez_compressed(FIXTURE, **arrays)
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes) and {INPUTS}")


def hdf5_output() -> None:
    """One forward of HDF5_OUTPUT_NET: Caffe's HDF5Output file, kept as hdf5_output_caffe.h5."""
    import caffe

    os.chdir(INPUTS)
    Path("hdf5_output.prototxt").write_text(prototxt(HDF5_OUTPUT_NET))
    net = caffe.Net("hdf5_output.prototxt", caffe.TEST)
    net.forward()
    del net  # closes the file
    Path("hdf5_output.prototxt").unlink()
    os.replace("hdf5_output.h5", "hdf5_output_caffe.h5")
    print("hdf5_output: 1 forward")


def one_case(name: str, out: str) -> None:
    os.chdir(INPUTS)  # Caffe reads relative paths from where it runs
    np.savez(out, **run_case(name, CASES[name]))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--case"]:
        one_case(sys.argv[2], sys.argv[3])
    elif sys.argv[1:2] == ["--hdf5-output"]:
        hdf5_output()
    else:
        main()
