"""Every registered layer type builds in a minimal net and runs forward and backward there.

The parametrisation is over the library's registered types at collection time, so a new type
without an entry in MINIMAL fails here until someone writes its minimal spec.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support import write_db

from caffe_py.errors import SpecError
from caffe_py.io.formats.datum import Datum
from caffe_py.layers import registry
from caffe_py.layers.base import Layer
from caffe_py.net import Net
from caffe_py.spec import layer_params
from caffe_py.spec.net_spec import parse_net
from caffe_py.spec.schema import Source, field_names

# The net's inputs: x and y (N, C, H, W); v and prob (N, K); label (N,) in [0, K); seq (T, N, D)
# and cont (T, N) for the recurrent layers; c0 (1, N, D), gates (1, N, 4D) and flag (1, N) for
# LSTMUnit; index (3,) into N for BatchReindex; h (K, K) for InfogainLoss; keep (N,) all ones
# for Filter (which then keeps the build-time shape).
INPUTS = {"x": (2, 3, 4, 4), "y": (2, 3, 4, 4), "v": (2, 3), "prob": (2, 3), "label": (2,),
          "seq": (3, 2, 4), "cont": (3, 2), "c0": (1, 2, 2), "gates": (1, 2, 8),
          "flag": (1, 2), "index": (3,), "h": (3, 3), "keep": (2,)}


def one(type_name: str, bottom: str | list[str] = "x", top: str | list[str] = "out",
        **params) -> list[dict]:
    return [{"name": "under_test", "type": type_name, "bottom": bottom, "top": top, **params}]


def predictions(n: int) -> list[dict]:
    """SSD's predictions for n images of x's 16 cells, one prior each: loc (n, 64), conf (n,
    48) in [0, 1), priors."""
    return [
        {"name": "loc", "type": "DummyData", "top": "loc", "dummy_data_param": {
            "shape": {"dim": [n, 64]}, "data_filler": {"type": "gaussian", "std": 0.1}}},
        {"name": "conf", "type": "DummyData", "top": "conf", "dummy_data_param": {
            "shape": {"dim": [n, 48]}, "data_filler": {"type": "uniform"}}},
        {"name": "priors", "type": "PriorBox", "bottom": ["x", "y"], "top": "priors",
         "prior_box_param": {"min_size": [2.0]}}]


# one region (batch index 0, x1, y1, x2, y2 in pixels) for ROIPooling and PSROIPooling
ROIS = {"name": "rois", "type": "DummyData", "top": "rois", "dummy_data_param": {
    "shape": {"dim": [1, 5]}, "data_filler": {"type": "constant", "value": 0}}}
PLACEHOLDER = "set by the test"
"""The file a data layer's block names: every such block gets a real path under tmp_path."""

ACTIVATIONS = ("ReLU", "PReLU", "ELU", "Sigmoid", "TanH", "AbsVal", "Power", "BNLL", "Exp",
               "Log", "Threshold", "Clip", "Swish", "GELU")

