"""The prep step: a workspace in which one exported pycaffe example runs, offline.

    python tools/oracles/pycaffe/prep.py CASE DIR       # CASE: see CASES in pycaffe_cases.py

copies caffe_tree/ (the exported scripts and BVLC's files they read) to DIR, makes there what
the example would download (all of it small, made from seeded numpy and Pillow, identical on
every run), and applies the case's substitutions to DIR's copy of the script. Made here:

- MNIST: examples/mnist/mnist_{train,test}_lmdb of 28x28 digit-like images (a blurred stroke
  pattern per class plus noise), written by caffe-py's `cpy convert idx` code in the
  records and keys of Caffe's convert_mnist_data;
- CaffeNet: models/bvlc_reference_caffenet/deploy.prototxt, a CaffeNet of CaffeNet's layer
  names and kinds but narrow layers (16 to 64 channels, 1000 classes), and its random
  .caffemodel; examples/net_surgery/bvlc_caffenet_full_conv.prototxt, its fully
  convolutional form (a 259 x 259 input); for the PASCAL example, a .caffemodel of
  CaffeNet's own widths for the 67 x 67 images it uses there;
- python/caffe/imagenet/ilsvrc_2012_mean.npy (3 x 256 x 256) and data/ilsvrc12/
  synset_words.txt (1000 labels);
- examples/images/cat.jpg, cat_gray.jpg and examples/image.jpg: synthetic pictures;
- data/pascal/VOC2012: 16 training and 16 validation pictures with VOC annotations.

Pictures are stored as PNG under the examples' .jpg names (lossless: every machine decodes
the same pixels). :func:`digest` fingerprints a workspace, so that a test can tell when its
inputs are not the ones the fixtures were made from.

The substitutions (SUBSTITUTIONS below) replace what a script would download by nothing (the
files are here already) and make the runs short enough for CI: fewer iterations and test
batches, and smaller PASCAL batches and images. Each names the text it replaces, which must
occur exactly as often as stated; nothing else in a script changes.
"""
from __future__ import annotations

import math
import shutil
import struct
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TREE = HERE / "caffe_tree"
SEED = 1701

FETCH = "# fetched by prep.py instead: "
SUBSTITUTIONS: dict[str, list[tuple[str, str, str, int]]] = {
    # script -> [(old, new, why, occurrences)]
    "examples/01-learning-lenet.py": [
        ("__import__('os').system('data/mnist/get_mnist.sh')",
         FETCH + "data/mnist/get_mnist.sh", "the MNIST download: the toy LMDBs are here", 1),
        ("__import__('os').system('examples/mnist/create_mnist.sh')",
         FETCH + "examples/mnist/create_mnist.sh", "the LMDB conversion: done by prep.py", 1),
        ("niter = 200\n", "niter = 50\n", "LeNet trained 50 iterations, not 200 (CI time)", 1),
        ("niter = 250  # EDIT HERE", "niter = 50  # EDIT HERE",
         "the custom net trained 50 iterations, not 250 (CI time)", 1),
    ],
    "examples/00-classification.py": [
        ("__import__('os').system(f'wget -O image.jpg {my_image_url}')",
         FETCH + "wget -O image.jpg $my_image_url", "the picture download: image.jpg is here",
         1),
    ],
    "examples/pascal-multilabel-with-datalayer.py": [
        ("batch_size = 128", "batch_size = 8",
         "batches of 8 pictures, not 128, for the toy data set (data layer and accuracy)", 4),
        ("im_shape = [227, 227]", "im_shape = [67, 67]",
         "67 x 67 pictures, not 227 x 227 (CaffeNet's layers fit 67; CI time)", 2),
        ("solver.step(100)", "solver.step(2)", "2 iterations between tests, not 100", 1),
        ("check_accuracy(solver.test_nets[0], 50)", "check_accuracy(solver.test_nets[0], 2)",
         "2 test batches, not 50", 1),
        ("check_baseline_accuracy(solver.test_nets[0], 5823//128)",
         "check_baseline_accuracy(solver.test_nets[0], 16//8)",
         "the toy validation set: 16 pictures in batches of 8", 1),
    ],
}


