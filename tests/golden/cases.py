"""The layer cases the golden fixtures hold: one list per layer type, read by make_golden.py.

A case is one layer (its type and parameter blocks, with Caffe's field names, so the same dict
is a prototxt layer for pycaffe and a YAML layer for caffe-py), its bottoms (shape and how the
values are drawn), which bottoms are compared by gradient (``grad``), the phase, and the
initial values of its blobs. The fixtures embed each case as JSON, so the tests need only the
fixture files.

Value generators (``gen``): ``randn[:scale]``, ``uniform:a:b``, ``labels:C`` (integers in
[0, C)), ``labels:C:ignore`` (a quarter of them set to the integer ``ignore``), ``ints:a:b``,
``binary``, ``probs`` (each item's values a softmax; ``probs_zero_first``: item 0's first
value 0, below Caffe's log floor), ``index:N`` (integers in [0, N)),
``mask`` (0/1 per item, at least one 1), ``cont`` (T x N sequence flags, 0 starts a
sequence; ``cont:carry`` continues from the initial state at t = 0), ``const:v``, ``away``
(|x| in [0.1, 2]: no value near a kink).
"""
from __future__ import annotations

X = (2, 3, 5, 5)  # the default (N, C, H, W)


def case(type_name: str, name: str, params: dict | None = None, bottoms=((X, "randn"),),
         grad=(0,), tops: int = 1, phase: str = "TRAIN", blobs=None) -> dict:
    """One case; ``blobs`` lists a generator per blob (None: randn:0.5 for every blob)."""
    return {"type": type_name, "name": name, "params": params or {},
            "bottoms": [{"shape": list(s), "gen": g} for s, g in bottoms],
            "grad": list(grad), "tops": tops, "phase": phase, "blobs": blobs}


def conv(**p) -> dict:
    return {"convolution_param": {"num_output": 4, **p}}


def pool(**p) -> dict:
    return {"pooling_param": p}


