"""Write the fork fixtures: every layer case of cases.py run forward and backward by a genuine
Caffe fork (its pycaffe), saved as tests/golden/forks/<fork>/<Type>.npz, and its data-layer
cases' batches, saved as tests/golden/forks/<fork>/data.npz.

The forks are built by tools/oracles/build_fork.sh into /opt/<fork> (pycaffe for Debian's
/usr/bin/python3); run from the repository root::

    GLOG_minloglevel=2 PYTHONPATH=/opt/segnet/python:$PWD /usr/bin/python3 \\
        tests/golden/forks/make_fork_golden.py segnet
    GLOG_minloglevel=2 PYTHONPATH=/opt/pspnet/python:$PWD /usr/bin/python3 \\
        tests/golden/forks/make_fork_golden.py pspnet

The layer cases run as tests/golden/make_golden.py runs BVLC Caffe's (its code, with one more
value generator). The data cases run the layer in the TRAIN net of a solver whose random_seed
is the case's seed (neither fork's pycaffe has set_random_seed; Solver::Init seeds Caffe's
stream before it builds the net, as caffe-py's attach_feeds seeds it), from the images and
lists this script writes under inputs/ (numpy seed 0: a re-run writes the same files). For
SegNet it also trains configs/segnet_toy's net (as training_prototxt() adapts it) for a few
steps on a toy set (data/toy_segmentation.py) from the initial weights it saves, and keeps
the losses. CI never runs it: test_fork_golden.py reads the committed files.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import make_golden  # noqa: E402  (imports pycaffe: the fork's, from PYTHONPATH)
from fork_cases import DATA_CASES, LAYER_CASES  # noqa: E402

INPUTS = HERE / "inputs"
IMAGE_SIZES = [(7, 9), (12, 10), (5, 6), (10, 14), (8, 8)]  # (H, W) of images 0..4
_base_generate = make_golden.generate


def generate(gen: str, shape: tuple[int, ...], rng: np.random.RandomState) -> np.ndarray:
    """make_golden's generators and ``pool_index:H:W:K:S`` (cases.py)."""
    kind, *args = gen.split(":")
    if kind != "pool_index":
        return _base_generate(gen, shape, rng)
    h, w, k, s = (int(a) for a in args)
    n, c, ph, pw = shape
    out = np.empty(shape, np.float32)
    for i in np.ndindex(n, c, ph, pw):
        y = min(i[2] * s + rng.randint(0, k), h - 1)
        x = min(i[3] * s + rng.randint(0, k), w - 1)
        out[i] = y * w + x
    return out


def write_inputs() -> None:
    """Colour images, gray label images (classes 0..4 and 255), and the lists."""
    from PIL import Image

    rng = np.random.default_rng(0)
    (INPUTS / "img").mkdir(parents=True, exist_ok=True)
    pairs, classes = [], []
    for i, (h, w) in enumerate(IMAGE_SIZES):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
            INPUTS / "img" / f"{i}.png")
        label = rng.integers(0, 5, (h, w)).astype(np.uint8)
        label[rng.uniform(size=(h, w)) < 0.1] = 255
        Image.fromarray(label).save(INPUTS / "img" / f"{i}_label.png")
        pairs.append(f"img/{i}.png img/{i}_label.png")
        classes.append(f"img/{i}.png {i % 3}")
    (INPUTS / "pairs.txt").write_text("\n".join(pairs) + "\n")
    (INPUTS / "classes.txt").write_text("\n".join(classes) + "\n")


# Types whose fork has no backward (NOT_IMPLEMENTED, which pycaffe's backward would reach):
# their cases compare the forward alone.
FORWARD_ONLY = {"SegAccuracy"}


def forward_only(run, case: dict, tmp: Path) -> dict[str, np.ndarray]:
    """``run(case, tmp)`` with pycaffe's Net.backward a no-op."""
    import caffe

    backward = caffe.Net.backward
    caffe.Net.backward = lambda self, *args, **kwargs: {}
    try:
        return run(case, tmp)
    finally:
        caffe.Net.backward = backward


