"""The cases of the SSD fork's golden fixtures (weiliu89/caffe, branch ssd), in the form of
tests/golden/cases.py (one layer, its blocks, its bottoms' shapes and generators, the bottoms
compared by gradient). make_ssd_golden.py runs them in the fork's pycaffe.

Generators beyond cases.py's (made by make_ssd_golden.py's ``generate``):
``priors:H:W:S`` (PriorBox-style priors, 1 x 2 x P x 4: an H x W grid, S boxes per cell, the
variances 0.1, 0.1, 0.2, 0.2), ``gt:N:G:C[:D]`` (G ground-truth rows [image, label 1..C-1,
instance, box, difficult] over N images, image N-1 left without boxes, D of them difficult),
``softmax:C`` (rows of C probabilities), ``dets:SEED:N:C`` and ``detsgt:SEED:N:C`` (a set of
detections and the ground truth they were made from: some close to a box, some not).
"""
from __future__ import annotations

from cases import case  # noqa: F401  (tests/golden/cases.py: the same case format)

P = 3 * 3 * 4  # priors of the loss cases: a 3 x 3 grid, 4 per cell
C = 4          # classes, background 0 included


def prior_box() -> list[dict]:
    t = "PriorBox"
    feat, img = ((1, 2, 3, 4), "randn"), ((1, 3, 30, 40), "randn")
    two = [feat, img]

    def pb(**p) -> dict:
        return {"prior_box_param": {"min_size": [8.0], **p}}

    return [
        case(t, "min_only", pb(), two, ()),
        case(t, "max_size", pb(max_size=[15.0]), two, ()),
        case(t, "ratios_flip", pb(max_size=[15.0], aspect_ratio=[2.0, 3.0]), two, ()),
        case(t, "ratios_no_flip_dup", pb(aspect_ratio=[2.0, 2.0, 0.5], flip=False), two, ()),
        case(t, "clip_var1", pb(max_size=[20.0], aspect_ratio=[2.0], clip=True,
                                variance=[0.1]), two, ()),
        case(t, "var4", pb(aspect_ratio=[3.0], variance=[0.1, 0.1, 0.2, 0.2]), two, ()),
        case(t, "fractional_sizes", pb(min_size=[7.5, 12.0], max_size=[11.9, 20.5],
                                       aspect_ratio=[2.0]), two, ()),
        case(t, "img_size_step", pb(img_size=300, step=8.0, offset=0.25), two, ()),
        case(t, "img_hw_step_hw", pb(img_h=30, img_w=50, step_h=10.0, step_w=12.5), two, ()),
    ]


def permute() -> list[dict]:
    t = "Permute"
    return [
        case(t, "nhwc", {"permute_param": {"order": [0, 2, 3, 1]}}),
        case(t, "partial_order", {"permute_param": {"order": [0, 3]}}),
        case(t, "identity", {"permute_param": {"order": [0, 1, 2, 3]}}),
    ]


def normalize() -> list[dict]:
    t = "Normalize"
    x = ((2, 3, 4, 5), "randn")

    def norm(**p) -> dict:
        return {"norm_param": p}

    return [
        case(t, "spatial_shared", norm(), [x], blobs=["uniform:1:3"]),
        case(t, "spatial_per_channel", norm(channel_shared=False), [x],
             blobs=["uniform:1:3"]),
        case(t, "position_shared", norm(across_spatial=False), [x], blobs=["uniform:1:3"]),
        case(t, "position_per_channel", norm(across_spatial=False, channel_shared=False), [x],
             blobs=["uniform:1:3"]),
        case(t, "eps", norm(across_spatial=False, channel_shared=False, eps=0.1), [x],
             blobs=["uniform:1:3"]),
    ]


def detection_output() -> list[dict]:
    t = "DetectionOutput"
    n = 2
    shared = [((n, P * 4), "randn:0.3"), ((n, P * C), f"softmax:{C}"),
              ((1, 2, P * 4), "priors:3:3:4")]

    def out(**p) -> dict:
        return {"detection_output_param": {"num_classes": C, **p}}

    nms = {"nms_threshold": 0.45}
    return [
        case(t, "corner", out(nms_param=nms), shared, ()),
        case(t, "center_size", out(nms_param=nms, code_type="CENTER_SIZE"), shared, ()),
        case(t, "corner_size", out(nms_param=nms, code_type="CORNER_SIZE"), shared, ()),
        case(t, "variance_in_target", out(nms_param=nms, code_type="CENTER_SIZE",
                                          variance_encoded_in_target=True), shared, ()),
        case(t, "threshold_top_k", out(nms_param={"nms_threshold": 0.3, "top_k": 5},
                                       code_type="CENTER_SIZE", confidence_threshold=0.2),
             shared, ()),
        case(t, "keep_top_k", out(nms_param=nms, code_type="CENTER_SIZE", keep_top_k=7),
             shared, ()),
        case(t, "eta", out(nms_param={"nms_threshold": 0.7, "eta": 0.8},
                           code_type="CENTER_SIZE"), shared, ()),
        case(t, "per_class_boxes", out(nms_param=nms, code_type="CENTER_SIZE",
                                       share_location=False),
             [((n, P * C * 4), "randn:0.3"), ((n, P * C), f"softmax:{C}"),
              ((1, 2, P * 4), "priors:3:3:4")], ()),
        case(t, "no_background", out(nms_param=nms, background_label_id=-1,
                                     code_type="CENTER_SIZE", confidence_threshold=0.3,
                                     share_location=False),
             [((n, P * C * 4), "randn:0.3"), ((n, P * C), f"softmax:{C}"),
              ((1, 2, P * 4), "priors:3:3:4")], ()),
        case(t, "nothing_kept", out(nms_param=nms, confidence_threshold=0.99), shared, ()),
    ]


