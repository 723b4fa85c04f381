"""Write the golden fixtures: every layer case of cases.py run forward and backward by the
genuine BVLC Caffe 1.0 (pycaffe), saved as tests/golden/fixtures/<Type>.npz.

Made with BVLC Caffe 1.0 (the code of BVLC master 9b89154, CPU build, pycaffe,
``caffe.__version__`` 1.0.0) built by ../shared/caffe/build_caffe.sh into /opt/caffe, on
CPython 3.11 with scikit-image, scipy, six and pydot installed for pycaffe, by::

    GLOG_minloglevel=2 PYTHONPATH=/opt/caffe/python:$PWD python tests/golden/make_golden.py

run from the repository root (``--only Type[,Type]`` rewrites those types' files alone). CI
never runs this: tests/golden/test_golden.py reads the committed fixtures.

Each case is a net of one Parameter layer per bottom whose gradient is compared (so that
Caffe back-propagates into that bottom), one Input layer per other bottom, and the
layer under test with loss_weight 1 on every top. Bottoms and the layer's blobs are set from
seeded generators; after the forward every top's diff is set to seeded values, then the
backward runs. A fixture holds, per case ``<name>``: ``<name>__spec`` (the case as JSON),
``bottom<i>``, ``blob<j>`` (before), ``top<k>``, ``top_diff<k>``, ``bottom_diff<i>`` (for the
compared bottoms), ``blob_diff<j>``, ``blob_after<j>`` and ``file_<X>`` (a file the case reads,
e.g. InfogainLoss's matrix H).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import zlib
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "layers"), str(HERE.parent.parent)]

import caffe  # noqa: E402  (pycaffe, from PYTHONPATH)
from caffe.proto import caffe_pb2  # noqa: E402
from cases import all_cases  # noqa: E402

FIXTURES = HERE / "fixtures"
# Caffe's LossLayer types weight their first top by 1 themselves when they have one top; with
# two they need a weight per top (and SoftmaxWithLoss copies that list into an inner one-top
# Softmax, which refuses it: Caffe 1.0 cannot build a two-top SoftmaxWithLoss).
LOSS_TYPES = {"SoftmaxWithLoss", "EuclideanLoss", "SigmoidCrossEntropyLoss", "ContrastiveLoss",
              "HingeLoss", "InfogainLoss", "MultinomialLogisticLoss"}
_ENUM = re.compile(r"[A-Z][A-Z0-9_]*")
_STRING_FIELDS = {"module", "layer", "param_str", "source", "type", "name"}


def generate(gen: str, shape: tuple[int, ...], rng: np.random.RandomState) -> np.ndarray:
    """Values for one bottom or blob (see cases.py for the generators)."""
    kind, *args = gen.split(":")
    if kind == "randn":
        out = rng.randn(*shape) * (float(args[0]) if args else 1.0)
    elif kind == "uniform":
        out = rng.uniform(float(args[0]), float(args[1]), shape)
    elif kind == "away":
        out = rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    elif kind in ("labels", "index", "ints"):
        low, high = (0, int(args[0])) if kind != "ints" else (int(args[0]), int(args[1]))
        out = rng.randint(low, high, shape).astype(np.float64)
        if kind == "labels" and len(args) > 1:
            out[rng.uniform(size=shape) < 0.25] = float(args[1])
    elif kind == "binary":
        out = rng.randint(0, 2, shape).astype(np.float64)
    elif kind == "mask":
        out = rng.randint(0, 2, shape).astype(np.float64)
        out.reshape(shape[0], -1)[0] = 1.0
    elif kind in ("probs", "probs_zero_first"):
        e = np.exp(rng.randn(shape[0], int(np.prod(shape[1:]))))
        out = (e / e.sum(1, keepdims=True)).reshape(shape)
        if kind == "probs_zero_first":
            out.reshape(shape[0], -1)[0, 0] = 0.0
    elif kind == "cont":
        out = np.ones(shape)
        out[0] = 0.0 if args != ["carry"] else 1.0
        out[rng.randint(1, shape[0]), rng.randint(0, shape[1])] = 0.0
    elif kind == "const":
        out = np.full(shape, float(args[0]))
    else:
        raise ValueError(f"unknown generator {gen!r}")
    return np.asarray(out, dtype=np.float32)


def prototxt_fields(message: dict, indent: str = "  ") -> list[str]:
    """A dict of Caffe fields as protobuf text lines (lists are repeated fields)."""
    lines = []
    for key, value in message.items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                lines += [f"{indent}{key} {{", *prototxt_fields(item, indent + "  "),
                          f"{indent}}}"]
            elif isinstance(item, bool):
                lines.append(f"{indent}{key}: {'true' if item else 'false'}")
            elif isinstance(item, (int, float)):
                lines.append(f"{indent}{key}: {item!r}")
            elif _ENUM.fullmatch(item) and key not in _STRING_FIELDS:
                lines.append(f"{indent}{key}: {item}")
            else:
                lines.append(f"{indent}{key}: {json.dumps(item)}")
    return lines


def net_text(case: dict, params: dict) -> str:
    """The case's net: a source layer per bottom, then the layer under test."""
    lines = ['name: "golden"']
    bottoms = []
    for i, bottom in enumerate(case["bottoms"]):
        kind = "Parameter" if i in case["grad"] else "Input"
        block = "parameter_param" if kind == "Parameter" else "input_param"
        lines += [f'layer {{ name: "src{i}" type: "{kind}" top: "b{i}"',
                  *prototxt_fields({block: {"shape": {"dim": bottom["shape"]}}}), "}"]
        bottoms.append(f"b{i}")
    layer = {"name": "test", "type": case["type"], "bottom": bottoms,
             "top": [f"t{k}" for k in range(case["tops"])], **params}
    if case["type"] not in LOSS_TYPES or case["tops"] > 1:
        layer["loss_weight"] = [1.0] * case["tops"]
    lines += ["layer {", *prototxt_fields(layer), "}"]
    return "\n".join(lines) + "\n"


