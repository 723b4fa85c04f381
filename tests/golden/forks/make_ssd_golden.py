"""Write a Caffe fork's golden fixtures: every case of ``<fork>_cases.py`` run forward and
backward by the fork's own pycaffe, saved as tests/golden/forks/<fork>/<Type>.npz in the
format of tests/golden/fixtures (make_golden.py, whose net building and case running this
reuses; tests/golden/forks/test_fork_golden.py compares caffe-py with them).

SSD's Caffe (weiliu89/caffe, branch ssd, commit 4817bf8), built CPU-only by
tools/oracles/ssd/build_ssd.sh into /opt/ssd, on CPython 3.11 with numpy 2, from the
repository root::

    GLOG_minloglevel=2 PYTHONPATH=/opt/ssd/python:$PWD \\
        python tests/golden/forks/make_ssd_golden.py --fork ssd [--only Type,Type]

CI never runs this. The generators this adds to make_golden.py's are listed in
ssd_cases.py.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import make_golden  # noqa: E402  (tests/golden/make_golden.py; imports the fork's caffe)

BASE_GENERATE = make_golden.generate


def _grid_priors(h: int, w: int, per_cell: int) -> np.ndarray:
    """(1, 2, P x 4): boxes on an h x w grid, per_cell sizes/ratios, variances 0.1/0.2."""
    shapes = [(0.3, 0.3), (0.5, 0.5), (0.45, 0.25), (0.25, 0.45), (0.7, 0.6)][:per_cell]
    rows = []
    for y in range(h):
        for x in range(w):
            cx, cy = (x + 0.5) / w, (y + 0.5) / h
            rows += [(cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2) for bw, bh in shapes]
    boxes = np.asarray(rows, np.float32).reshape(-1)
    variances = np.tile(np.asarray([0.1, 0.1, 0.2, 0.2], np.float32), len(rows))
    return np.stack([boxes, variances])[None]


def _random_box(rng: np.random.RandomState, low: float = 0.15) -> list[float]:
    w, h = rng.uniform(low, 0.6, 2)
    x0, y0 = rng.uniform(0, 1 - w), rng.uniform(0, 1 - h)
    return [x0, y0, x0 + w, y0 + h]


def _ground_truth(rng: np.random.RandomState, images: int, rows: int, classes: int,
                  difficult: int) -> np.ndarray:
    """``rows`` ground-truth rows over images 0..images-2 (the last image has none)."""
    out = []
    for g in range(rows):
        image = g % max(1, images - 1)
        out.append([image, rng.randint(1, classes), g, *_random_box(rng),
                    1.0 if g < difficult else 0.0])
    return np.asarray(sorted(out, key=lambda r: r[0]), np.float32)


def _evaluation_set(seed: int, images: int, classes: int, dets: int, gts: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Detections (dets, 7) and the ground truth (gts, 8) they are scored against: one
    jittered detection per ground-truth box, a second one on some (a duplicate: a false
    positive), then detections of classes an image has no box of, and random boxes."""
    rng = np.random.RandomState(seed)
    gt = _ground_truth(rng, images, gts, classes, difficult=2)
    out = []
    for row in gt:
        box = np.asarray(row[3:7]) + rng.uniform(-0.06, 0.06, 4)
        out.append([row[0], row[1], rng.uniform(0.3, 1.0), *box])
    for row in gt[: max(1, gts // 3)]:
        box = np.asarray(row[3:7]) + rng.uniform(-0.1, 0.1, 4)
        out.append([row[0], row[1], rng.uniform(0.0, 0.9), *box])
    while len(out) < dets:
        out.append([rng.randint(0, images), rng.randint(1, classes), rng.uniform(0, 1),
                    *_random_box(rng, 0.05)])
    return np.asarray(out[:dets], np.float32), gt


def generate(gen: str, shape: tuple[int, ...], rng: np.random.RandomState) -> np.ndarray:
    kind, *args = gen.split(":")
    if kind == "priors":
        out = _grid_priors(*(int(a) for a in args))
    elif kind == "gt":
        images, rows, classes = (int(a) for a in args[:3])
        difficult = int(args[3]) if len(args) > 3 else 0
        out = _ground_truth(rng, images, rows, classes, difficult)[None, None]
    elif kind == "softmax":
        c = int(args[0])
        e = np.exp(rng.randn(*shape[:-1], shape[-1] // c, c) * 1.5)
        out = (e / e.sum(-1, keepdims=True)).reshape(shape)
    elif kind in ("dets", "detsgt"):
        seed, images, classes = (int(a) for a in args)
        dets_shape = (14,) if kind == "dets" else None
        d, g = _evaluation_set(seed, images, classes, dets_shape[0] if dets_shape else 14,
                               shape[2] if kind == "detsgt" else 7)
        out = (d if kind == "dets" else g)[None, None]
    else:
        return BASE_GENERATE(gen, shape, rng)
    out = np.asarray(out, np.float32)
    assert out.shape == tuple(shape), f"{gen}: made {out.shape}, the case says {shape}"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fork", required=True, help="the cases module <fork>_cases.py")
    parser.add_argument("--only", default="", help="comma-separated layer types to rewrite")
    args = parser.parse_args()
    only = {t for t in args.only.split(",") if t}
    cases = importlib.import_module(f"{args.fork}_cases")
    out_dir = HERE / args.fork
    out_dir.mkdir(exist_ok=True)
    make_golden.generate = generate
    make_golden.caffe.set_mode_cpu()
    make_golden.caffe.set_random_seed(1701)
    by_type: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases.all_cases():
            if only and case["type"] not in only:
                continue
            arrays = make_golden.run_case(case, Path(tmp))
            by_type[case["type"]][f"{case['name']}__spec"] = np.array(
                json.dumps(case, sort_keys=True))
            for key, value in arrays.items():
                by_type[case["type"]][f"{case['name']}__{key}"] = value
            print(f"{case['type']}/{case['name']}: {len(arrays)} arrays", flush=True)
    for type_name, arrays in by_type.items():
        np.savez_compressed(out_dir / f"{type_name}.npz", **arrays)
    total = sum(f.stat().st_size for f in out_dir.glob("*.npz"))
    print(f"{len(by_type)} fixture files written to {out_dir}; {total / 1e6:.2f} MB in all")


if __name__ == "__main__":
    os.environ.setdefault("GLOG_minloglevel", "2")
    main()