MINIMAL: dict[str, list[dict]] = {
    "Input": [{"name": "under_test", "type": "Input", "top": "extra",
               "input_param": {"shape": {"dim": [2, 5]}}}],
    "DummyData": [{"name": "under_test", "type": "DummyData", "top": "out",
                   "dummy_data_param": {"shape": {"dim": [2, 3]},
                                        "data_filler": {"type": "gaussian"}}}],
    "Data": [{"name": "under_test", "type": "Data", "top": ["out", "out_label"],
              "data_param": {"source": PLACEHOLDER, "batch_size": 2}}],
    "ImageData": [{"name": "under_test", "type": "ImageData", "top": ["out", "out_label"],
                   "image_data_param": {"source": PLACEHOLDER, "batch_size": 2}}],
    "WindowData": [{"name": "under_test", "type": "WindowData", "top": ["out", "out_label"],
                    "window_data_param": {"source": PLACEHOLDER, "batch_size": 2},
                    "transform_param": {"crop_size": 3}}],
    "HDF5Data": [{"name": "under_test", "type": "HDF5Data", "top": ["out", "out_label"],
                  "hdf5_data_param": {"source": PLACEHOLDER, "batch_size": 2}}],
    "HDF5Output": [{"name": "under_test", "type": "HDF5Output", "bottom": ["x", "label"],
                    "hdf5_output_param": {"file_name": PLACEHOLDER}}],
    "MemoryData": [{"name": "under_test", "type": "MemoryData", "top": ["out", "out_label"],
                    "memory_data_param": {"batch_size": 2, "channels": 1, "height": 4,
                                          "width": 4}}],
    "Convolution": one("Convolution", convolution_param={
        "num_output": 2, "kernel_size": 3, "weight_filler": {"type": "xavier"}}),
    "Deconvolution": one("Deconvolution", convolution_param={
        "num_output": 2, "kernel_size": 2, "stride": 2, "weight_filler": {"type": "xavier"}}),
    "Pooling": one("Pooling", pooling_param={"kernel_size": 2, "stride": 2}),
    "InnerProduct": one("InnerProduct", inner_product_param={
        "num_output": 2, "weight_filler": {"type": "xavier"}}),
    "LRN": one("LRN", lrn_param={"local_size": 3}),
    "BatchNorm": one("BatchNorm"),
    "Scale": one("Scale", scale_param={"bias_term": True}),
    "Bias": one("Bias"),
    "Concat": one("Concat", ["x", "y"]),
    "Eltwise": one("Eltwise", ["x", "y"]),
    "Split": one("Split", "x", ["out", "out2"]),
    "Slice": one("Slice", "x", ["out", "out2"], slice_param={"slice_point": 1}),
    "Flatten": one("Flatten"),
    "Reshape": one("Reshape", reshape_param={"shape": {"dim": [0, -1]}}),
    "Dropout": one("Dropout"),
    "Silence": one("Silence", ["x", "y"], []),
    "Softmax": one("Softmax", "v"),
    "SoftmaxWithLoss": one("SoftmaxWithLoss", ["v", "label"]),
    "EuclideanLoss": one("EuclideanLoss", ["x", "y"]),
    "SigmoidCrossEntropyLoss": one("SigmoidCrossEntropyLoss", ["v", "prob"]),
    "Accuracy": one("Accuracy", ["v", "label"]),
    "RNN": one("RNN", ["seq", "cont"], recurrent_param={
        "num_output": 2, "weight_filler": {"type": "uniform", "min": -0.1, "max": 0.1}}),
    "LSTM": one("LSTM", ["seq", "cont"], recurrent_param={
        "num_output": 2, "weight_filler": {"type": "uniform", "min": -0.1, "max": 0.1}}),
    **{name: one(name) for name in ACTIVATIONS},
    "Clip": one("Clip", clip_param={"min": -0.5, "max": 0.5}),
    "Crop": one("Crop", ["x", "y"], crop_param={"offset": 0}),
    "Tile": one("Tile", tile_param={"tiles": 2}),
    "Reduction": one("Reduction", reduction_param={"axis": 1}),
    "ArgMax": one("ArgMax"),
    "Embed": one("Embed", "label", embed_param={"num_output": 2, "input_dim": 3,
                                                 "weight_filler": {"type": "gaussian"}}),
    "Filter": one("Filter", ["x", "keep"]),
    "BatchReindex": one("BatchReindex", ["x", "index"]),
    "Parameter": one("Parameter", [], parameter_param={"shape": {"dim": [2, 3]}}),
    "MVN": one("MVN"),
    "SPP": one("SPP", spp_param={"pyramid_height": 2}),
    "Im2col": one("Im2col", convolution_param={"kernel_size": 2}),
    "LSTMUnit": one("LSTMUnit", ["c0", "gates", "flag"], ["c", "h_out"]),
    "ContrastiveLoss": one("ContrastiveLoss", ["v", "prob", "label"]),
    "HingeLoss": one("HingeLoss", ["v", "label"]),
    "InfogainLoss": one("InfogainLoss", ["v", "label", "h"]),
    "MultinomialLogisticLoss": one("MultinomialLogisticLoss", ["prob", "label"]),
    "Python": one("Python", python_param={"module": "python_layers", "layer": "SimpleLayer"}),
    # segmentation forks
    "BN": one("BN", bn_param={"bn_mode": "LEARN", "scale_filler": {"type": "constant",
                                                                   "value": 1}}),
    "Upsample": [{"name": "pool", "type": "Pooling", "bottom": "x", "top": ["p", "mask"],
                  "pooling_param": {"kernel_size": 2, "stride": 2}},
                 *one("Upsample", ["p", "mask"], upsample_param={"scale": 2})],
    "Interp": one("Interp", interp_param={"zoom_factor": 2}),
    "MatWrite": [{"name": "under_test", "type": "MatWrite", "bottom": "x",
                  "mat_write_param": {"prefix": PLACEHOLDER}}],
    "SegAccuracy": [{"name": "seg", "type": "DummyData", "top": "seg",
                     "dummy_data_param": {"shape": {"dim": [2, 1, 4, 4]}}},
                    *one("SegAccuracy", ["x", "seg"])],
    "ConvolutionDepthwise": one("ConvolutionDepthwise", convolution_param={
        "kernel_size": 3, "pad": 1, "weight_filler": {"type": "xavier"}}),
    "ShuffleChannel": one("ShuffleChannel", shuffle_channel_param={"group": 3}),
    "Axpy": [{"name": "squeeze", "type": "Pooling", "bottom": "x", "top": "a",
              "pooling_param": {"pool": "AVE", "global_pooling": True}},
             *one("Axpy", ["a", "x", "y"])],
    "MarginInnerProduct": one("MarginInnerProduct", ["v", "label"], ["out", "lambda"],
                              margin_inner_product_param={"num_output": 3, "type": "DOUBLE",
                                                          "weight_filler": {"type": "xavier"}}),
    "LabelSpecificAdd": one("LabelSpecificAdd", ["v", "label"],
                            label_specific_add_param={"bias": -0.35}),
    "CenterLoss": one("CenterLoss", ["v", "label"],
                      center_loss_param={"num_output": 3, "center_filler": {"type": "xavier"}}),
    "Lstm": one("Lstm", "seq", lstm_param={"num_output": 3,
                                           "weight_filler": {"type": "gaussian"}}),
    "Reverse": one("Reverse", "seq"),
    "Transpose": one("Transpose", "seq", transpose_param={"dim": [1, 0, 2]}),
    "CTCGreedyDecoder": one("CTCGreedyDecoder", "seq"),
    "WarpCTCLoss": [{"name": "labels", "type": "DummyData", "top": "ctc_labels",
                     "dummy_data_param": {"shape": {"dim": [2, 2]},
                                          "data_filler": {"type": "constant", "value": 1}}},
                    *one("WarpCTCLoss", ["seq", "ctc_labels"])],
    "DenseImageData": [{"name": "under_test", "type": "DenseImageData", "top": ["out", "lab"],
                        "dense_image_data_param": {"source": PLACEHOLDER,
                                                   "batch_size": 2}}],
    "ImageSegData": [{"name": "under_test", "type": "ImageSegData", "top": ["out", "lab"],
                      "image_data_param": {"source": PLACEHOLDER, "batch_size": 2,
                                           "label_type": "PIXEL"}}],
    # detection forks (SSD, Faster R-CNN, R-FCN)
    "AnnotatedData": [{"name": "under_test", "type": "AnnotatedData", "top": ["out", "out_label"],
                       "data_param": {"source": PLACEHOLDER, "batch_size": 2,
                                      "backend": "LMDB"}}],
    "Normalize": one("Normalize"),
    "Permute": one("Permute", permute_param={"order": [0, 2, 3, 1]}),
    "PriorBox": one("PriorBox", ["x", "y"], prior_box_param={"min_size": [2.0],
                                                             "aspect_ratio": [2.0]}),
    "DetectionOutput": [  # nothing passes the threshold: the fork's row of -1 for the image
        *predictions(1),
        *one("DetectionOutput", ["loc", "conf", "priors"], detection_output_param={
            "num_classes": 3, "confidence_threshold": 1.0, "nms_param": {"top_k": 5}})],
    "DetectionEvaluate": [
        {"name": "det", "type": "DummyData", "top": "det", "dummy_data_param": {
            "shape": {"dim": [1, 1, 2, 7]}, "data_filler": {"type": "constant", "value": -1}}},
        {"name": "gt", "type": "DummyData", "top": "gt", "dummy_data_param": {
            "shape": {"dim": [1, 1, 1, 8]}, "data_filler": {"type": "constant", "value": -1}}},
        *one("DetectionEvaluate", ["det", "gt"], detection_evaluate_param={"num_classes": 3})],
    "MultiBoxLoss": [  # ground truth: image 1, label 1, a box at the corner
        *predictions(2),
        {"name": "gt", "type": "DummyData", "top": "gt", "dummy_data_param": {
            "shape": {"dim": [1, 1, 1, 8]}, "data_filler": {"type": "constant", "value": 1}}},
        *one("MultiBoxLoss", ["loc", "conf", "priors", "gt"], multibox_loss_param={
            "num_classes": 3, "overlap_threshold": 0.5})],
    "ROIPooling": [ROIS, *one("ROIPooling", ["x", "rois"], roi_pooling_param={
        "pooled_h": 2, "pooled_w": 2, "spatial_scale": 1.0})],
    "PSROIPooling": [ROIS, *one("PSROIPooling", ["x", "rois"], psroi_pooling_param={
        "output_dim": 3, "group_size": 1, "spatial_scale": 1.0})],
    "SmoothL1Loss": one("SmoothL1Loss", ["x", "y"], smooth_l1_loss_param={"sigma": 3.0},
                        loss_param={"normalization": "BATCH_SIZE"}),
}


