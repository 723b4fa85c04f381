"""The fork layer cases: per fork, the layer cases its fixtures hold (the format of
tests/golden/cases.py, read by make_fork_golden.py and test_fork_golden.py), and its data-layer
cases (a net of one data layer, read by a solver seeded with ``seed``).

Extra value generator: ``pool_index:H:W:K:S``: for a bottom (N, C, h, w), the flat index in an
H x W plane of one position of each K x K window at stride S (the mask a max Pooling layer
writes; with K > S two windows may name one position).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cases import case  # noqa: E402

X = (2, 3, 5, 6)
SEGNET_FILLERS = {"scale_filler": {"type": "constant", "value": 1},
                  "shift_filler": {"type": "constant", "value": 0}}
PSPNET_FILLERS = {"slope_filler": {"type": "constant", "value": 1},
                  "bias_filler": {"type": "constant", "value": 0}}
PSPNET_BLOBS = ["randn:0.5", "randn:0.5", "randn:0.5", "uniform:0.5:2"]


def segnet() -> list[dict]:
    bn, up = "BN", "Upsample"
    return [
        case(bn, "learn", {"bn_param": {"bn_mode": "LEARN", **SEGNET_FILLERS}},
             [(X, "randn:2")]),
        case(bn, "learn_test_phase", {"bn_param": {"bn_mode": "LEARN", **SEGNET_FILLERS}},
             [(X, "uniform:-1:3")], phase="TEST"),
        case(bn, "learn_stats_tops", {"bn_param": SEGNET_FILLERS}, [((3, 2, 4, 4), "randn")],
             tops=3),
        case(bn, "learn_2d", {"bn_param": {"bn_mode": "LEARN"}}, [((6, 4), "randn")]),
        case(bn, "inference", {"bn_param": {"bn_mode": "INFERENCE", **SEGNET_FILLERS}},
             [(X, "randn")]),
        case(up, "scale2", {"upsample_param": {"scale": 2}},
             [((2, 3, 3, 4), "randn"), ((2, 3, 3, 4), "pool_index:6:8:2:2")], grad=(0,)),
        case(up, "upsample_hw_odd", {"upsample_param": {"upsample_h": 7, "upsample_w": 9}},
             [((1, 2, 4, 5), "randn"), ((1, 2, 4, 5), "pool_index:7:9:2:2")], grad=(0,)),
        case(up, "pad_out", {"upsample_param": {"scale": 2, "pad_out_h": True}},
             [((1, 2, 4, 4), "randn"), ((1, 2, 4, 4), "pool_index:7:8:2:2")], grad=(0,)),
        # kernel 3, stride 2 on 6 x 6: windows overlap, so two values may name one position
        # (upsample_h / upsample_w would do too, but the fork's backward then checks the
        # mask against scale_h_ * scale_w_, which only scale sets)
        case(up, "overlapping_windows", {"upsample_param": {"scale": 2}},
             [((2, 2, 3, 3), "randn"), ((2, 2, 3, 3), "pool_index:6:6:3:2")], grad=(0,)),
    ]


def pspnet() -> list[dict]:
    bn, it, acc = "BN", "Interp", "SegAccuracy"
    return [
        case(bn, "train", {"bn_param": {**PSPNET_FILLERS, "momentum": 0.95}},
             [(X, "randn:2")], blobs=PSPNET_BLOBS),
        case(bn, "train_eps", {"bn_param": {**PSPNET_FILLERS, "eps": 0.01}},
             [(X, "uniform:-1:3")], blobs=PSPNET_BLOBS),
        case(bn, "test", {"bn_param": PSPNET_FILLERS}, [(X, "randn")], phase="TEST",
             blobs=PSPNET_BLOBS),
        case(bn, "frozen", {"bn_param": {**PSPNET_FILLERS, "frozen": True}},
             [(X, "randn")], blobs=PSPNET_BLOBS),
        case(it, "zoom8", {"interp_param": {"zoom_factor": 8}}, [((2, 2, 4, 5), "randn")]),
        case(it, "shrink2", {"interp_param": {"shrink_factor": 2}}, [((1, 2, 9, 8), "randn")]),
        case(it, "height_width", {"interp_param": {"height": 7, "width": 11}},
             [((1, 3, 5, 4), "randn")]),
        case(it, "shrink_zoom", {"interp_param": {"shrink_factor": 2, "zoom_factor": 3}},
             [((1, 1, 9, 7), "randn")]),
        case(it, "crop_copy", {"interp_param": {"height": 4, "width": 5, "pad_beg": -1,
                                                "pad_end": -2}}, [((1, 2, 7, 8), "randn")]),
        case(it, "crop_zoom", {"interp_param": {"zoom_factor": 2, "pad_beg": -1,
                                                "pad_end": -1}}, [((1, 2, 6, 6), "randn")]),
        case(acc, "ignore", {"seg_accuracy_param": {"ignore_label": [255]}},
             [((2, 4, 5, 6), "randn"), ((2, 1, 5, 6), "labels:4:255")], grad=()),
        case(acc, "ties_two_ignored", {"seg_accuracy_param": {"ignore_label": [255, 0]}},
             [((2, 3, 4, 4), "ints:0:2"), ((2, 1, 4, 4), "labels:3:255")], grad=()),
    ]


LAYER_CASES = {"segnet": segnet, "pspnet": pspnet}

# Data cases: a net of one data layer (YAML-form dict), its phase, seed and forwards. The
# list files and images are written by make_fork_golden.py under inputs/ (from numpy seed 0).
DATA_CASES: dict[str, dict[str, dict]] = {
    "segnet": {
        "dense_shuffle_resize": {
            "layer": {"name": "data", "type": "DenseImageData", "top": ["data", "label"],
                      "dense_image_data_param": {"source": "pairs.txt", "batch_size": 2,
                                                 "shuffle": True, "new_height": 6,
                                                 "new_width": 8},
                      "transform_param": {"mean_value": [10, 20, 30], "scale": 0.5}},
            "phase": "TRAIN", "seed": 1701, "forwards": 5},
        "dense_gray_resize": {
            "layer": {"name": "data", "type": "DenseImageData", "top": ["data", "label"],
                      "dense_image_data_param": {"source": "pairs.txt", "batch_size": 3,
                                                 "is_color": False, "new_height": 9,
                                                 "new_width": 5}},
            "phase": "TEST", "seed": 7, "forwards": 3},
    },
    "pspnet": {
        "seg_train_crop_mirror_scales": {
            "layer": {"name": "data", "type": "ImageSegData", "top": ["data", "label",
                                                                      "data_dim"],
                      "image_data_param": {"source": "pairs.txt", "batch_size": 2,
                                           "shuffle": True, "label_type": "PIXEL",
                                           "ignore_label": 255},
                      "transform_param": {"mirror": True, "crop_size": 8,
                                          "mean_value": [104, 117, 123],
                                          "scale_factors": [0.5, 0.75, 1.0, 1.5]}},
            "phase": "TRAIN", "seed": 1701, "forwards": 6},
        "seg_train_rect_crop_resize": {
            "layer": {"name": "data", "type": "ImageSegData", "top": ["data", "label"],
                      "image_data_param": {"source": "pairs.txt", "batch_size": 3,
                                           "new_height": 10, "new_width": 9,
                                           "label_type": "PIXEL"},
                      "transform_param": {"mirror": True, "crop_height": 7, "crop_width": 9,
                                          "mean_value": [1, 2, 3], "scale": 0.25}},
            "phase": "TRAIN", "seed": 3, "forwards": 3},
        "seg_test_center_pad": {
            "layer": {"name": "data", "type": "ImageSegData", "top": ["data", "label",
                                                                      "data_dim"],
                      "image_data_param": {"source": "pairs.txt", "batch_size": 2,
                                           "label_type": "PIXEL"},
                      "transform_param": {"crop_size": 11, "mean_value": [5]}},
            "phase": "TEST", "seed": 5, "forwards": 3},
        "seg_image_label": {
            "layer": {"name": "data", "type": "ImageSegData", "top": ["data", "label"],
                      "image_data_param": {"source": "classes.txt", "batch_size": 2,
                                           "is_color": False, "label_type": "IMAGE"},
                      "transform_param": {"crop_size": 4}},
            "phase": "TEST", "seed": 5, "forwards": 2},
    },
}