def substitute(path: Path, script: str) -> None:
    text = path.read_text()
    for old, new, _why, times in SUBSTITUTIONS.get(script, []):
        found = text.count(old)
        if found != times:
            raise SystemExit(f"{script}: substitution {old!r} matches {found} times, "
                             f"expected {times}")
        text = text.replace(old, new)
    path.write_text(text)


# --- pictures --------------------------------------------------------------------------------
def picture(rng: np.random.RandomState, height: int, width: int) -> np.ndarray:
    """A smooth synthetic RGB picture: colour gradients, discs and bars (uint8)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    image = np.stack([60 + 120 * x / width, 80 + 100 * y / height,
                      140 + 60 * np.sin(x / 17.0 + y / 23.0)], axis=-1)
    for _ in range(6):
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        radius = rng.uniform(0.08, 0.3) * min(height, width)
        color = rng.uniform(0, 255, 3)
        mask = (y - cy) ** 2 + (x - cx) ** 2 < radius ** 2
        image[mask] = 0.5 * image[mask] + 0.5 * color
    for _ in range(3):
        top = rng.randint(0, height - 8)
        image[top:top + 6, :] = 0.7 * image[top:top + 6, :] + 0.3 * rng.uniform(0, 255, 3)
    return np.clip(image, 0, 255).astype(np.uint8)


def save_picture(pixels: np.ndarray, path: Path, gray: bool = False) -> None:
    """PNG content under the example's file name (``cat.jpg``): lossless, so that every
    machine decodes the very pixels the oracle ran on (JPEG decoders differ in the last
    bit); Pillow, scikit-image and imageio read a file by its content."""
    from PIL import Image

    image = Image.fromarray(pixels)
    if gray:
        image = image.convert("L")
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG")


# --- MNIST ------------------------------------------------------------------------------------
def digits(rng: np.random.RandomState, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 28 x 28 uint8 images and labels: class k draws a stroke at its own angle and
    offset, blurred, with noise and a random shift."""
    labels = rng.randint(0, 10, n).astype(np.uint8)
    y, x = np.mgrid[0:28, 0:28].astype(np.float64) - 13.5
    images = np.zeros((n, 28, 28), np.uint8)
    for i, k in enumerate(labels):
        angle = math.pi * k / 10
        dy, dx = rng.uniform(-2, 2, 2)
        dist = np.abs((x - dx) * math.sin(angle) - (y - dy) * math.cos(angle))
        along = np.abs((x - dx) * math.cos(angle) + (y - dy) * math.sin(angle))
        stroke = np.exp(-dist ** 2 / 3.0) * (along < 6 + k % 4)
        ring = np.exp(-((np.hypot(x - dx, y - dy) - 4 - k % 3 * 2) ** 2) / 2.0) * (k % 2)
        value = 255 * np.clip(stroke + 0.6 * ring, 0, 1) + rng.normal(0, 12, (28, 28))
        images[i] = np.clip(value, 0, 255).astype(np.uint8)
    return images, labels


def write_idx(images: np.ndarray, labels: np.ndarray, prefix: Path) -> tuple[Path, Path]:
    n = len(labels)
    image_file, label_file = prefix.with_suffix(".images"), prefix.with_suffix(".labels")
    image_file.write_bytes(struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
    label_file.write_bytes(struct.pack(">II", 2049, n) + labels.tobytes())
    return image_file, label_file


def make_mnist(work: Path) -> None:
    from caffe_py.tools.convert import convert_idx

    rng = np.random.RandomState(SEED)
    scratch = work / "data" / "mnist"
    scratch.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 640), ("test", 500)):
        images, labels = digits(rng, n)
        idx_images, idx_labels = write_idx(images, labels, scratch / split)
        convert_idx(idx_images, idx_labels, work / "examples" / "mnist" / f"mnist_{split}_lmdb")