def library_types() -> list[str]:
    """Types the library registers (test modules may register toy types of their own)."""
    return [t for t in registry.known_types()
            if registry.lookup(t).__module__.startswith("caffe_py.layers.")]


class FixedFeed:
    """Stands in for the data pipeline's prefetcher: batches of 2 records of ``shape``."""

    def __init__(self, shape=(1, 4, 4)):
        self.shape = shape

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.rand(2, *self.shape), torch.tensor([0, 1])


def make_inputs(gen: torch.Generator) -> dict[str, torch.Tensor]:
    out = {name: torch.randn(shape, generator=gen, requires_grad=True)
           for name, shape in INPUTS.items()}
    out["prob"] = torch.rand(INPUTS["prob"], generator=gen)
    out["label"] = torch.tensor([0, 2])
    out["cont"] = torch.tensor([[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]])
    out["flag"] = torch.tensor([[0.0, 1.0]])
    out["index"] = torch.tensor([1.0, 0.0, 1.0])
    out["h"] = torch.eye(3)
    out["keep"] = torch.ones(2)
    return out


def write_three_records(path: Path) -> None:
    write_db(path, [Datum(1, 4, 4, data=bytes(range(16)), label=i) for i in range(3)])


def write_sources(type_name: str, layer: dict, tmp: Path) -> None:
    """The file a data layer of ``type_name`` reads (or writes), named in its block."""
    import numpy as np
    from PIL import Image

    block = next(key for key in layer if key.endswith("_param") and key != "transform_param")
    path = tmp / "source"
    if type_name == "Data":
        write_three_records(path)
    elif type_name in ("ImageData", "WindowData"):
        Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp / "a.png")
        path.write_text("a.png 1\n" if type_name == "ImageData" else
                        f"# 0\n{tmp / 'a.png'}\n3 4 4\n2\n1 0.9 0 0 3 3\n0 0.1 1 1 2 2\n")
    elif type_name in ("DenseImageData", "ImageSegData"):
        Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp / "a.png")
        Image.fromarray(np.ones((4, 4), np.uint8)).save(tmp / "b.png")
        path.write_text("a.png b.png\n")
    elif type_name == "AnnotatedData":  # records without boxes: the label top is (N,)
        from caffe_py.io.formats.annotated import AnnotatedDatum, encode_annotated

        write_db(path, [encode_annotated(AnnotatedDatum(datum=Datum(1, 4, 4, data=bytes(range(16)),
                                                                    label=i)))
                        for i in range(3)])
    elif type_name == "HDF5Data":
        import h5py

        with h5py.File(tmp / "a.h5", "w") as f:
            f["out"] = np.zeros((3, 1, 4, 4), np.float32)
            f["out_label"] = np.arange(3, dtype=np.float32)
        path.write_text("a.h5\n")
    if type_name == "MatWrite":
        layer[block] = {**layer[block], "prefix": f"{tmp}/features/"}
        return
    key = "file_name" if type_name == "HDF5Output" else "source"
    layer[block] = {**layer[block], key: str(path)}


