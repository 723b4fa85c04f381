"""Reading a VGG-16-sized .caffemodel: caffe-py against Google's protobuf, time and peak memory.

Writes a .caffemodel with VGG-16's 16 weighted layers and shapes (138,357,544 float32 values,
553 MB) filled with seeded random numbers, then reads it in fresh processes, each measured
alone: wall time of the read, and the peak resident memory it adds (VmHWM after the read minus
VmRSS before it, from /proc/self/status, after every import). Prints a markdown table.

- caffe-py: ``caffe_py.solver.caffemodel.read_net`` (layer name -> float32 tensors).
- protobuf: caffe_pb2 compiled from Caffe's caffe.proto with ``protoc`` (Debian's
  protobuf-compiler), ``NetParameter.ParseFromString`` of the file's bytes; and the same plus
  each blob's data as a float32 numpy array (what a loader needs).

    python benchmarks/caffemodel_read.py [--repeats 3] [--proto /path/to/caffe.proto]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CAFFE_PROTO = Path("/opt/caffe-src/caffe/src/caffe/proto/caffe.proto")
# VGG-16 (the ILSVRC-2014 model): layer name -> weight shape; every layer also has a bias.
VGG16 = [("conv1_1", (64, 3, 3, 3)), ("conv1_2", (64, 64, 3, 3)),
         ("conv2_1", (128, 64, 3, 3)), ("conv2_2", (128, 128, 3, 3)),
         ("conv3_1", (256, 128, 3, 3)), ("conv3_2", (256, 256, 3, 3)),
         ("conv3_3", (256, 256, 3, 3)), ("conv4_1", (512, 256, 3, 3)),
         ("conv4_2", (512, 512, 3, 3)), ("conv4_3", (512, 512, 3, 3)),
         ("conv5_1", (512, 512, 3, 3)), ("conv5_2", (512, 512, 3, 3)),
         ("conv5_3", (512, 512, 3, 3)), ("fc6", (4096, 25088)), ("fc7", (4096, 4096)),
         ("fc8", (1000, 4096))]


def write_vgg16(path: Path) -> int:
    """The caffemodel, one layer at a time (caffe-py's encoder); returns its float count."""
    import torch

    from caffe_py.io.formats.wire import len_field
    from caffe_py.solver.caffemodel import encode_net

    rng = np.random.default_rng(0)
    count = 0
    with open(path, "wb") as f:
        f.write(len_field(1, b"VGG_ILSVRC_16_layers"))
        for name, shape in VGG16:
            weight = torch.from_numpy(rng.standard_normal(shape, np.float32) * 0.01)
            bias = torch.from_numpy(rng.standard_normal(shape[0], np.float32))
            kind = "InnerProduct" if name.startswith("fc") else "Convolution"
            f.write(encode_net("", {name: [weight, bias]}, {name: kind}))  # one layer field
            count += weight.numel() + bias.numel()
    return count


def compile_proto(proto: Path, out: Path) -> None:
    protoc = shutil.which("protoc")
    if protoc is None:
        sys.exit("protoc not found: apt-get install protobuf-compiler")
    shutil.copy(proto, out / "caffe.proto")
    subprocess.run([protoc, f"--proto_path={out}", f"--python_out={out}", "caffe.proto"],
                   check=True)


MEASURE = r"""
import json, sys, time
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return 0
mode, path, extra = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "caffe-py":
    sys.path.insert(0, extra)
    from caffe_py.solver.caffemodel import read_net
    import torch
else:
    sys.path.insert(0, extra)
    import numpy as np
    import caffe_pb2
    from google.protobuf.internal import api_implementation
before = status("VmRSS")
began = time.perf_counter()
if mode == "caffe-py":
    layers = read_net(path)
    values = sum(t.numel() for blobs in layers.values() for t in blobs)
else:
    net = caffe_pb2.NetParameter()
    with open(path, "rb") as f:
        net.ParseFromString(f.read())
    if mode == "protobuf+arrays":
        arrays = [np.array(b.data, np.float32) for layer in net.layer for b in layer.blobs]
        values = sum(a.size for a in arrays)
    else:
        values = sum(len(b.data) for layer in net.layer for b in layer.blobs)
seconds = time.perf_counter() - began
info = {"seconds": seconds, "added_peak": status("VmHWM") - before, "values": values}
if mode != "caffe-py":
    info["backend"] = api_implementation.Type()
print(json.dumps(info))
"""


def measure(mode: str, path: Path, extra: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, mode, str(path), str(extra)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--proto", type=Path, default=CAFFE_PROTO)
    parser.add_argument("--skip-arrays", action="store_true",
                        help="leave out protobuf + arrays (slow: a Python float per value)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        path = tmp / "vgg16.caffemodel"
        count = write_vgg16(path)
        size = path.stat().st_size
        compile_proto(args.proto, tmp)
        modes = ["caffe-py", "protobuf"] + ([] if args.skip_arrays else ["protobuf+arrays"])
        results: dict[str, list[dict]] = {m: [] for m in modes}
        for _ in range(args.repeats):  # interleaved, so drift hits every mode alike
            for mode in modes:
                extra = ROOT if mode == "caffe-py" else tmp
                results[mode].append(measure(mode, path, extra))
        report(results, count, size, args.repeats)


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def report(results: dict[str, list[dict]], count: int, size: int, repeats: int) -> None:
    backend = next((r[0].get("backend") for r in results.values() if "backend" in r[0]), "")
    print(f"VGG-16 caffemodel: {count:,} float32 values, {size / 1e6:.0f} MB; "
          f"{repeats} runs each, fresh process per run")
    print(f"machine: {cpu_model()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, protobuf backend {backend}, "
          f"{time.strftime('%Y-%m-%d')}")
    print()
    print("| reader | time (s), best / median | added peak RSS (MB), median | "
          "time vs protobuf | memory vs protobuf |")
    print("|---|---|---|---|---|")
    base_t = np.median([r["seconds"] for r in results["protobuf"]])
    base_m = np.median([r["added_peak"] for r in results["protobuf"]])
    for mode, runs in results.items():
        assert all(r["values"] == count for r in runs), mode
        t = [r["seconds"] for r in runs]
        m = np.median([r["added_peak"] for r in runs])
        print(f"| {mode} | {min(t):.3f} / {np.median(t):.3f} | {m / 1e6:.0f} | "
              f"{np.median(t) / base_t:.2f}x | {m / base_m:.2f}x |")


if __name__ == "__main__":
    main()
