"""Every layer type's parameter blocks: what Caffe's LayerParameter holds beyond the wiring.

caffe.proto is Caffe's whole schema; this package is caffe-py's part of it for layers. One
module per layer family (mirroring caffe_py/layers/) holds the messages, and LAYER_PARAMS
says which ``<x>_param`` blocks each layer type takes, so the net spec validates a layer
without importing the layer library (or torch).

To add a layer type: write its message in the family module (a dataclass derived from
:class:`~caffe_py.spec.schema.Message`, fields declared with ``field``), add its line here,
e.g. ``"Pooling": {"pooling_param": PoolingParameter}`` (``{}`` for a type with no block; the
first block is the one ``Layer.param()`` returns), and register the layer class under the
same type string in caffe_py/layers/: the registry hands the class these blocks as
``Layer.params``. tests/layers/test_registry.py keeps the table and the registry in step.
Code outside the package (a test's toy layers) uses :func:`declare` and :func:`undeclare`.
"""
from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from ...errors import SpecError
from ..schema import Source, suggest
from .activation import (
    ClipParameter,
    ELUParameter,
    ExpParameter,
    LogParameter,
    PowerParameter,
    PReLUParameter,
    ReLUParameter,
    SigmoidParameter,
    SwishParameter,
    TanHParameter,
    ThresholdParameter,
)
from .caffe_proto import CAFFE_LAYER_BLOCKS
from .common import (
    ConcatParameter,
    DropoutParameter,
    EltwiseParameter,
    FlattenParameter,
    InnerProductParameter,
    ReshapeParameter,
    SliceParameter,
    SoftmaxParameter,
)
from .data import (
    DataParameter,
    DummyDataParameter,
    HDF5DataParameter,
    HDF5OutputParameter,
    ImageDataParameter,
    InputParameter,
    MemoryDataParameter,
    TransformationParameter,
    WindowDataParameter,
)
from .detection import (
    ANNOTATED_DATA_BLOCKS,
    AnnotatedTransformationParameter,
    DetectionEvaluateParameter,
    DetectionOutputParameter,
    MultiBoxLossParameter,
    NormalizeParameter,
    PermuteParameter,
    PriorBoxParameter,
    PSROIPoolingParameter,
    ROIPoolingParameter,
    SmoothL1LossParameter,
)
from .face import CenterLossParameter, LabelSpecificAddParameter, MarginInnerProductParameter
from .forks import PORT, fix_for, origin
from .loss import AccuracyParameter, InfogainLossParameter, LossParameter
from .margin_loss import ContrastiveLossParameter, HingeLossParameter
from .mobile import ShuffleChannelParameter
from .normalization import BatchNormParameter, BiasParameter, MVNParameter, ScaleParameter
from .python import PythonParameter
from .recurrent import RecurrentParameter
from .segmentation import (
    BNParameter,
    DenseImageDataParameter,
    ImageSegDataParameter,
    InterpParameter,
    MatWriteParameter,
    SegAccuracyParameter,
    SegTransformationParameter,
    UpsampleParameter,
)
from .sequence import (
    CTCDecoderParameter,
    CTCLossParameter,
    LstmParameter,
    ReverseParameter,
    TransposeParameter,
)
from .spatial import SPPParameter
from .utility import (
    ArgMaxParameter,
    CropParameter,
    EmbedParameter,
    ParameterParameter,
    ReductionParameter,
    TileParameter,
)
from .vision import ConvolutionParameter, LRNParameter, PoolingParameter