@pytest.mark.parametrize("type_name", library_types())
def test_type_builds_and_runs_in_a_minimal_net(type_name, tmp_path):
    if type_name not in MINIMAL:
        pytest.fail(f"layer type '{type_name}' has no minimal spec: add one to MINIMAL in "
                    "tests/layers/test_registry.py")
    layers = [dict(lp) for lp in MINIMAL[type_name]]
    if PLACEHOLDER in str(layers[0]):  # a source, or HDF5Output's file_name
        write_sources(type_name, layers[0], tmp_path)
    spec = parse_net({"name": f"minimal_{type_name}", "input": list(INPUTS),
                      "input_shape": [{"dim": list(s)} for s in INPUTS.values()],
                      "layer": layers}, Source())
    net = Net(spec, "TRAIN", seed=3)
    layer = net.layer_by_name("under_test")
    assert type(layer) is registry.lookup(type_name)
    for data_layer in net.data_layers():
        data_layer.attach(FixedFeed(data_layer.record_shape))
    if type_name == "MemoryData":
        layer.reset(torch.rand(4, 1, 4, 4), torch.arange(4.0))
    inputs = make_inputs(torch.Generator().manual_seed(0))
    if type_name == "Input":
        inputs["extra"] = torch.ones(2, 5)
    result = net(inputs)
    for top in layer.spec.top:  # the shapes inferred at build time are the real ones
        assert tuple(result.outputs[top].shape) == net.blobs[top], top
    floats = [t for t in result.outputs.values() if t.is_floating_point() and t.requires_grad]
    if floats:
        sum(t.sum() for t in floats).backward()