def vision() -> list[dict]:
    c = "Convolution"
    d = "Deconvolution"
    p = "Pooling"
    return [
        case(c, "k3", conv(kernel_size=3)),
        case(c, "k3_s2_p1", conv(kernel_size=3, stride=2, pad=1), [((2, 3, 7, 6), "randn")]),
        case(c, "per_axis", conv(kernel_h=3, kernel_w=2, stride_h=2, stride_w=1, pad_h=1,
                                 pad_w=0), [((2, 3, 6, 7), "randn")]),
        case(c, "per_axis_lists", conv(kernel_size=[2, 3], stride=[1, 2], pad=[0, 1],
                                       dilation=[2, 1])),
        case(c, "group_dilation", conv(num_output=6, kernel_size=3, group=3, dilation=2, pad=2),
             [((2, 6, 6, 6), "randn")]),
        case(c, "no_bias_1x1", conv(kernel_size=1, bias_term=False)),
        case(c, "3d", conv(num_output=2, kernel_size=3, pad=1, stride=[1, 2, 2]),
             [((2, 2, 4, 5, 5), "randn")]),
        case(c, "axis2", conv(num_output=2, kernel_size=3, axis=2),
             [((2, 3, 4, 5, 5), "randn")]),
        case(c, "two_bottoms", conv(kernel_size=2), [(X, "randn"), (X, "randn")], (0, 1), 2),
        case(d, "k2_s2", conv(kernel_size=2, stride=2), [((2, 3, 3, 4), "randn")]),
        case(d, "k3_s2_p1", conv(kernel_size=3, stride=2, pad=1), [((2, 3, 3, 3), "randn")]),
        case(d, "group_dilation", conv(num_output=4, kernel_size=3, group=2, dilation=2),
             [((2, 4, 3, 3), "randn")]),
        case(d, "per_axis_no_bias", conv(kernel_h=2, kernel_w=3, stride_h=2, stride_w=1,
                                         bias_term=False), [((1, 2, 3, 3), "randn")]),
        case(p, "max_k3_s2", pool(kernel_size=3, stride=2)),
        case(p, "max_k3_s2_ceil", pool(kernel_size=3, stride=2), [((2, 3, 6, 6), "randn")]),
        case(p, "max_k3_s2_p1", pool(kernel_size=3, stride=2, pad=1)),
        case(p, "max_k3_s2_p2_drop", pool(kernel_size=3, stride=2, pad=2),
             [((2, 2, 6, 6), "randn")]),
        case(p, "max_rect", pool(kernel_h=3, kernel_w=2, stride_h=1, stride_w=2, pad_h=1,
                                 pad_w=0), [((2, 2, 5, 6), "randn")]),
        case(p, "max_mask", pool(kernel_size=2, stride=2), [((2, 2, 5, 5), "randn")], tops=2),
        case(p, "ave_k3_s2", pool(pool="AVE", kernel_size=3, stride=2)),
        case(p, "ave_k3_s2_p1", pool(pool="AVE", kernel_size=3, stride=2, pad=1)),
        case(p, "ave_k2_s2_ceil", pool(pool="AVE", kernel_size=2, stride=2),
             [((2, 2, 7, 7), "randn")]),
        case(p, "ave_k3_p2", pool(pool="AVE", kernel_size=3, stride=1, pad=2),
             [((1, 2, 4, 4), "randn")]),
        case(p, "global_ave", pool(pool="AVE", global_pooling=True)),
        case(p, "global_max", pool(global_pooling=True), [((2, 3, 4, 6), "randn")]),
        case("LRN", "across_5", {"lrn_param": {"local_size": 5, "alpha": 0.5, "beta": 0.75,
                                               "k": 2.0}}, [((2, 7, 3, 3), "randn")]),
        case("LRN", "across_3_default_k", {"lrn_param": {"local_size": 3, "alpha": 0.3}}),
        case("LRN", "within_3", {"lrn_param": {"local_size": 3, "alpha": 0.5, "beta": 0.75,
                                               "norm_region": "WITHIN_CHANNEL"}}),
        case("LRN", "within_5", {"lrn_param": {"local_size": 5, "alpha": 2.0, "beta": 0.5,
                                               "norm_region": "WITHIN_CHANNEL"}},
             [((1, 2, 6, 7), "randn")]),
    ]


def common() -> list[dict]:
    ip = "InnerProduct"
    two = [((2, 3, 4), "randn"), ((2, 3, 4), "randn")]
    return [
        case(ip, "basic", {"inner_product_param": {"num_output": 5}}),
        case(ip, "axis2", {"inner_product_param": {"num_output": 3, "axis": 2}},
             [((2, 3, 4, 5), "randn")]),
        case(ip, "transpose", {"inner_product_param": {"num_output": 4, "transpose": True}},
             [((3, 6), "randn")]),
        case(ip, "no_bias", {"inner_product_param": {"num_output": 2, "bias_term": False}}),
        case("Flatten", "default"),
        case("Flatten", "axis2_end3", {"flatten_param": {"axis": 2, "end_axis": 3}},
             [((2, 3, 4, 5, 2), "randn")]),
        case("Reshape", "copy_infer", {"reshape_param": {"shape": {"dim": [0, -1]}}}),
        case("Reshape", "axis_num_axes", {"reshape_param": {"shape": {"dim": [5, 5]},
                                                            "axis": 1, "num_axes": 1}},
             [((2, 25, 3), "randn")]),
        case("Concat", "axis1_three", {}, [(X, "randn"), ((2, 1, 5, 5), "randn"),
                                           ((2, 4, 5, 5), "randn")], (0, 1, 2)),
        case("Concat", "axis0", {"concat_param": {"axis": 0}}, two, (0, 1)),
        case("Concat", "axis_last", {"concat_param": {"axis": -1}},
             [((2, 3, 4), "randn"), ((2, 3, 2), "randn")], (0, 1)),
        case("Slice", "points", {"slice_param": {"slice_point": [1, 3]}},
             [((2, 5, 3), "randn")], tops=3),
        case("Slice", "equal_axis2", {"slice_param": {"axis": 2}}, [((2, 3, 6), "randn")],
             tops=2),
        case("Split", "two_tops", tops=2),
        case("Eltwise", "sum", {}, two, (0, 1)),
        case("Eltwise", "sum_coeff", {"eltwise_param": {"coeff": [1.0, -0.5, 2.0]}},
             two + [((2, 3, 4), "randn")], (0, 1, 2)),
        case("Eltwise", "prod", {"eltwise_param": {"operation": "PROD"}},
             two + [((2, 3, 4), "randn")], (0, 1, 2)),
        case("Eltwise", "max", {"eltwise_param": {"operation": "MAX"}},
             two + [((2, 3, 4), "randn")], (0, 1, 2)),
        case("Softmax", "axis1", {}, [((2, 4, 3, 3), "randn:3")]),
        case("Softmax", "axis_last", {"softmax_param": {"axis": -1}}, [((3, 5), "randn:3")]),
        case("Dropout", "test", {"dropout_param": {"dropout_ratio": 0.3}}, phase="TEST"),
    ]