# --- CaffeNet -----------------------------------------------------------------------------------
SMALL = {"conv1": 16, "conv2": 32, "conv3": 32, "conv4": 32, "conv5": 32, "fc6": 64, "fc7": 64}
FULL = {"conv1": 96, "conv2": 256, "conv3": 384, "conv4": 384, "conv5": 256, "fc6": 4096,
        "fc7": 4096}


def caffenet_layers(width: dict[str, int], full_conv: bool) -> str:
    """CaffeNet's layers after the input, with the given widths (fully convolutional:
    fc6-conv, fc7-conv, fc8-conv, as examples/net_surgery has them)."""
    def conv(name, bottom, n, k, stride=1, pad=0, group=1):
        extra = f" stride: {stride}" if stride != 1 else ""
        extra += f" pad: {pad}" if pad else ""
        extra += f" group: {group}" if group != 1 else ""
        return (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}"\n'
                f"  convolution_param {{ num_output: {n} kernel_size: {k}{extra} }} }}\n")

    def relu(name, blob):
        return f'layer {{ name: "{name}" type: "ReLU" bottom: "{blob}" top: "{blob}" }}\n'

    def pool(name, bottom):
        return (f'layer {{ name: "{name}" type: "Pooling" bottom: "{bottom}" top: "{name}"\n'
                f"  pooling_param {{ pool: MAX kernel_size: 3 stride: 2 }} }}\n")

    def lrn(name, bottom):
        return (f'layer {{ name: "{name}" type: "LRN" bottom: "{bottom}" top: "{name}"\n'
                f"  lrn_param {{ local_size: 5 alpha: 0.0001 beta: 0.75 }} }}\n")

    def ip(name, bottom, n):
        return (f'layer {{ name: "{name}" type: "InnerProduct" bottom: "{bottom}" '
                f'top: "{name}"\n  inner_product_param {{ num_output: {n} }} }}\n')

    def drop(name, blob):
        return (f'layer {{ name: "{name}" type: "Dropout" bottom: "{blob}" top: "{blob}"\n'
                f"  dropout_param {{ dropout_ratio: 0.5 }} }}\n")

    w = width
    text = conv("conv1", "data", w["conv1"], 11, stride=4) + relu("relu1", "conv1")
    text += pool("pool1", "conv1") + lrn("norm1", "pool1")
    text += conv("conv2", "norm1", w["conv2"], 5, pad=2, group=2) + relu("relu2", "conv2")
    text += pool("pool2", "conv2") + lrn("norm2", "pool2")
    text += conv("conv3", "norm2", w["conv3"], 3, pad=1) + relu("relu3", "conv3")
    text += conv("conv4", "conv3", w["conv4"], 3, pad=1, group=2) + relu("relu4", "conv4")
    text += conv("conv5", "conv4", w["conv5"], 3, pad=1, group=2) + relu("relu5", "conv5")
    text += pool("pool5", "conv5")
    if full_conv:
        text += conv("fc6-conv", "pool5", w["fc6"], 6) + relu("relu6", "fc6-conv")
        text += drop("drop6", "fc6-conv")
        text += conv("fc7-conv", "fc6-conv", w["fc7"], 1) + relu("relu7", "fc7-conv")
        text += drop("drop7", "fc7-conv")
        text += conv("fc8-conv", "fc7-conv", 1000, 1)
        text += 'layer { name: "prob" type: "Softmax" bottom: "fc8-conv" top: "prob" }\n'
    else:
        text += ip("fc6", "pool5", w["fc6"]) + relu("relu6", "fc6") + drop("drop6", "fc6")
        text += ip("fc7", "fc6", w["fc7"]) + relu("relu7", "fc7") + drop("drop7", "fc7")
        text += ip("fc8", "fc7", 1000)
        text += 'layer { name: "prob" type: "Softmax" bottom: "fc8" top: "prob" }\n'
    return text


def deploy_prototxt() -> str:
    return ('name: "CaffeNet"\nlayer { name: "data" type: "Input" top: "data"\n'
            "  input_param { shape: { dim: 10 dim: 3 dim: 227 dim: 227 } } }\n"
            + caffenet_layers(SMALL, full_conv=False))