def has_parameter_layer() -> bool:
    """Whether the fork's Caffe knows the Parameter layer (2016); SegNet's predates it."""
    from caffe.proto import caffe_pb2

    return "parameter_param" in caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name


def run_case_on_inputs(case: dict, tmp: Path) -> dict[str, np.ndarray]:
    """make_golden.run_case for a Caffe without Parameter and Input layers: the bottoms are
    the net's inputs (input / input_shape) and force_backward makes Caffe back-propagate into
    them; the same arrays."""
    import caffe

    rng = np.random.RandomState(zlib.crc32(f"{case['type']}/{case['name']}".encode()))
    bottoms = [generate(b["gen"], tuple(b["shape"]), rng) for b in case["bottoms"]]
    lines = ['name: "golden"', "force_backward: true"]
    for i, bottom in enumerate(case["bottoms"]):
        lines += [f'input: "b{i}"', "input_shape {",
                  *[f"  dim: {d}" for d in bottom["shape"]], "}"]
    layer = {"name": "test", "type": case["type"], "bottom": [f"b{i}" for i in
                                                              range(len(bottoms))],
             "top": [f"t{k}" for k in range(case["tops"])], **case["params"],
             "loss_weight": [1.0] * case["tops"]}
    lines += ["layer {", *make_golden.prototxt_fields(layer), "}"]
    path = tmp / "net.prototxt"
    path.write_text("\n".join(lines) + "\n")
    net = caffe.Net(str(path), caffe.TRAIN if case["phase"] == "TRAIN" else caffe.TEST)
    arrays: dict[str, np.ndarray] = {}
    for i, value in enumerate(bottoms):
        net.blobs[f"b{i}"].data[...] = value
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
    for i in case["grad"]:
        arrays[f"bottom_diff{i}"] = net.blobs[f"b{i}"].diff.copy()
    for j, blob in enumerate(blobs):
        arrays[f"blob_diff{j}"] = blob.diff.copy()
        arrays[f"blob_after{j}"] = blob.data.copy()
    return arrays