def activation() -> list[dict]:
    simple = [("ReLU", "plain", {}), ("ReLU", "slope", {"relu_param": {"negative_slope": 0.1}}),
              ("ELU", "alpha1", {}), ("ELU", "alpha05", {"elu_param": {"alpha": 0.5}}),
              ("Sigmoid", "plain", {}), ("TanH", "plain", {}), ("AbsVal", "plain", {}),
              ("BNLL", "plain", {}), ("Swish", "beta1", {}),
              ("Swish", "beta05", {"swish_param": {"beta": 0.5}}),
              ("Exp", "e", {}), ("Exp", "base2", {"exp_param": {"base": 2.0, "scale": 0.5,
                                                                "shift": 1.0}}),
              ("Clip", "bounds", {"clip_param": {"min": -0.5, "max": 0.7}}),
              ("Power", "identity", {}),
              ("Power", "square", {"power_param": {"power": 2, "scale": 0.5, "shift": 1}}),
              ("Power", "cube", {"power_param": {"power": 3, "scale": -2, "shift": 0.25}}),
              ("Power", "zero_power", {"power_param": {"power": 0, "scale": 2}}),
              ("Power", "zero_scale", {"power_param": {"power": 2, "scale": 0, "shift": 3}})]
    cases = [case(t, n, p, [((2, 3, 4, 5), "away")]) for t, n, p in simple]
    return cases + [
        case("BNLL", "large", {}, [((4, 5), "randn:30")]),
        case("Power", "sqrt", {"power_param": {"power": 0.5, "shift": 3}},
             [((2, 3, 4), "uniform:-2:2")]),
        case("Log", "e", {}, [((2, 3, 4), "uniform:0.5:3")]),
        case("Log", "base10", {"log_param": {"base": 10.0, "scale": 2.0, "shift": 0.5}},
             [((2, 3, 4), "uniform:0.5:3")]),
        case("Threshold", "zero", {}, grad=()),
        case("Threshold", "t03", {"threshold_param": {"threshold": 0.3}}, grad=()),
        case("PReLU", "channels", {}, [((2, 3, 4, 5), "away")],
             blobs=["uniform:-0.5:0.5"]),
        case("PReLU", "shared", {"prelu_param": {"channel_shared": True}},
             [((2, 3, 4), "away")], blobs=["const:0.3"]),
        case("PReLU", "2d", {}, [((4, 3), "away")]),
    ]


