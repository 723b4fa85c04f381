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
    ELUParameter,
    PowerParameter,
    PReLUParameter,
    ReLUParameter,
    SigmoidParameter,
    TanHParameter,
)
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
from .loss import AccuracyParameter, LossParameter
from .normalization import BatchNormParameter, BiasParameter, ScaleParameter
from .recurrent import RecurrentParameter
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
    # normalization
    "BatchNorm": {"batch_norm_param": BatchNormParameter},
    "Scale": {"scale_param": ScaleParameter},
    "Bias": {"bias_param": BiasParameter},
    # loss
    "SoftmaxWithLoss": {"loss_param": LossParameter, "softmax_param": SoftmaxParameter},
    "EuclideanLoss": {"loss_param": LossParameter},
    "SigmoidCrossEntropyLoss": {"loss_param": LossParameter},
    "Accuracy": {"accuracy_param": AccuracyParameter},
    # recurrent
    "RNN": {"recurrent_param": RecurrentParameter},
    "LSTM": {"recurrent_param": RecurrentParameter},
}


def blocks(type_name: str, *, src: Source | None = None, line: int | None = None,
           path: str = "") -> Mapping[str, type]:
    """The blocks ``type_name`` takes, key -> message class (read-only); an unknown type is a
    SpecError at ``src``:``line`` listing the known types and the nearest one."""
    declared = LAYER_PARAMS.get(type_name)
    if declared is not None:
        return MappingProxyType(declared)
    near = suggest(type_name, LAYER_PARAMS)
    fix = f"did you mean '{near}'? " if near else ""
    raise SpecError(f"unknown layer type '{type_name}'", file=src.file if src else None,
                    line=line, path=path, fix=f"{fix}known types: {', '.join(known_types())}")


def known_types() -> list[str]:
    """Every declared layer type, sorted."""
    return sorted(LAYER_PARAMS)


def takes_block(key: str) -> bool:
    """Whether any layer type takes a ``key`` block (e.g. 'pooling_param')."""
    return any(key in declared for declared in LAYER_PARAMS.values())


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


__all__ = ["LAYER_PARAMS", "blocks", "known_types", "takes_block", "declare", "undeclare"]