# Layer type -> its blocks (key -> message class), in the order Caffe's layer reads them.
LAYER_PARAMS: dict[str, dict[str, type]] = {
    # data
    "Input": {"input_param": InputParameter},
    "DummyData": {"dummy_data_param": DummyDataParameter},
    "Data": {"data_param": DataParameter, "transform_param": TransformationParameter},
    "ImageData": {"image_data_param": ImageDataParameter,
                  "transform_param": TransformationParameter},
    "WindowData": {"window_data_param": WindowDataParameter,
                   "transform_param": TransformationParameter},
    "HDF5Data": {"hdf5_data_param": HDF5DataParameter},
    "HDF5Output": {"hdf5_output_param": HDF5OutputParameter},
    "MemoryData": {"memory_data_param": MemoryDataParameter,
                   "transform_param": TransformationParameter},
    # vision
    "Convolution": {"convolution_param": ConvolutionParameter},
    "Deconvolution": {"convolution_param": ConvolutionParameter},
    "Pooling": {"pooling_param": PoolingParameter},
    "LRN": {"lrn_param": LRNParameter},
    # common
    "InnerProduct": {"inner_product_param": InnerProductParameter},
    "Flatten": {"flatten_param": FlattenParameter},
    "Reshape": {"reshape_param": ReshapeParameter},
    "Concat": {"concat_param": ConcatParameter},
    "Slice": {"slice_param": SliceParameter},
    "Split": {},
    "Eltwise": {"eltwise_param": EltwiseParameter},
    "Silence": {},
    "Softmax": {"softmax_param": SoftmaxParameter},
    "Dropout": {"dropout_param": DropoutParameter},
    # activation
    "ReLU": {"relu_param": ReLUParameter},
    "PReLU": {"prelu_param": PReLUParameter},
    "ELU": {"elu_param": ELUParameter},
    "Sigmoid": {"sigmoid_param": SigmoidParameter},
    "TanH": {"tanh_param": TanHParameter},
    "AbsVal": {},
    "Power": {"power_param": PowerParameter},
    "BNLL": {},
    "Exp": {"exp_param": ExpParameter},
    "Log": {"log_param": LogParameter},
    "Threshold": {"threshold_param": ThresholdParameter},
    "Clip": {"clip_param": ClipParameter},
    "Swish": {"swish_param": SwishParameter},
    # utility
    "Crop": {"crop_param": CropParameter},
    "Tile": {"tile_param": TileParameter},
    "Reduction": {"reduction_param": ReductionParameter},
    "ArgMax": {"argmax_param": ArgMaxParameter},
    "Embed": {"embed_param": EmbedParameter},
    "Filter": {},
    "BatchReindex": {},
    "Parameter": {"parameter_param": ParameterParameter},
    # normalization
    "BatchNorm": {"batch_norm_param": BatchNormParameter},
    "Scale": {"scale_param": ScaleParameter},
    "Bias": {"bias_param": BiasParameter},
    "MVN": {"mvn_param": MVNParameter},
    # spatial
    "SPP": {"spp_param": SPPParameter},
    "Im2col": {"convolution_param": ConvolutionParameter},
    # loss
    "SoftmaxWithLoss": {"loss_param": LossParameter, "softmax_param": SoftmaxParameter},
    "EuclideanLoss": {"loss_param": LossParameter},
    "SigmoidCrossEntropyLoss": {"loss_param": LossParameter},
    "Accuracy": {"accuracy_param": AccuracyParameter},
    "ContrastiveLoss": {"contrastive_loss_param": ContrastiveLossParameter,
                        "loss_param": LossParameter},
    "HingeLoss": {"hinge_loss_param": HingeLossParameter, "loss_param": LossParameter},
    "InfogainLoss": {"infogain_loss_param": InfogainLossParameter, "loss_param": LossParameter},
    "MultinomialLogisticLoss": {"loss_param": LossParameter},
    # recurrent
    "RNN": {"recurrent_param": RecurrentParameter},
    "LSTM": {"recurrent_param": RecurrentParameter},
    "LSTMUnit": {},
    # python
    "Python": {"python_param": PythonParameter},
    # detection (SSD's Caffe fork)
    "AnnotatedData": dict(ANNOTATED_DATA_BLOCKS),
    "PriorBox": {"prior_box_param": PriorBoxParameter},
    "Permute": {"permute_param": PermuteParameter},
    "Normalize": {"norm_param": NormalizeParameter},
    "DetectionOutput": {"detection_output_param": DetectionOutputParameter,
                        "transform_param": AnnotatedTransformationParameter},
    "MultiBoxLoss": {"multibox_loss_param": MultiBoxLossParameter, "loss_param": LossParameter},
    "DetectionEvaluate": {"detection_evaluate_param": DetectionEvaluateParameter},
    # region-based detection (Faster R-CNN's and R-FCN's Caffe forks)
    "ROIPooling": {"roi_pooling_param": ROIPoolingParameter},
    "PSROIPooling": {"psroi_pooling_param": PSROIPoolingParameter},
    "SmoothL1Loss": {"smooth_l1_loss_param": SmoothL1LossParameter, "loss_param": LossParameter},
    # segmentation forks (SegNet, PSPNet / DeepLab v2)
    "BN": {"bn_param": BNParameter},
    "Upsample": {"upsample_param": UpsampleParameter},
    "Interp": {"interp_param": InterpParameter},
    "SegAccuracy": {"seg_accuracy_param": SegAccuracyParameter},
    "DenseImageData": {"dense_image_data_param": DenseImageDataParameter,
                       "transform_param": TransformationParameter},
    "ImageSegData": {"image_data_param": ImageSegDataParameter,
                     "transform_param": SegTransformationParameter},
    "MatWrite": {"mat_write_param": MatWriteParameter},
    # mobile and attention nets' forks (caffe-mobilenet, ShuffleNet, SENet)
    "ConvolutionDepthwise": {"convolution_param": ConvolutionParameter},
    "ShuffleChannel": {"shuffle_channel_param": ShuffleChannelParameter},
    "Axpy": {},
    # face-recognition forks (SphereFace, AM-Softmax, caffe-face)
    "MarginInnerProduct": {"margin_inner_product_param": MarginInnerProductParameter},
    "LabelSpecificAdd": {"label_specific_add_param": LabelSpecificAddParameter},
    "CenterLoss": {"center_loss_param": CenterLossParameter, "loss_param": LossParameter},
    # OCR forks' sequence layers (CRNN / CTPN ports)
    "Lstm": {"lstm_param": LstmParameter},
    "Reverse": {"reverse_param": ReverseParameter},
    "Transpose": {"transpose_param": TransposeParameter},
    "CTCGreedyDecoder": {"ctc_decoder_param": CTCDecoderParameter},
    "WarpCTCLoss": {"ctc_loss_param": CTCLossParameter, "loss_param": LossParameter},
}