def normalization() -> list[dict]:
    stats = ["randn", "uniform:0.5:2", "const:2"]  # mean_sum, var_sum, count
    bn = "BatchNorm"
    return [
        case(bn, "train", {}, blobs=stats),
        case(bn, "train_maf09_eps", {"batch_norm_param": {"moving_average_fraction": 0.9,
                                                          "eps": 1e-3}},
             [((4, 3), "randn")], blobs=stats),
        case(bn, "test", {}, phase="TEST", blobs=stats),
        case(bn, "global_in_train", {"batch_norm_param": {"use_global_stats": True}},
             blobs=stats),
        case(bn, "batch_in_test", {"batch_norm_param": {"use_global_stats": False}},
             phase="TEST", blobs=stats),
        case("Scale", "learned_bias", {"scale_param": {"bias_term": True}}),
        case("Scale", "learned_axes", {"scale_param": {"axis": 1, "num_axes": 2}}),
        case("Scale", "scalar", {"scale_param": {"num_axes": 0}}),
        case("Scale", "bottom_scale", {"scale_param": {"axis": 0}},
             [((2, 3, 4), "randn"), ((2, 3), "randn")], (0, 1)),
        case("Scale", "bottom_scale_bias", {"scale_param": {"bias_term": True}},
             [((2, 3, 4), "randn"), ((3,), "randn")], (0, 1)),
        case("Bias", "learned", {}),
        case("Bias", "learned_last_axes", {"bias_param": {"axis": -2, "num_axes": -1}}),
        case("Bias", "bottom", {"bias_param": {"axis": 1}},
             [((2, 3, 4), "randn"), ((3, 4), "randn")], (0, 1)),
        case("MVN", "default"),
        case("MVN", "across", {"mvn_param": {"across_channels": True}}),
        case("MVN", "mean_only", {"mvn_param": {"normalize_variance": False}}),
        case("MVN", "eps_2d", {"mvn_param": {"eps": 0.01, "across_channels": True}},
             [((3, 8), "randn")]),
    ]


def loss() -> list[dict]:
    sm = "SoftmaxWithLoss"
    scores = ((4, 5), "randn:2")
    labels = ((4,), "labels:5")
    spatial = [((2, 4, 2, 3), "randn:2"), ((2, 2, 3), "labels:4:1")]

    def norm(mode: str, ignore: int | None = 1) -> dict:
        block = {"normalization": mode} | ({"ignore_label": ignore} if ignore is not None
                                            else {})
        return {"loss_param": block}

    return [
        case(sm, "plain", {}, [scores, labels]),
        case(sm, "spatial_valid_ignore", norm("VALID"), spatial),
        case(sm, "spatial_full_ignore", norm("FULL"), spatial),
        case(sm, "batch_size", norm("BATCH_SIZE"), spatial),
        case(sm, "none", norm("NONE", None), spatial),
        case(sm, "normalize_false", {"loss_param": {"normalize": False}}, spatial),
        case(sm, "axis_last", {"softmax_param": {"axis": -1}},
             [((2, 3, 4), "randn"), ((2, 3), "labels:4")]),
        case("EuclideanLoss", "plain", {}, [((2, 3, 2, 2), "randn"), ((2, 3, 2, 2), "randn")],
             (0, 1)),
        case("EuclideanLoss", "reshaped", {}, [((3, 6), "randn"), ((3, 2, 3), "randn")],
             (0, 1)),
        case("SigmoidCrossEntropyLoss", "plain", {}, [((3, 4), "randn:2"),
                                                      ((3, 4), "uniform:0:1")]),
        case("SigmoidCrossEntropyLoss", "ignore_valid",
             {"loss_param": {"ignore_label": -1, "normalization": "VALID"}},
             [((3, 4), "randn:2"), ((3, 4), "labels:2:-1")]),
        case("SigmoidCrossEntropyLoss", "full", norm("FULL", None),
             [((2, 3, 2), "randn:2"), ((2, 3, 2), "binary")]),
        case("Accuracy", "top1", {}, [scores, labels], grad=()),
        case("Accuracy", "top2_per_class", {"accuracy_param": {"top_k": 2}},
             [((6, 4), "randn"), ((6,), "labels:4")], grad=(), tops=2),
        case("Accuracy", "ignore_spatial", {"accuracy_param": {"ignore_label": 1}}, spatial,
             grad=()),
        case("Accuracy", "ties", {}, [((6, 4), "ints:0:2"), ((6,), "labels:4")], grad=()),
    ]


