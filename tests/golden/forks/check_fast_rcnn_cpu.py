"""Check the kernel harness of make_kernel_golden.py against the built caffe-fast-rcnn: the
fork's only CPU code for its layers, ROIPooling's forward, run by its own pycaffe on every
ROIPooling fixture case's bottoms, must give the fixture's top (what the fork's CUDA forward
kernel computed in the harness). Prints the largest difference per case; exits 1 on any.

    GLOG_minloglevel=2 PYTHONPATH=/opt/fast-rcnn/python python \\
        tests/golden/forks/check_fast_rcnn_cpu.py

(tools/oracles/fast_rcnn/build_fast_rcnn.sh builds the fork; CI never runs this.)
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main() -> int:
    import caffe

    caffe.set_mode_cpu()
    worst = 0.0
    with np.load(HERE / "fast_rcnn" / "ROIPooling.npz") as arrays:
        names = [k[:-len("__spec")] for k in arrays.files if k.endswith("__spec")]
        for name in names:
            spec = json.loads(str(arrays[f"{name}__spec"]))
            p = spec["params"]["roi_pooling_param"]
            x, rois = arrays[f"{name}__bottom0"], arrays[f"{name}__bottom1"]
            text = (f'input: "x" input_shape {{ {" ".join(f"dim: {d}" for d in x.shape)} }}\n'
                    f'input: "rois" input_shape {{ {" ".join(f"dim: {d}" for d in rois.shape)} }}\n'
                    'layer { name: "roi" type: "ROIPooling" bottom: "x" bottom: "rois" top: "y"\n'
                    f'  roi_pooling_param {{ pooled_h: {p["pooled_h"]} pooled_w: {p["pooled_w"]}'
                    f' spatial_scale: {p["spatial_scale"]} }} }}\n')
            with tempfile.NamedTemporaryFile("w", suffix=".prototxt") as f:
                f.write(text)
                f.flush()
                net = caffe.Net(f.name, caffe.TEST)
            net.blobs["x"].data[...] = x
            net.blobs["rois"].data[...] = rois
            top = net.forward()["y"]
            diff = float(np.abs(top - arrays[f"{name}__top0"]).max())
            worst = max(worst, diff)
            print(f"ROIPooling {name}: CPU forward vs the CUDA kernel's: max |diff| {diff:g}")
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