def full_conv_prototxt() -> str:
    return ('name: "CaffeNetConv"\ninput: "data"\ninput_shape {\n  dim: 1\n  dim: 3\n'
            "  dim: 259\n  dim: 259\n}\n" + caffenet_layers(SMALL, full_conv=True))


def caffenet_weights(width: dict[str, int], pool5: int, classes: int | None,
                     rng: np.random.RandomState) -> dict[str, list[np.ndarray]]:
    """Random CaffeNet weights: layer -> [weights, bias] (normal of variance 1 / fan_in, the
    classifier's smaller so that its softmax is not saturated; small biases)."""
    shapes = {
        "conv1": (width["conv1"], 3, 11, 11),
        "conv2": (width["conv2"], width["conv1"] // 2, 5, 5),
        "conv3": (width["conv3"], width["conv2"], 3, 3),
        "conv4": (width["conv4"], width["conv3"] // 2, 3, 3),
        "conv5": (width["conv5"], width["conv4"] // 2, 3, 3),
        "fc6": (width["fc6"], width["conv5"] * pool5 * pool5),
        "fc7": (width["fc7"], width["fc6"]),
    }
    if classes:
        shapes["fc8"] = (classes, width["fc7"])
    blobs = {}
    for name, shape in shapes.items():
        fan_in = int(np.prod(shape[1:]))
        std = math.sqrt(1.0 / fan_in) * (0.2 if name == "fc8" else 1.0)
        weights = rng.normal(0, std, shape).astype(np.float32)
        bias = rng.uniform(-0.05, 0.1, shape[0]).astype(np.float32)
        blobs[name] = [weights, bias]
    return blobs


def write_caffemodel(blobs: dict[str, list[np.ndarray]], path: Path) -> None:
    import torch

    from caffe_py.solver.caffemodel import encode_net

    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: [torch.from_numpy(b) for b in v] for k, v in blobs.items()}
    path.write_bytes(encode_net("CaffeNet", tensors))


def make_caffenet(work: Path, pascal: bool) -> None:
    rng = np.random.RandomState(SEED + 1)
    models = work / "models" / "bvlc_reference_caffenet"
    models.mkdir(parents=True, exist_ok=True)
    (models / "deploy.prototxt").write_text(deploy_prototxt())
    (work / "examples" / "net_surgery").mkdir(parents=True, exist_ok=True)
    (work / "examples" / "net_surgery" / "bvlc_caffenet_full_conv.prototxt").write_text(
        full_conv_prototxt())
    if pascal:  # the PASCAL net is CaffeNet's own widths on 67 x 67 pictures: pool5 is 1 x 1
        blobs = caffenet_weights(FULL, 1, None, rng)
    else:
        blobs = caffenet_weights(SMALL, 6, 1000, rng)
    write_caffemodel(blobs, models / "bvlc_reference_caffenet.caffemodel")


def make_imagenet_aux(work: Path) -> None:
    rng = np.random.RandomState(SEED + 2)
    y, x = np.mgrid[0:256, 0:256] / 255.0
    mean = np.stack([104 + 8 * np.sin(3 * x) + 4 * y, 117 + 6 * np.cos(2 * y),
                     123 + 5 * x * y]) + rng.normal(0, 0.5, (3, 256, 256))
    target = work / "python" / "caffe" / "imagenet"
    target.mkdir(parents=True, exist_ok=True)
    np.save(target / "ilsvrc_2012_mean.npy", mean)
    labels = work / "data" / "ilsvrc12"
    labels.mkdir(parents=True, exist_ok=True)
    (labels / "synset_words.txt").write_text(
        "".join(f"n{1440764 + 7 * i:08d} toy class {i}, object {i % 37}\n" for i in range(1000)))


def make_pictures(work: Path) -> None:
    rng = np.random.RandomState(SEED + 3)
    cat = picture(rng, 180, 240)
    save_picture(cat, work / "examples" / "images" / "cat.jpg")
    save_picture(cat, work / "examples" / "images" / "cat_gray.jpg", gray=True)
    save_picture(picture(rng, 200, 160), work / "examples" / "image.jpg")


# --- PASCAL -------------------------------------------------------------------------------
PASCAL_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat",
                  "chair", "cow", "diningtable", "dog", "horse", "motorbike", "person",
                  "pottedplant", "sheep", "sofa", "train", "tvmonitor")


def make_pascal(work: Path) -> None:
    rng = np.random.RandomState(SEED + 4)
    root = work / "data" / "pascal" / "VOC2012"
    for sub in ("ImageSets/Main", "JPEGImages", "Annotations"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for split, count in (("train", 16), ("val", 16)):
        names = []
        for i in range(count):
            name = f"2012_{split}_{i:04d}"
            names.append(name)
            height, width = rng.randint(90, 130), rng.randint(100, 150)
            save_picture(picture(rng, height, width), root / "JPEGImages" / f"{name}.jpg")
            objects = ""
            for _ in range(rng.randint(1, 4)):
                kind = PASCAL_CLASSES[rng.randint(0, 20)]
                x1, y1 = rng.randint(1, width // 2), rng.randint(1, height // 2)
                x2, y2 = rng.randint(x1 + 5, width), rng.randint(y1 + 5, height)
                objects += (f"  <object>\n    <name>{kind}</name>\n    <bndbox><xmin>{x1}</xmin>"
                            f"<ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox>\n"
                            "  </object>\n")
            (root / "Annotations" / f"{name}.xml").write_text(
                f"<annotation>\n  <filename>{name}.jpg</filename>\n{objects}</annotation>\n")
        (root / "ImageSets" / "Main" / f"{split}.txt").write_text("\n".join(names) + "\n")


def digest(work: Path) -> dict[str, str]:
    """sha256 of what every file of a prepared workspace holds, by path: the decoded pixels
    of a picture and the records of an LMDB (their bytes on disk depend on zlib's and LMDB's
    versions), the bytes of anything else."""
    import hashlib

    import lmdb
    from PIL import Image

    out = {}
    for path in sorted(work.rglob("*")):
        if not path.is_file() or path.name == "lock.mdb":
            continue
        h = hashlib.sha256()
        if path.name == "data.mdb":
            with lmdb.open(str(path.parent), readonly=True, lock=False) as env, \
                    env.begin() as txn:
                for key, value in txn.cursor():
                    h.update(len(key).to_bytes(4, "little") + key + value)
        elif path.suffix == ".jpg":
            with Image.open(path) as image:
                h.update(f"{image.mode} {image.size}".encode() + image.tobytes())
        else:
            h.update(path.read_bytes())
        out[str(path.relative_to(work))] = h.hexdigest()
    return out


def make_api(work: Path) -> None:
    """caffe-py's own script of pycaffe's finer semantics, beside the notebooks."""
    shutil.copyfile(HERE / "scripts" / "api_semantics.py",
                    work / "examples" / "api_semantics.py")


# --- the cases ------------------------------------------------------------------------------
def prepare(case: str, work: Path) -> None:
    """Make ``work`` the workspace of ``case`` (see pycaffe_cases.py)."""
    from pycaffe_cases import CASES  # noqa: PLC0415 (a sibling module of this script)

    spec = CASES[case]
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(TREE, work)
    for part in spec["makes"]:
        {"mnist": make_mnist, "api": make_api, "caffenet": lambda w: make_caffenet(w, pascal=False),
         "caffenet_pascal": lambda w: make_caffenet(w, pascal=True),
         "imagenet_aux": make_imagenet_aux, "pictures": make_pictures,
         "pascal": make_pascal}[part](work)
    if spec["script"] in SUBSTITUTIONS:
        substitute(work / spec["script"], spec["script"])


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    prepare(sys.argv[1], Path(sys.argv[2]))
    print(f"prepared {sys.argv[1]} in {sys.argv[2]}")
