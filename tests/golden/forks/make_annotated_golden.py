"""AnnotatedData fixtures from SSD's Caffe fork: a tiny VOC-style set (six images of shapes,
their XML annotations, a label map) converted by the fork's own convert_annoset into LMDBs
(PNG-encoded and raw pixels), and what the fork's AnnotatedData layer makes of them in the TEST
phase (no random step: resize, crop, mean, scale), under tests/golden/forks/ssd/annotated/.
The same set converted by caffe-py's `cpy convert annoset` is read by the fork too, so the
fixtures say how each reads the other's databases (test_annotated_golden.py compares).

With the fork built by tools/oracles/ssd/build_ssd.sh, from the repository root::

    GLOG_minloglevel=2 PYTHONPATH=/opt/ssd/python:$PWD \\
        python tests/golden/forks/make_annotated_golden.py

The images come from a fixed seed; CI never runs this.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE)]
OUT = HERE / "ssd" / "annotated"
FORK_BIN = Path(os.environ.get("SSD_ROOT", "/opt/ssd")) / "bin"
SIZES = [(36, 48), (52, 40), (40, 40), (30, 56), (48, 36), (44, 44)]  # (H, W) per image
from annotated_cases import CASES, layer_text  # noqa: E402


def write_set(out: Path) -> None:
    """Six images of one to three shapes each, VOC XML, list file and label map."""
    sys.path.insert(0, str(HERE.parents[2] / "data"))
    from PIL import Image
    from shapes_detection import CLASSES, make_image, voc_xml

    rng = np.random.default_rng(7)
    (out / "images").mkdir(parents=True)
    (out / "xml").mkdir()
    lines = []
    for i, (h, w) in enumerate(SIZES):
        square, objects = make_image(rng, max(h, w))
        image = square.resize((w, h), Image.Resampling.NEAREST)
        sx, sy = w / square.width, h / square.height
        boxes = [(name, (int(x0 * sx), int(y0 * sy), int(x1 * sx), int(y1 * sy)))
                 for name, (x0, y0, x1, y1) in objects]
        image.save(out / "images" / f"{i}.png")
        xml = voc_xml(f"{i}.png", 0, boxes).replace("<width>0</width>", f"<width>{w}</width>")
        xml = xml.replace("<height>0</height>", f"<height>{h}</height>")
        if i == 2:  # a difficult box
            xml = xml.replace("<difficult>0</difficult>", "<difficult>1</difficult>", 1)
        (out / "xml" / f"{i}.xml").write_text(xml)
        lines.append(f"images/{i}.png xml/{i}.xml")
    (out / "list.txt").write_text("".join(f"{line}\n" for line in lines))
    items = [("background", 0)] + [(c, k + 1) for k, c in enumerate(CLASSES)]
    (out / "labelmap.prototxt").write_text("".join(
        f'item {{\n  name: "{n}"\n  label: {label}\n  display_name: "{n}"\n}}\n'
        for n, label in items))


def fork_convert(out: Path, db: str, encoded: bool) -> None:
    flags = ["--anno_type=detection", "--label_type=xml",
             f"--label_map_file={out / 'labelmap.prototxt'}"]
    if encoded:
        flags += ["--encoded", "--encode_type=png"]
    env = dict(os.environ, LD_LIBRARY_PATH=str(FORK_BIN.parent / "lib"), GLOG_minloglevel="2")
    subprocess.run([str(FORK_BIN / "convert_annoset"), *flags, f"{out}/", str(out / "list.txt"),
                    str(out / db)], check=True, env=env)


def cpy_convert(out: Path, db: Path, encoded: bool) -> None:
    from caffe_py.tools.annoset import AnnosetOptions, convert_annoset

    options = AnnosetOptions(label_map_file=str(out / "labelmap.prototxt"), encoded=encoded,
                             encode_type="png" if encoded else "")
    convert_annoset(out, out / "list.txt", db, options)


def run_fork(case: dict, source: Path, tmp: Path) -> list[np.ndarray]:
    """Two forward passes of the fork's AnnotatedData: data and label of each."""
    import caffe

    net_path = tmp / "net.prototxt"
    net_path.write_text(layer_text(case, str(source)))
    net = caffe.Net(str(net_path), caffe.TEST)
    out = []
    for _ in range(2):
        net.forward()
        out += [net.blobs["data"].data.copy(), net.blobs["label"].data.copy()]
    return out


def main() -> None:
    import caffe

    caffe.set_mode_cpu()
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    write_set(OUT)
    fork_convert(OUT, "fork_png_lmdb", encoded=True)
    fork_convert(OUT, "fork_raw_lmdb", encoded=False)
    arrays: dict[str, np.ndarray] = {}
    with tempfile.TemporaryDirectory() as tmp:
        ours = {True: Path(tmp) / "cpy_png_lmdb", False: Path(tmp) / "cpy_raw_lmdb"}
        for encoded, db in ours.items():
            cpy_convert(OUT, db, encoded)
        for case in CASES:
            encoded = case["encoded"]
            fork_db = OUT / ("fork_png_lmdb" if encoded else "fork_raw_lmdb")
            for who, source in (("fork_db", fork_db), ("cpy_db", ours[encoded])):
                for k, value in enumerate(run_fork(case, source, Path(tmp))):
                    arrays[f"{case['name']}__{who}__{k}"] = value
            arrays[f"{case['name']}__spec"] = np.array(json.dumps(case, sort_keys=True))
            print(case["name"], flush=True)
    np.savez_compressed(OUT / "fork_outputs.npz", **arrays)
    for lmdb_dir in OUT.glob("*_lmdb"):
        (lmdb_dir / "lock.mdb").unlink(missing_ok=True)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    os.environ.setdefault("GLOG_minloglevel", "2")
    main()