def margin_and_probability_losses() -> list[dict]:
    scores = ((4, 5), "randn:2")
    labels = ((4,), "labels:5")
    spatial = [((2, 4, 2, 3), "randn:2"), ((2, 2, 3), "labels:4:1")]
    valid_ignore = {"loss_param": {"normalization": "VALID", "ignore_label": 1}}
    return [
        case("ContrastiveLoss", "margin1", {}, [((6, 3), "randn:0.5"), ((6, 3), "randn:0.5"),
                                                ((6,), "binary")], (0, 1)),
        case("ContrastiveLoss", "legacy_margin2",
             {"contrastive_loss_param": {"margin": 2.0, "legacy_version": True}},
             [((6, 3, 1, 1), "randn:0.5"), ((6, 3, 1, 1), "randn:0.5"), ((6,), "binary")],
             (0, 1)),
        case("ContrastiveLoss", "margin2", {"contrastive_loss_param": {"margin": 2.0}},
             [((6, 3), "randn:0.5"), ((6, 3), "randn:0.5"), ((6, 1, 1, 1), "binary")], (0, 1)),
        case("HingeLoss", "l1", {}, [scores, labels]),
        case("HingeLoss", "l2", {"hinge_loss_param": {"norm": "L2"}},
             [((3, 2, 2), "randn"), ((3,), "labels:4")]),
        case("InfogainLoss", "source", {"infogain_loss_param": {"source": "@H"}},
             [scores, labels]),
        case("InfogainLoss", "bottom_matrix", {}, [scores, labels, ((5, 5), "uniform:0:1")]),
        case("InfogainLoss", "spatial_ignore_prob", valid_ignore | {
            "infogain_loss_param": {"source": "@H"}}, spatial, tops=2),
        case("InfogainLoss", "none", {"loss_param": {"normalization": "NONE"},
                                      "infogain_loss_param": {"source": "@H"}}, spatial),
        case("MultinomialLogisticLoss", "plain", {}, [((4, 5), "probs"), labels]),
        case("MultinomialLogisticLoss", "floor", {}, [((4, 5), "probs_zero_first"),
                                                      ((4,), "ints:0:1")]),
    ]


def recurrent() -> list[dict]:
    seq, cont, carry = ((3, 2, 4), "randn"), ((3, 2), "cont"), ((3, 2), "cont:carry")
    rp = {"recurrent_param": {"num_output": 3}}
    hidden = {"recurrent_param": {"num_output": 3, "expose_hidden": True}}
    state = ((1, 2, 3), "randn:0.5")
    return [
        case("RNN", "plain", rp, [seq, cont]),
        case("RNN", "static", rp, [seq, cont, ((2, 5), "randn")], (0, 2)),
        case("RNN", "expose_hidden", hidden, [seq, carry, state], (0, 2), tops=2),
        case("LSTM", "plain", rp, [seq, cont]),
        case("LSTM", "static", rp, [seq, cont, ((2, 5), "randn")], (0, 2)),
        case("LSTM", "expose_hidden", hidden, [seq, carry, state, state], (0, 2, 3),
             tops=3),
        case("LSTMUnit", "plain", {}, [((1, 3, 4), "randn"), ((1, 3, 16), "randn"),
                                       ((1, 3), "binary")], (0, 1), tops=2),
    ]


