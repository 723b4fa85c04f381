"""SSD's layers (PriorBox, Permute, Normalize, DetectionOutput, DetectionEvaluate,
MultiBoxLoss): the vectorized DetectionOutput against a plain one-box-at-a-time reference
(detection_reference.py), gradients, and the errors naming the layer. tests/golden/forks holds
them against SSD's fork itself."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from detection_reference import detection_output as reference_output
from layer_helpers import build, gradcheck, rand

from caffe_py.errors import DataError, NetError, SpecError
from caffe_py.layers import boxes

P, C = 36, 4  # priors of a 3 x 3 grid, 4 per cell; classes


def grid_priors(h: int = 3, w: int = 3) -> torch.Tensor:
    shapes = [(0.3, 0.3), (0.5, 0.5), (0.45, 0.25), (0.25, 0.45)]
    rows = [(cx - a / 2, cy - b / 2, cx + a / 2, cy + b / 2)
            for y in range(h) for x in range(w)
            for cx, cy in [((x + 0.5) / w, (y + 0.5) / h)] for a, b in shapes]
    priors = np.asarray(rows, np.float32).reshape(-1)
    var = np.tile(np.float32([0.1, 0.1, 0.2, 0.2]), len(rows))
    return torch.from_numpy(np.stack([priors, var])[None])


def detection_output(block: str, n: int = 2):
    return build(f"name: det\ntype: DetectionOutput\nbottom: [loc, conf, prior]\ntop: out\n"
                 f"detection_output_param: {{num_classes: {C}, code_type: CENTER_SIZE, "
                 f"{block}}}", [(n, P * 4), (n, P * C), (1, 2, P * 4)], phase="TEST")


def softmax_scores(n: int, seed: int, ties: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, P, C, generator=g) * 1.5
    if ties:  # equal scores: the order must stay the priors' (a stable sort)
        x[:, ::3] = x[:, :1]
    return torch.softmax(x, -1).reshape(n, P * C)


@pytest.mark.parametrize(("block", "threshold", "nms", "eta", "top_k", "keep"), [
    ("nms_param: {nms_threshold: 0.45}", None, 0.45, 1.0, None, -1),
    ("nms_param: {nms_threshold: 0.3, top_k: 6}, confidence_threshold: 0.15", 0.15, 0.3, 1.0,
     6, -1),
    ("nms_param: {nms_threshold: 0.8, eta: 0.7}", None, 0.8, 0.7, None, -1),
    ("nms_param: {nms_threshold: 0.45}, keep_top_k: 9", None, 0.45, 1.0, None, 9),
])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_detection_output_matches_the_plain_reference(block, threshold, nms, eta, top_k, keep,
                                                      ties):
    layer = detection_output(block)
    loc = torch.randn(2, P * 4, generator=torch.Generator().manual_seed(3)) * 0.3
    conf = softmax_scores(2, 4, ties)
    prior = grid_priors()
    ours = layer(loc, conf, prior)[0, 0].numpy()
    limit = -float(np.finfo(np.float32).max) if threshold is None else float(
        np.float32(threshold))
    expected = reference_output(loc.numpy(), conf.numpy(), prior.numpy(), C, 0, limit, nms, eta,
                                top_k, keep)
    np.testing.assert_allclose(ours, expected, rtol=1e-6, atol=1e-7)


def test_nms_in_chunks_gives_the_same_detections(monkeypatch):
    layer = detection_output("nms_param: {nms_threshold: 0.45}", n=3)
    args = (torch.randn(3, P * 4) * 0.3, softmax_scores(3, 9), grid_priors())
    whole = layer(*args)
    monkeypatch.setattr(boxes, "_NMS_ELEMENTS", P * P)  # one row per pass
    assert torch.equal(layer(*args), whole)


def test_detection_output_without_detections_gives_one_row_per_image():
    layer = detection_output("nms_param: {nms_threshold: 0.45}, confidence_threshold: 0.999")
    out = layer(torch.zeros(2, P * 4), softmax_scores(2, 1), grid_priors())
    np.testing.assert_array_equal(out[0, 0].numpy(), [[0, -1, -1, -1, -1, -1, -1],
                                                      [1, -1, -1, -1, -1, -1, -1]])


def test_detection_output_errors():
    with pytest.raises(NetError, match="has 140 values per image for 36 priors; expected 144"):
        build("name: det\ntype: DetectionOutput\nbottom: [loc, conf, prior]\ntop: out\n"
              f"detection_output_param: {{num_classes: {C}}}",
              [(2, 140), (2, P * C), (1, 2, P * 4)])
    with pytest.raises(SpecError, match="background_label_id -1 with share_location: true"):
        detection_output("background_label_id: -1")


def test_detection_output_writes_voc_result_files(tmp_path):
    (tmp_path / "labels.prototxt").write_text("".join(
        f'item {{ name: "{n}" label: {k} display_name: "{n}" }}\n'
        for k, n in enumerate(["bg", "a", "b", "c"])))
    (tmp_path / "sizes.txt").write_text("img0 100 200\nimg1 50 50\n")
    block = (f"nms_param: {{nms_threshold: 0.45}}, confidence_threshold: 0.5, "
             f"save_output_param: {{output_directory: {tmp_path / 'out'}, output_name_prefix: "
             f"det_, output_format: VOC, label_map_file: {tmp_path / 'labels.prototxt'}, "
             f"name_size_file: {tmp_path / 'sizes.txt'}}}")
    layer = detection_output(block)
    out = layer(torch.randn(2, P * 4) * 0.3, softmax_scores(2, 5), grid_priors())[0, 0]
    lines = (tmp_path / "out" / "det_a.txt").read_text().splitlines()
    rows = out[out[:, 1] == 1].numpy()
    assert len(lines) == len(rows) > 0
    first = rows[0]
    size = (200, 100) if first[0] == 0 else (50, 50)
    x0 = int(round(float(np.clip(first[3], 0, 1)) * size[0] * 100) / 100)
    assert lines[0].split()[0] == ("img0" if first[0] == 0 else "img1")
    assert int(lines[0].split()[2]) == x0


# --- PriorBox, Permute, Normalize -----------------------------------------------------------
def test_prior_box_count_and_layout():
    layer = build("name: p\ntype: PriorBox\nbottom: [f, img]\ntop: p\nprior_box_param: "
                  "{min_size: 10, max_size: 20, aspect_ratio: [2, 3], flip: true}",
                  [(1, 8, 2, 3), (1, 3, 20, 30)])
    assert layer.num_priors == 6  # 1, sqrt(min x max), 2, 1/2, 3, 1/3
    assert layer.top_shapes == [(1, 2, 2 * 3 * 6 * 4)]
    out = layer(torch.zeros(1, 8, 2, 3), torch.zeros(1, 3, 20, 30))[0].numpy()
    first = out[0, :4]  # cell (0, 0): centre (5, 5) of a 30 x 20 image, side 10
    np.testing.assert_allclose(first, [0.0, 0.0, 10 / 30, 0.5], rtol=1e-6)
    np.testing.assert_allclose(out[1], 0.1)  # the default variance


@pytest.mark.parametrize(("block", "message"), [
    ("{max_size: 20}", "prior_box_param.min_size is not set"),
    ("{min_size: 10, max_size: 5}", "max_size 5 is not greater than min_size 10"),
    ("{min_size: 10, variance: [0.1, 0.2]}", "2 variances"),
    ("{min_size: 10, img_size: 30, img_h: 30, img_w: 30}", "img_size and img_h/img_w"),
])
def test_prior_box_spec_errors(block, message):
    with pytest.raises(SpecError, match=message):
        build(f"name: p\ntype: PriorBox\nbottom: [f, img]\ntop: p\nprior_box_param: {block}",
              [(1, 8, 2, 3), (1, 3, 20, 30)])


def test_permute_orders_axes_and_refuses_bad_orders():
    layer = build("name: p\ntype: Permute\nbottom: x\ntop: y\npermute_param: {order: [0, 3]}",
                  [(2, 3, 4, 5)])
    assert layer.order == [0, 3, 1, 2] and layer.top_shapes == [(2, 5, 3, 4)]
    x = rand(2, 3, 4, 5)
    np.testing.assert_array_equal(layer(x).numpy(), x.permute(0, 3, 1, 2).numpy())
    assert gradcheck(layer, rand(2, 3, 4, 5, seed=1))
    with pytest.raises(NetError, match="order names axis 4 but bottom 'x' has 4 axes"):
        build("name: p\ntype: Permute\nbottom: x\ntop: y\npermute_param: {order: [4]}",
              [(2, 3, 4, 5)])
    with pytest.raises(SpecError, match=r"order \[0, 0\] repeats an axis"):
        build("name: p\ntype: Permute\nbottom: x\ntop: y\npermute_param: {order: [0, 0]}",
              [(2, 3, 4, 5)])


@pytest.mark.parametrize("across", [True, False])
def test_normalize_with_one_scale_is_exactly_differentiable(across):
    layer = build("name: n\ntype: Normalize\nbottom: x\ntop: y\nnorm_param: {across_spatial: "
                  f"{str(across).lower()}, scale_filler: {{type: constant, value: 3}}}}",
                  [(2, 3, 2, 2)])
    x = rand(2, 3, 2, 2)
    y = layer.double()(x)
    norm = x.reshape(2, 3, -1).square().sum((1, 2) if across else 1, keepdim=True).add(
        1e-10).sqrt()
    np.testing.assert_allclose(y.detach().numpy(),
                               (x.reshape(2, 3, -1) / norm * 3).reshape(x.shape),
                               rtol=1e-12)
    assert gradcheck(layer, rand(2, 3, 2, 2, seed=2))


# --- MultiBoxLoss ---------------------------------------------------------------------------
def multibox(block: str = "", down: str = "") -> object:
    return build("name: mbox\ntype: MultiBoxLoss\nbottom: [loc, conf, prior, label]\n"
                 f"top: loss\n{down}multibox_loss_param: {{num_classes: {C}, "
                 f"overlap_threshold: 0.3, code_type: CENTER_SIZE{block}}}",
                 [(2, P * 4), (2, P * C), (1, 2, P * 4), (1, 1, 3, 8)])


GT = torch.tensor([[[[0, 1, 0, .1, .1, .5, .6, 0], [0, 2, 1, .5, .4, .9, .9, 0],
                     [1, 3, 0, .2, .2, .7, .5, 0]]]])


@pytest.mark.parametrize("block", ["", ", mining_type: HARD_EXAMPLE, sample_size: 5",
                                   ", mining_type: NONE, conf_loss_type: LOGISTIC"])
def test_multibox_loss_gradient_is_the_loss_derivative(block):
    layer = multibox(block)
    loc, conf = rand(2, P * 4) * 0.5, rand(2, P * C, seed=1)
    assert torch.autograd.gradcheck(lambda a, b: layer.double()(a, b, grid_priors().double(),
                                                                GT.double()),
                                    (loc.requires_grad_(), conf.requires_grad_()), eps=1e-6,
                                    atol=1e-5)
    assert layer.last["matches"] > 0


def test_multibox_loss_leaves_out_a_term_whose_bottom_does_not_propagate():
    both = multibox()
    conf_only = multibox(down="propagate_down: [false, true, false, false]\n")
    loc, conf = torch.randn(2, P * 4), torch.randn(2, P * C)
    total = both(loc, conf, grid_priors(), GT)
    loc_rows = both._loc_loss(loc.reshape(2, P, 1, 4), *_matched(both, loc, conf))
    assert float(conf_only(loc, conf, grid_priors(), GT)) == pytest.approx(
        float(total) - float(loc_rows) / both.last["normalizer"], rel=1e-5)


def _matched(layer, loc, conf):
    pv = grid_priors().numpy().reshape(2, -1, 4)
    gts = layer.ground_truth(GT.numpy().reshape(-1, 8))
    loc_host = loc.reshape(2, P, 1, 4).numpy()
    matches = layer.find_matches(gts, pv[0], pv[1], loc_host, 2)
    layer.mine(matches, gts, conf.reshape(2, P, C).numpy(), loc_host, pv[0], pv[1])
    return matches, gts, pv[0], pv[1], loc_host


def test_multibox_loss_errors():
    with pytest.raises(NetError, match="cannot back-propagate to the priors or the labels"):
        multibox(down="propagate_down: [true, true, true, false]\n")
    with pytest.raises(SpecError, match="negative mining needs share_location: true"):
        multibox(", share_location: false")
    bad = GT.clone()
    bad[0, 0, 1, 1] = 0
    with pytest.raises(DataError, match="found the background label 0 in the ground truth"):
        multibox()(torch.zeros(2, P * 4), torch.zeros(2, P * C), grid_priors(), bad)
    for label in (C, -3):   # an IndexError in the confidence loss before
        bad[0, 0, 1, 1] = label
        with pytest.raises(DataError) as info:
            multibox()(torch.zeros(2, P * 4), torch.zeros(2, P * C), grid_priors(), bad)
        assert str(info.value).endswith(f"found the label {label} in the ground truth, outside "
                                        f"its {C} classes [0, num_classes); check the data's "
                                        "labels and num_classes")


# --- DetectionEvaluate ----------------------------------------------------------------------
def test_detection_evaluate_marks_true_and_false_positives(tmp_path):
    layer = build("name: ev\ntype: DetectionEvaluate\nbottom: [det, gt]\ntop: ev\n"
                  "detection_evaluate_param: {num_classes: 3}", [(1, 1, 4, 7), (1, 1, 2, 8)])
    det = torch.tensor([[[[0, 1, 0.9, .1, .1, .5, .5], [0, 1, 0.8, .1, .1, .5, .52],
                          [0, 2, 0.7, .5, .5, .9, .9], [1, 2, 0.6, .0, .0, .2, .2]]]])
    gt = torch.tensor([[[[0, 1, 0, .1, .1, .5, .5, 0], [1, 2, 0, .5, .5, .9, .9, 0]]]])
    rows = layer(det, gt)[0, 0].numpy()
    np.testing.assert_allclose(rows, [[-1, 1, 1, -1, -1], [-1, 2, 1, -1, -1],
                                      [0, 1, .9, 1, 0], [0, 1, .8, 0, 1],  # a duplicate
                                      [0, 2, .7, 0, 1],                    # no class-2 box
                                      [1, 2, .6, 0, 1]], rtol=1e-6)


def test_detection_evaluate_in_pixels_of_the_original_images(tmp_path):
    (tmp_path / "sizes.txt").write_text("a 10 10\n")
    layer = build("name: ev\ntype: DetectionEvaluate\nbottom: [det, gt]\ntop: ev\n"
                  "detection_evaluate_param: {num_classes: 2, overlap_threshold: 0.65, "
                  f"name_size_file: {tmp_path / 'sizes.txt'}}}", [(1, 1, 1, 7), (1, 1, 1, 8)])
    det = torch.tensor([[[[0, 1, 0.9, .0, .0, .4, .4]]]])
    gt = torch.tensor([[[[0, 1, 0, .0, .0, .5, .5, 0]]]])
    # in pixels (sizes (w + 1)(h + 1)): 25 / (25 + 36 - 25) = 0.69, a true positive at 0.65;
    # normalized the overlap would be 0.64
    assert layer(det, gt)[0, 0, 1, 3:].tolist() == [1.0, 0.0]