def test_every_minimal_spec_names_a_real_parameter_block():
    """Entries for types not registered yet are allowed; a wrong block name is not."""
    for type_name in sorted(set(MINIMAL) & set(library_types())):
        cls = registry.lookup(type_name)
        under_test = next(lp for lp in MINIMAL[type_name] if lp["name"] == "under_test")
        for key in under_test:
            if key.endswith("_param"):
                assert key in cls.params, f"{type_name} takes no {key}"


def test_unknown_type_suggests_the_nearest_without_listing_all():
    with pytest.raises(SpecError) as err:
        registry.lookup("Convolutoin")
    assert str(err.value) == "unknown layer type 'Convolutoin'; did you mean 'Convolution'?"


def test_registering_a_type_twice_names_the_first():
    first = registry.lookup("Convolution")
    with pytest.raises(RuntimeError) as err:
        registry.register("Convolution")(type("Again", (first,), {}))
    assert str(err.value) == ("layer type 'Convolution' is already registered by "
                              f"{first.__module__}.{first.__qualname__}")


def test_registry_and_spec_table_are_in_step():
    """Every registered layer type has its blocks in the spec's table, and every type of the
    table builds a layer: the spec validates exactly the types the net can build."""
    registered, declared = set(registry.known_types()), set(layer_params.known_types())
    assert not registered - declared, (
        f"registered layer types missing from the spec's table: "
        f"{', '.join(sorted(registered - declared))}; add them to LAYER_PARAMS in "
        "caffe_py/spec/layer_params/__init__.py")
    assert not declared - registered, (
        f"layer types in the spec's table with no registered layer class: "
        f"{', '.join(sorted(declared - registered))}; register one in caffe_py/layers/")
    for type_name in sorted(registered):
        assert registry.lookup(type_name).params == layer_params.blocks(type_name), type_name


def test_registering_a_type_the_table_lacks_says_where_to_declare_it():
    with pytest.raises(RuntimeError) as err:
        registry.register("Undeclared")(type("Undeclared", (Layer,), {}))
    assert str(err.value) == (
        "layer type 'Undeclared' has no entry in the spec's table of parameter blocks: add "
        "\"Undeclared\": {...} ({} for none) to LAYER_PARAMS in "
        "caffe_py/spec/layer_params/__init__.py")
    assert "Undeclared" not in registry.known_types()


def test_a_declared_type_without_a_layer_class_is_named():
    layer_params.declare("Unbuilt", {})
    try:
        with pytest.raises(RuntimeError) as err:
            registry.lookup("Unbuilt")
    finally:
        layer_params.undeclare("Unbuilt")
    assert str(err.value) == ("layer type 'Unbuilt' is in the spec's table of parameter blocks "
                              "but no layer class is registered for it")


def test_docs_layers_table_has_every_type_block_and_field():
    """docs/layers.md (written by docs/make_layers_table.py) is in step with the spec's table:
    rerun the script when a type, block or field changes."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "layers.md").read_text()
    sections = {part.split("\n", 1)[0].strip(): part for part in text.split("\n### ")[1:]}
    for type_name in library_types():
        section = sections.get(type_name)
        assert section is not None, f"docs/layers.md has no section for {type_name}"
        for key, cls in layer_params.blocks(type_name).items():
            assert f"`{key}` ({cls.__name__})" in section, f"{type_name}: {key}"
            block = section.split(f"`{key}` ({cls.__name__})", 1)[1].split("\n\n`", 1)[0]
            for name in field_names(cls):
                assert f"| `{name}` |" in block, f"{type_name}.{key}.{name}"