def utility() -> list[dict]:
    return [
        case("Crop", "axis2_offsets", {"crop_param": {"offset": [1, 2]}},
             [((2, 3, 6, 7), "randn"), ((1, 1, 4, 4), "randn")]),
        case("Crop", "axis1_one_offset", {"crop_param": {"axis": 1, "offset": 1}},
             [((2, 4, 5, 5), "randn"), ((2, 2, 3, 3), "randn")]),
        case("Crop", "axis_last_no_offset", {"crop_param": {"axis": -1}},
             [((2, 3, 6), "randn"), ((5, 5, 4), "randn")]),
        case("Tile", "axis1", {"tile_param": {"tiles": 3}}, [((2, 3, 2), "randn")]),
        case("Tile", "axis0", {"tile_param": {"axis": 0, "tiles": 2}}, [((2, 3), "randn")]),
        case("Tile", "axis_last", {"tile_param": {"axis": -1, "tiles": 4}},
             [((2, 3, 2), "randn")]),
        case("Reduction", "sum_all"),
        case("Reduction", "asum_axis1", {"reduction_param": {"operation": "ASUM", "axis": 1}}),
        case("Reduction", "sumsq_axis2_coeff", {"reduction_param": {
            "operation": "SUMSQ", "axis": 2, "coeff": 0.5}}),
        case("Reduction", "mean_last_coeff", {"reduction_param": {
            "operation": "MEAN", "axis": -1, "coeff": 2.0}}),
        case("ArgMax", "top1", {}, grad=()),
        case("ArgMax", "top3_values", {"argmax_param": {"top_k": 3, "out_max_val": True}},
             grad=()),
        case("ArgMax", "axis1_top2", {"argmax_param": {"axis": 1, "top_k": 2}}, grad=()),
        case("ArgMax", "axis1_values", {"argmax_param": {"axis": 1, "out_max_val": True}},
             grad=()),
        case("ArgMax", "ties", {"argmax_param": {"top_k": 2}}, [((4, 6), "ints:0:2")],
             grad=()),
        case("Embed", "bias", {"embed_param": {"num_output": 4, "input_dim": 5}},
             [((2, 3), "index:5")], grad=()),
        case("Embed", "no_bias", {"embed_param": {"num_output": 3, "input_dim": 4,
                                                  "bias_term": False}},
             [((5,), "index:4")], grad=()),
        case("Filter", "two", {}, [((5, 3, 2), "randn"), ((5, 4), "randn"),
                                   ((5, 1), "mask")], (0, 1), tops=2),
        case("BatchReindex", "repeats", {}, [((4, 3, 2), "randn"), ((6,), "index:4")]),
        case("Parameter", "blob", {"parameter_param": {"shape": {"dim": [2, 3]}}},
             bottoms=(), grad=()),
        case("SPP", "one_level", {"spp_param": {"pyramid_height": 1}}),
        case("SPP", "three_levels", {"spp_param": {"pyramid_height": 3}},
             [((2, 3, 7, 9), "randn")]),
        case("SPP", "ave_two_levels", {"spp_param": {"pyramid_height": 2, "pool": "AVE"}},
             [((2, 2, 6, 6), "randn")]),
        case("Im2col", "k3_p1", {"convolution_param": {"kernel_size": 3, "pad": 1}}),
        case("Im2col", "per_axis", {"convolution_param": {
            "kernel_h": 2, "kernel_w": 3, "stride_h": 2, "stride_w": 1, "pad_h": 1,
            "pad_w": 0}}, [((2, 2, 5, 6), "randn")]),
        case("Im2col", "dilation", {"convolution_param": {"kernel_size": 2, "dilation": 2}}),
        case("Im2col", "1d", {"convolution_param": {"kernel_size": 3, "stride": 2}},
             [((2, 3, 8), "randn")]),
        case("Im2col", "3d", {"convolution_param": {"kernel_size": 2, "pad": [0, 1, 0]}},
             [((1, 2, 3, 4, 3), "randn")]),
    ]


def data_and_python() -> list[dict]:
    py = "Python"
    return [
        case("DummyData", "constant", {"dummy_data_param": {
            "shape": [{"dim": [2, 3]}, {"dim": [4]}],
            "data_filler": [{"type": "constant", "value": 1.5}]}}, bottoms=(), grad=(),
             tops=2),
        case(py, "pyloss", {"python_param": {"module": "python_layers",
                                             "layer": "EuclideanLossLayer"}},
             [((2, 3, 2), "randn"), ((2, 3, 2), "randn")], (0, 1)),
        case(py, "blob_param_str", {"python_param": {"module": "python_layers",
                                                     "layer": "ScaledByBlob",
                                                     "param_str": "0.5"}}),
    ]


def all_cases() -> list[dict]:
    return (vision() + common() + activation() + normalization() + loss()
            + margin_and_probability_losses() + recurrent() + utility() + data_and_python())
