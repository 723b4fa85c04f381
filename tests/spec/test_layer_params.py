"""The table of layer types and their parameter blocks (caffe_py.spec.layer_params)."""
from __future__ import annotations

import pytest

from caffe_py.errors import SpecError
from caffe_py.spec import layer_params
from caffe_py.spec.layer_params.common import SoftmaxParameter
from caffe_py.spec.layer_params.loss import LossParameter
from caffe_py.spec.layer_params.vision import ConvolutionParameter
from caffe_py.spec.schema import Source


def test_blocks_in_the_order_the_layer_reads_them():
    assert dict(layer_params.blocks("SoftmaxWithLoss")) == {
        "loss_param": LossParameter, "softmax_param": SoftmaxParameter}
    assert dict(layer_params.blocks("Deconvolution")) == {
        "convolution_param": ConvolutionParameter}
    assert dict(layer_params.blocks("Split")) == {}
    with pytest.raises(TypeError):  # the table is changed by declare, never through a view
        layer_params.blocks("Split")["x_param"] = object


def test_unknown_type_names_the_place_and_the_nearest():
    with pytest.raises(SpecError) as err:
        layer_params.blocks("Convolutoin", src=Source("net.yaml"), line=4, path="layer[0].type")
    assert str(err.value) == (
        "net.yaml:4: layer[0].type: unknown layer type 'Convolutoin'; did you mean "
        "'Convolution'?")


def test_takes_block():
    assert layer_params.takes_block("pooling_param")
    assert not layer_params.takes_block("poolin_param")


def test_declare_and_undeclare_a_type():
    layer_params.declare("Probe", {"softmax_param": SoftmaxParameter})
    try:
        assert "Probe" in layer_params.known_types()
        with pytest.raises(RuntimeError) as err:
            layer_params.declare("Probe", {})
        assert str(err.value) == \
            "layer type 'Probe' is already declared, with blocks softmax_param"
    finally:
        layer_params.undeclare("Probe")
    assert "Probe" not in layer_params.known_types()
    with pytest.raises(RuntimeError, match="'Pooling' is already declared, with blocks "
                                           "pooling_param"):
        layer_params.declare("Pooling", {})