def layer_fixtures(fork: str, out: Path) -> None:
    make_golden.generate = generate  # run_case draws through the module's name
    run = make_golden.run_case if has_parameter_layer() else run_case_on_inputs
    by_type: dict[str, dict[str, np.ndarray]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in LAYER_CASES[fork]():
            arrays = (forward_only(run, case, Path(tmp)) if case["type"] in FORWARD_ONLY
                      else run(case, Path(tmp)))
            store = by_type.setdefault(case["type"], {})
            store[f"{case['name']}__spec"] = np.array(json.dumps(case, sort_keys=True))
            for key, value in arrays.items():
                store[f"{case['name']}__{key}"] = value
            print(f"{fork} {case['type']}/{case['name']}: {len(arrays)} arrays", flush=True)
    for type_name, arrays in by_type.items():
        np.savez_compressed(out / f"{type_name}.npz", **arrays)


def data_batches(case: dict) -> dict[str, np.ndarray]:
    """The case's batches from the fork: {top: (forwards, ...)}."""
    import caffe

    net = {"name": "data", "layer": [case["layer"]]}
    Path("net.prototxt").write_text(make_data_prototxt(net))
    Path("solver.prototxt").write_text(
        f'net: "net.prototxt"\nbase_lr: 0\nrandom_seed: {case["seed"]}\nsolver_mode: CPU\n')
    caffe.set_mode_cpu()
    if case["phase"] == "TRAIN":
        solver = caffe.SGDSolver("solver.prototxt")
        net_obj = solver.net
    else:  # a TEST net draws nothing from the seeded stream in these cases
        net_obj = caffe.Net("net.prototxt", caffe.TEST)
    tops: dict[str, list[np.ndarray]] = {t: [] for t in case["layer"]["top"]}
    for _ in range(case["forwards"]):
        net_obj.forward()
        for top in tops:
            tops[top].append(net_obj.blobs[top].data.copy())
    Path("net.prototxt").unlink()
    Path("solver.prototxt").unlink()
    return {top: np.stack(values) for top, values in tops.items()}


def make_data_prototxt(net: dict) -> str:
    """The net as protobuf text (make_golden's writer: upper-case words bare, as enums)."""
    lines = [f'name: "{net["name"]}"']
    for layer in net["layer"]:
        lines += ["layer {", *make_golden.prototxt_fields(layer), "}"]
    return "\n".join(lines) + "\n"


TRAIN_STEPS = 8


def training_prototxt() -> str:
    """configs/segnet_toy's net as SegNet's Caffe can train it from a seed: the TRAIN data
    layer alone, without shuffle and mirror (its prefetch thread's draws are not seeded), no
    SegAccuracy (PSPNet's), and the Upsample sizes from ``scale`` (with upsample_h / upsample_w
    the fork's backward reads an unset member)."""
    import re

    text = (HERE.parents[2] / "configs" / "segnet_toy" / "segnet_toy.prototxt").read_text()
    layers = text.split("\nlayer {")
    kept = [part for part in layers if "phase: TEST" not in part]
    text = "\nlayer {".join(kept)
    text = text.replace(" shuffle: true mirror: true", "").replace("batch_size: 8", "batch_size: 4")
    return re.sub(r" upsample_h: \d+ upsample_w: \d+", "", text)


def training_case(out: Path) -> None:
    """The first TRAIN_STEPS losses of SegNet's Caffe training the toy net on inputs/toy from
    the initial weights it saves (segnet_toy_init.caffemodel)."""
    import caffe

    sys.path.insert(0, str(HERE.parents[2] / "data"))
    from toy_segmentation import write_set

    toy = INPUTS / "toy"
    if not toy.exists():
        write_set(toy, train=8, test=0, size=32, seed=5)
    (out / "segnet_toy_train.prototxt").write_text(training_prototxt())
    os.chdir(toy)
    Path("solver.prototxt").write_text(
        f'net: "{out / "segnet_toy_train.prototxt"}"\nbase_lr: 0.01\nlr_policy: "fixed"\n'
        "momentum: 0.9\nweight_decay: 0.0005\nmax_iter: 1000\nrandom_seed: 1701\n"
        "solver_mode: CPU\n")
    caffe.set_mode_cpu()
    solver = caffe.SGDSolver("solver.prototxt")
    solver.net.save(str(out / "segnet_toy_init.caffemodel"))
    losses = []
    for _ in range(TRAIN_STEPS):
        solver.step(1)
        losses.append(float(solver.net.blobs["loss"].data))
    Path("solver.prototxt").unlink()
    np.savez(out / "train.npz", losses=np.array(losses, np.float64))
    print(f"{TRAIN_STEPS} training steps: {losses}")


def main() -> None:
    fork = sys.argv[1]
    out = HERE / fork
    out.mkdir(exist_ok=True)
    if sys.argv[2:3] == ["--training"]:
        training_case(out)
        return
    if sys.argv[2:3] == ["--data-case"]:  # one process per case (see below)
        os.chdir(INPUTS)
        name = sys.argv[3]
        batches = data_batches(DATA_CASES[fork][name])
        np.savez(sys.argv[4], **{f"{name}/{t}": v for t, v in batches.items()})
        return
    make_golden.caffe.set_mode_cpu()
    layer_fixtures(fork, out)
    if not INPUTS.exists():
        write_inputs()
    arrays: dict[str, np.ndarray] = {}
    for name in DATA_CASES[fork]:
        # a process per case: the forks' prefetch threads outlive a net in pycaffe
        part = out / f"_{zlib.crc32(name.encode())}.npz"
        os.spawnv(os.P_WAIT, sys.executable,
                  [sys.executable, __file__, fork, "--data-case", name, str(part)])
        with np.load(part) as f:
            arrays.update(f)
        part.unlink()
        print(f"{fork} {name}: {DATA_CASES[fork][name]['forwards']} batches", flush=True)
    np.savez_compressed(out / "data.npz", **arrays)
    if fork == "segnet":
        os.spawnv(os.P_WAIT, sys.executable, [sys.executable, __file__, fork, "--training"])
    total = sum(p.stat().st_size for p in out.glob("*.npz"))
    print(f"{fork}: fixtures {total / 1e6:.2f} MB")


if __name__ == "__main__":
    os.environ.setdefault("GLOG_minloglevel", "2")
    main()