def multibox_loss() -> list[dict]:
    t = "MultiBoxLoss"
    n = 3
    bottoms = [((n, P * 4), "randn:0.5"), ((n, P * C), "randn"), ((1, 2, P * 4), "priors:3:3:4"),
               ((1, 1, 6, 8), f"gt:{n}:6:{C}:1")]

    def mb(loss: dict | None = None, **p) -> dict:
        params = {"multibox_loss_param": {"num_classes": C, "overlap_threshold": 0.3, **p}}
        if loss is not None:
            params["loss_param"] = loss
        return params

    g = (0, 1)
    return [
        case(t, "max_negative", mb(), bottoms, g),
        case(t, "center_size", mb(code_type="CENTER_SIZE", neg_pos_ratio=2.0), bottoms, g),
        case(t, "corner_size", mb(code_type="CORNER_SIZE"), bottoms, g),
        case(t, "variance_in_target", mb(code_type="CENTER_SIZE",
                                         encode_variance_in_target=True), bottoms, g),
        case(t, "bipartite", mb(match_type="BIPARTITE", code_type="CENTER_SIZE"), bottoms, g),
        case(t, "neg_overlap", mb(code_type="CENTER_SIZE", neg_overlap=0.2), bottoms, g),
        case(t, "no_mining", mb(mining_type="NONE", code_type="CENTER_SIZE"), bottoms, g),
        case(t, "hard_example", mb(mining_type="HARD_EXAMPLE", sample_size=5,
                                   code_type="CENTER_SIZE"), bottoms, g),
        case(t, "hard_example_nms", mb(mining_type="HARD_EXAMPLE", sample_size=6,
                                       code_type="CENTER_SIZE",
                                       nms_param={"nms_threshold": 0.5, "top_k": 20}),
             bottoms, g),
        case(t, "max_negative_nms_priors", mb(code_type="CENTER_SIZE", use_prior_for_nms=True,
                                              nms_param={"nms_threshold": 0.6, "top_k": 30}),
             bottoms, g),
        case(t, "l2", mb(loc_loss_type="L2", loc_weight=0.7), bottoms, g),
        case(t, "logistic", mb(conf_loss_type="LOGISTIC", code_type="CENTER_SIZE"), bottoms, g),
        case(t, "logistic_no_mining", mb(conf_loss_type="LOGISTIC", mining_type="NONE"),
             bottoms, g),
        case(t, "match_predictions", mb(use_prior_for_matching=False, code_type="CENTER_SIZE"),
             bottoms, g),
        case(t, "cross_boundary", mb(ignore_cross_boundary_bbox=True), bottoms, g),
        case(t, "bp_inside", mb(bp_inside=True, code_type="CORNER"), bottoms, g),
        case(t, "agnostic", {"multibox_loss_param": {
            "num_classes": 2, "overlap_threshold": 0.3, "map_object_to_agnostic": True}},
             [((n, P * 4), "randn:0.5"), ((n, P * 2), "randn"), ((1, 2, P * 4), "priors:3:3:4"),
              ((1, 1, 6, 8), f"gt:{n}:6:2:1")], g),
        case(t, "no_difficult", mb(use_difficult_gt=False), bottoms, g),
        case(t, "per_class_boxes", mb(share_location=False, mining_type="NONE",
                                      code_type="CENTER_SIZE"),
             [((n, P * C * 4), "randn:0.5"), ((n, P * C), "randn"),
              ((1, 2, P * 4), "priors:3:3:4"), ((1, 1, 6, 8), f"gt:{n}:6:{C}:1")], g),
        case(t, "full", mb({"normalization": "FULL"}), bottoms, g),
        case(t, "batch_size", mb({"normalization": "BATCH_SIZE"}), bottoms, g),
        case(t, "none", mb({"normalization": "NONE"}), bottoms, g),
    ]


def detection_evaluate() -> list[dict]:
    t = "DetectionEvaluate"
    n = 3
    bottoms = [((1, 1, 14, 7), f"dets:5:{n}:{C}"), ((1, 1, 7, 8), f"detsgt:5:{n}:{C}")]

    def ev(**p) -> dict:
        return {"detection_evaluate_param": {"num_classes": C, **p}}

    return [
        case(t, "default", ev(), bottoms, ()),
        case(t, "strict", ev(overlap_threshold=0.7), bottoms, ()),
        case(t, "no_difficult", ev(evaluate_difficult_gt=False), bottoms, ()),
    ]


def smooth_l1() -> list[dict]:
    t = "SmoothL1Loss"
    x = ((4, 8), "randn")
    # (the fork's SmoothL1Loss cannot take its third bottom: LossLayer's ExactNumBottomBlobs
    # of 2 wins over its MaxBottomBlobs of 3; R-FCN's fork covers the weighted form)
    return [
        case(t, "plain", {}, [x, x], (0, 1)),
        case(t, "rows", {}, [((6, 12), "randn:2"), ((6, 12), "randn")], (0, 1)),
    ]


def all_cases() -> list[dict]:
    return (prior_box() + permute() + normalize() + detection_output() + multibox_loss()
            + detection_evaluate() + smooth_l1())
