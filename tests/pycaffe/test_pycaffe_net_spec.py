"""caffe_py.pycaffe's NetSpec, layers and params, and caffe_pb2 messages."""
from __future__ import annotations

import pytest

pytest.importorskip("google.protobuf")

from google.protobuf import text_format  # noqa: E402

import caffe_py.pycaffe as caffe  # noqa: E402
from caffe_py.io.formats.blobproto import decode_blob  # noqa: E402
from caffe_py.pycaffe import layers as L  # noqa: E402
from caffe_py.pycaffe import params as P  # noqa: E402
from caffe_py.pycaffe.proto import caffe_pb2  # noqa: E402


def test_netspec_writes_caffes_prototxt():
    n = caffe.NetSpec()
    n.data, n.label = L.Data(batch_size=64, backend=P.Data.LMDB, source="train_lmdb",
                             transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20,
                            weight_filler=dict(type="xavier"),
                            param=[dict(lr_mult=1), dict(lr_mult=2)])
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.relu1 = L.ReLU(n.pool1, in_place=True)
    n.loss = L.SoftmaxWithLoss(n.relu1, n.label, loss_weight=2,
                               include=dict(phase=caffe.TRAIN))
    text = str(n.to_proto())
    assert text.startswith('layer {\n  name: "data"\n  type: "Data"\n  top: "data"\n'
                           '  top: "label"\n  transform_param {\n    scale: 0.00392156886\n'
                           '  }\n  data_param {\n    source: "train_lmdb"\n    batch_size: 64\n'
                           '    backend: LMDB\n  }\n}\n')
    assert ('  param {\n    lr_mult: 1\n  }\n  param {\n    lr_mult: 2\n  }\n'
            '  convolution_param {\n    num_output: 20\n    kernel_size: 5\n'
            '    weight_filler {\n      type: "xavier"\n    }\n  }\n') in text
    assert 'name: "relu1"\n  type: "ReLU"\n  bottom: "pool1"\n  top: "pool1"\n' in text
    assert '  loss_weight: 2\n  include {\n    phase: TRAIN\n  }\n' in text


def test_unnamed_tops_and_layers_are_named_by_type():
    data = L.Input(shape=dict(dim=[1, 2]))
    top = L.ReLU(L.InnerProduct(data, num_output=3))
    net = caffe.to_proto(top)
    assert [(lay.name, list(lay.top)) for lay in net.layer] == [
        ("Input1", ["Input1"]), ("InnerProduct1", ["InnerProduct1"]), ("ReLU1", ["ReLU1"])]
    n = caffe.NetSpec()
    n.data = data
    n.silence = L.Silence(n.data, ntop=0)  # a layer without tops, named as assigned
    assert [(lay.name, list(lay.bottom)) for lay in n.to_proto().layer] == [
        ("data", []), ("silence", ["data"])]
    with pytest.raises(TypeError, match="^ReLU input 0 is not a Top"):
        L.ReLU(3)


def test_pb2_messages_parse_print_and_serialize_as_caffe_proto():
    param = caffe_pb2.NetParameter()
    text_format.Merge('name: "n" layer { name: "c" type: "Convolution" convolution_param { '
                      'num_output: 4 pad: 1 pad: 2 } }', param)
    assert param.layer[0].convolution_param.pad == [1, 2]
    assert param.layer[0].convolution_param.bias_term  # caffe.proto's default
    assert caffe_pb2.PoolingParameter.AVE == 1 and caffe_pb2.SolverParameter.GPU == 1
    assert caffe_pb2.TEST == 1 and caffe_pb2.Phase.Name(0) == "TRAIN"
    blob = caffe_pb2.BlobProto(data=[1.5, 2.0])
    blob.shape.dim.extend([2])
    assert decode_blob(blob.SerializeToString()).array().tolist() == [1.5, 2.0]
    solver = caffe_pb2.SolverParameter(base_lr=0.01, random_seed=0xCAFFE)
    assert str(solver) == "base_lr: 0.01\nrandom_seed: 831486\n"
    with pytest.raises(AttributeError, match=r"^caffe.proto.caffe_pb2.NetParamter is not "
                                             r"covered by caffe-py's pycaffe; the nearest "
                                             r"covered name is caffe.proto.caffe_pb2."
                                             r"NetParameter "):
        _ = caffe_pb2.NetParamter