def write_blob(path: Path, array: np.ndarray) -> None:
    blob = caffe_pb2.BlobProto()
    blob.shape.dim.extend(array.shape)
    blob.data.extend(array.astype(np.float32).ravel().tolist())
    path.write_bytes(blob.SerializeToString())


def resolve_files(params: dict, rng: np.random.RandomState, tmp: Path,
                  files: dict[str, np.ndarray], classes: int) -> dict:
    """Replace each '@X' value by a .binaryproto written for it (InfogainLoss's H: C x C)."""
    out = {}
    for key, value in params.items():
        if isinstance(value, dict):
            out[key] = resolve_files(value, rng, tmp, files, classes)
        elif isinstance(value, str) and value.startswith("@"):
            name = value[1:]
            if name not in files:
                files[name] = generate("uniform:0:1", (classes, classes), rng)
            write_blob(tmp / f"{name}.binaryproto", files[name])
            out[key] = str(tmp / f"{name}.binaryproto")
        else:
            out[key] = value
    return out


def run_case(case: dict, tmp: Path) -> dict[str, np.ndarray]:
    """Forward and backward of one case in pycaffe; the arrays of its fixture."""
    rng = np.random.RandomState(zlib.crc32(f"{case['type']}/{case['name']}".encode()))
    arrays: dict[str, np.ndarray] = {}
    bottoms = [generate(b["gen"], tuple(b["shape"]), rng) for b in case["bottoms"]]
    files: dict[str, np.ndarray] = {}
    first = case["bottoms"][0]["shape"] if case["bottoms"] else []
    classes = first[1] if len(first) > 1 else 0  # InfogainLoss: the class axis 1
    params = resolve_files(case["params"], rng, tmp, files, classes)
    path = tmp / "net.prototxt"
    path.write_text(net_text(case, params))
    net = caffe.Net(str(path), caffe.TRAIN if case["phase"] == "TRAIN" else caffe.TEST)
    for i, value in enumerate(bottoms):
        target = net.params[f"src{i}"][0] if i in case["grad"] else net.blobs[f"b{i}"]
        target.data[...] = value
        arrays[f"bottom{i}"] = value
    blobs = net.params["test"] if "test" in net.params else []
    gens = case["blobs"] or ["randn:0.5"] * len(blobs)
    for j, (blob, gen) in enumerate(zip(blobs, gens, strict=True)):
        blob.data[...] = generate(gen, blob.data.shape, rng)
        arrays[f"blob{j}"] = blob.data.copy()
    net.forward()
    for k in range(case["tops"]):
        top = net.blobs[f"t{k}"]
        arrays[f"top{k}"] = top.data.copy()
        arrays[f"top_diff{k}"] = generate("randn", top.data.shape, rng)
        top.diff[...] = arrays[f"top_diff{k}"]
    net.backward()
    for i in case["grad"]:  # the bottom blob (Flatten's backward re-points its diff)
        arrays[f"bottom_diff{i}"] = net.blobs[f"b{i}"].diff.copy()
    for j, blob in enumerate(blobs):
        arrays[f"blob_diff{j}"] = blob.diff.copy()
        arrays[f"blob_after{j}"] = blob.data.copy()
    for name, value in files.items():
        arrays[f"file_{name}"] = value
    return arrays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default="", help="comma-separated layer types to rewrite")
    args = parser.parse_args()
    only = {t for t in args.only.split(",") if t}
    caffe.set_mode_cpu()
    caffe.set_random_seed(1701)
    by_type: dict[str, dict[str, np.ndarray]] = defaultdict(dict)
    FIXTURES.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for case in all_cases():
            if only and case["type"] not in only:
                continue
            arrays = run_case(case, Path(tmp))
            spec = json.dumps(case, sort_keys=True)
            by_type[case["type"]][f"{case['name']}__spec"] = np.array(spec)
            for key, value in arrays.items():
                by_type[case["type"]][f"{case['name']}__{key}"] = value
            print(f"{case['type']}/{case['name']}: {len(arrays)} arrays", flush=True)
    for type_name, arrays in by_type.items():
        np.savez_compressed(FIXTURES / f"{type_name}.npz", **arrays)
    total = sum(f.stat().st_size for f in FIXTURES.glob("*.npz"))
    print(f"{len(by_type)} fixture files written; all fixtures {total / 1e6:.2f} MB")


if __name__ == "__main__":
    os.environ.setdefault("GLOG_minloglevel", "2")
    main()