def blocks(type_name: str, *, src: Source | None = None, line: int | None = None,
           path: str = "") -> Mapping[str, type]:
    """The blocks ``type_name`` takes, key -> message class (read-only); a type caffe-py lacks
    is a SpecError at ``src``:``line`` (see :func:`unsupported_types`)."""
    declared = LAYER_PARAMS.get(type_name)
    if declared is not None:
        return MappingProxyType(declared)
    raise unsupported_types([(type_name, line, path)], src)


def unsupported_types(found: list[tuple[str, int | None, str]],
                      src: Source | None = None) -> SpecError:
    """One error for every layer type a net uses that caffe-py lacks.

    ``found`` holds (type, line, key path) per layer, in file order; the error points at the
    first. A type of a known Caffe fork is named as such (forks.py), a near miss of a known
    type gets a did-you-mean, and the known types are not listed (docs/layers.md has them).
    """
    lines: dict[str, list[int]] = {}
    for type_name, line, _ in found:
        lines.setdefault(type_name, [])
        if line is not None and line not in lines[type_name]:
            lines[type_name].append(line)
    file = src.file if src else None
    first_type, first_line, first_path = found[0]
    if len(lines) == 1:
        problem, fix = _describe(first_type)
        return SpecError(problem, file=file, line=first_line, path=first_path, fix=fix)
    parts = []
    for type_name, at in lines.items():
        where = origin(type_name) or _near_miss(type_name)
        place = f"; line{'s' if len(at) > 1 else ''} {', '.join(map(str, at))}" if at else ""
        parts.append(f"'{type_name}' ({where}{place})")
    return SpecError(f"the net uses {len(lines)} layer types caffe-py does not have: "
                     f"{', '.join(parts)}", file=file, line=first_line, path=first_path,
                     fix="replace them with BVLC Caffe 1.0 layers (docs/layers.md) or port "
                         "them as Python layers (type: Python)")


def _describe(type_name: str) -> tuple[str, str]:
    """(problem, fix) for one type caffe-py lacks."""
    where = origin(type_name)
    if where == "BVLC Caffe 1.0":
        return (f"'{type_name}' is a BVLC Caffe 1.0 layer type that caffe-py does not have "
                "yet", f"replace it with other layers, or {PORT}")
    if where is not None:
        return f"'{type_name}' is a layer of {where}, not of BVLC Caffe", fix_for(type_name)
    near = suggest(type_name, LAYER_PARAMS)
    if near is not None:
        return f"unknown layer type '{type_name}'", f"did you mean '{near}'?"
    return (f"unknown layer type '{type_name}'",
            "caffe-py has BVLC Caffe 1.0's layer types (docs/layers.md lists them) and "
            "Python layers (type: Python)")


def _near_miss(type_name: str) -> str:
    near = suggest(type_name, LAYER_PARAMS)
    return f"unknown; did you mean '{near}'?" if near else "unknown"


def known_types() -> list[str]:
    """Every declared layer type, sorted."""
    return sorted(LAYER_PARAMS)


def takes_block(key: str) -> bool:
    """Whether any layer type takes a ``key`` block (e.g. 'pooling_param')."""
    return any(key in declared for declared in LAYER_PARAMS.values())


def caffe_block(key: str) -> bool:
    """Whether ``key`` names a parameter block of Caffe's LayerParameter (or one a type of
    this table takes): a block Caffe ignores on a layer of another type, not a misspelling."""
    return key in CAFFE_LAYER_BLOCKS or takes_block(key)


def declare(type_name: str, type_blocks: Mapping[str, type]) -> None:
    """Add a layer type from outside this package (``{}``: no block); declaring a type twice is
    an error naming the blocks it has."""
    first = LAYER_PARAMS.get(type_name)
    if first is not None:
        raise RuntimeError(f"layer type '{type_name}' is already declared, with blocks "
                           f"{', '.join(first) or 'none'}")
    LAYER_PARAMS[type_name] = dict(type_blocks)


def undeclare(type_name: str) -> None:
    """Remove a type :func:`declare` added (e.g. when a test module ends)."""
    LAYER_PARAMS.pop(type_name, None)


__all__ = ["LAYER_PARAMS", "CAFFE_LAYER_BLOCKS", "blocks", "unsupported_types", "known_types",
           "takes_block", "caffe_block", "declare", "undeclare"]
