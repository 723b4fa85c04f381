"""The SSD fork's training losses for a few iterations of a small SSD (tests/golden/forks/ssd/
training/): the net and solver prototxts, the initial weights the fork drew (init.caffemodel)
and the loss of each iteration (losses.json), on the fork's own AnnotatedDatum LMDB of the tiny
set in ../annotated (make_annotated_golden.py). The data has no random step (resize, mean and
scale only), so caffe-py, started from the same weights, must give the same losses
(test_ssd_training_golden.py).

    GLOG_minloglevel=2 PYTHONPATH=/opt/ssd/python:$PWD \\
        python tests/golden/forks/make_ssd_training_golden.py
"""
from __future__ import annotations

import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "ssd" / "training"
ITERATIONS = 8


def conv(name: str, bottom: str, n: int, stride: int = 1, relu: bool = True) -> str:
    text = (f'layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}"\n'
            f"  param {{ lr_mult: 1 decay_mult: 1 }} param {{ lr_mult: 2 decay_mult: 0 }}\n"
            f"  convolution_param {{ num_output: {n} pad: 1 kernel_size: 3 stride: {stride}\n"
            f'    weight_filler {{ type: "xavier" }} bias_filler {{ type: "constant" value: 0.1 }}'
            " } }\n")
    if relu:
        text += f'layer {{ name: "{name}_relu" type: "ReLU" bottom: "{name}" top: "{name}" }}\n'
    return text


def pool(name: str, bottom: str) -> str:
    return (f'layer {{ name: "{name}" type: "Pooling" bottom: "{bottom}" top: "{name}"\n'
            "  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }\n")


def head(src: str, min_size: int, max_size: int) -> str:
    text = ""
    for kind, n in (("loc", 16), ("conf", 16)):
        name = f"{src}_{kind}"
        text += conv(name, src, n, relu=False)
        text += (f'layer {{ name: "{name}_perm" type: "Permute" bottom: "{name}" '
                 f'top: "{name}_perm"\n  permute_param {{ order: 0 order: 2 order: 3 order: 1 }}'
                 f' }}\nlayer {{ name: "{name}_flat" type: "Flatten" bottom: "{name}_perm" '
                 f'top: "{name}_flat" }}\n')
    text += (f'layer {{ name: "{src}_prior" type: "PriorBox" bottom: "{src}" bottom: "data" '
             f'top: "{src}_prior"\n  prior_box_param {{ min_size: {min_size} max_size: '
             f"{max_size} aspect_ratio: 2 flip: true variance: 0.1 variance: 0.1 variance: 0.2"
             " variance: 0.2 } }\n")
    return text


def net_text(source: str) -> str:
    data = f'''name: "ssd_tiny"
layer {{
  name: "data" type: "AnnotatedData" top: "data" top: "label"
  include {{ phase: TRAIN }}
  transform_param {{
    mean_value: 104 mean_value: 117 mean_value: 123 scale: 0.017
    resize_param {{ resize_mode: WARP height: 32 width: 32 }}
  }}
  data_param {{ source: "{source}" batch_size: 4 backend: LMDB }}
}}
'''
    body = conv("conv1", "data", 8) + pool("pool1", "conv1") + conv("conv2", "pool1", 16)
    body += pool("pool2", "conv2") + conv("conv3", "pool2", 16)
    body += ('layer { name: "conv3_norm" type: "Normalize" bottom: "conv3" top: "conv3_norm"\n'
             '  norm_param { across_spatial: false channel_shared: false\n'
             '    scale_filler { type: "constant" value: 10 } } }\n')
    body += conv("conv4", "conv3", 16, stride=2)
    body += head("conv3_norm", 8, 16) + head("conv4", 16, 28)
    for kind, axis in (("loc", 1), ("conf", 1), ("prior", 2)):
        body += (f'layer {{ name: "mbox_{kind}" type: "Concat" bottom: "conv3_norm_{kind}'
                 f'{"" if kind == "prior" else "_flat"}" bottom: "conv4_{kind}'
                 f'{"" if kind == "prior" else "_flat"}" top: "mbox_{kind}" '
                 f"concat_param {{ axis: {axis} }} }}\n")
    body += '''layer {
  name: "mbox_loss" type: "MultiBoxLoss"
  bottom: "mbox_loc" bottom: "mbox_conf" bottom: "mbox_prior" bottom: "label"
  top: "mbox_loss"
  propagate_down: true propagate_down: true propagate_down: false propagate_down: false
  loss_param { normalization: VALID }
  multibox_loss_param { num_classes: 4 overlap_threshold: 0.4 neg_pos_ratio: 3
    code_type: CENTER_SIZE }
}
'''
    return data + body


SOLVER = """net: "net.prototxt"
base_lr: 0.01
lr_policy: "fixed"
momentum: 0.9
weight_decay: 0.0005
max_iter: {iterations}
display: 1
snapshot: 0
snapshot_after_train: false
solver_mode: CPU
random_seed: 3
"""


def main() -> None:
    import caffe

    caffe.set_mode_cpu()
    OUT.mkdir(parents=True, exist_ok=True)
    source = HERE / "ssd" / "annotated" / "fork_png_lmdb"
    (OUT / "net.prototxt").write_text(net_text("../annotated/fork_png_lmdb"))
    (OUT / "solver.prototxt").write_text(SOLVER.format(iterations=ITERATIONS))
    cwd = os.getcwd()
    os.chdir(OUT)  # the prototxts' relative paths are from here, as Caffe reads them
    try:
        caffe.set_random_seed(3)
        solver = caffe.SGDSolver("solver.prototxt")
        solver.net.save("init.caffemodel")
        losses = []
        for _ in range(ITERATIONS):
            solver.step(1)
            losses.append(float(solver.net.blobs["mbox_loss"].data))
    finally:
        os.chdir(cwd)
    (OUT / "losses.json").write_text(json.dumps({"source": str(source.relative_to(HERE)),
                                                 "losses": losses}, indent=1) + "\n")
    print(losses)


if __name__ == "__main__":
    os.environ.setdefault("GLOG_minloglevel", "2")
    main()
