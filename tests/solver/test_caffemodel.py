"""The hand-written .caffemodel / .solverstate codecs against protobuf's own serializer of
caffe.proto's NetParameter, LayerParameter and SolverState (skipped without protobuf)."""
from __future__ import annotations

import pytest
import torch

protobuf = pytest.importorskip("google.protobuf")

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402

from caffe_py.solver import caffemodel  # noqa: E402

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED


def _classes():
    file = descriptor_pb2.FileDescriptorProto(name="caffe_py_solver_test.proto",
                                              package="caffe", syntax="proto2")

    def message(name, fields):
        m = file.message_type.add(name=name)
        for fname, number, kind, label, *extra in fields:
            f = m.field.add(name=fname, number=number, type=kind, label=label)
            if extra and extra[0] == "packed":
                f.options.packed = True
            elif extra:
                f.type_name = extra[0]

    message("BlobShape", [("dim", 1, _F.TYPE_INT64, _REP, "packed")])
    message("BlobProto", [("shape", 7, _F.TYPE_MESSAGE, _OPT, ".caffe.BlobShape"),
                          ("data", 5, _F.TYPE_FLOAT, _REP, "packed")])
    message("LayerParameter", [("name", 1, _F.TYPE_STRING, _OPT),
                               ("type", 2, _F.TYPE_STRING, _OPT),
                               ("bottom", 3, _F.TYPE_STRING, _REP),
                               ("blobs", 7, _F.TYPE_MESSAGE, _REP, ".caffe.BlobProto")])
    message("NetParameter", [("name", 1, _F.TYPE_STRING, _OPT),
                             ("layer", 100, _F.TYPE_MESSAGE, _REP, ".caffe.LayerParameter")])
    message("SolverState", [("iter", 1, _F.TYPE_INT32, _OPT),
                            ("learned_net", 2, _F.TYPE_STRING, _OPT),
                            ("history", 3, _F.TYPE_MESSAGE, _REP, ".caffe.BlobProto"),
                            ("current_step", 4, _F.TYPE_INT32, _OPT)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return [message_factory.GetMessageClass(pool.FindMessageTypeByName(f"caffe.{n}"))
            for n in ("NetParameter", "SolverState")]


NetParameter, SolverState = _classes()


def test_caffe_parses_our_caffemodel():
    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    buf = caffemodel.encode_net("lenet", {"ip": [w, torch.ones(2)]}, {"ip": "InnerProduct"})
    net = NetParameter.FromString(buf)
    assert net.name == "lenet" and [lay.name for lay in net.layer] == ["ip"]
    assert net.layer[0].type == "InnerProduct"
    assert list(net.layer[0].blobs[0].shape.dim) == [2, 3]
    assert list(net.layer[0].blobs[0].data) == w.reshape(-1).tolist()


def test_we_read_caffes_caffemodel():
    net = NetParameter(name="n")
    layer = net.layer.add(name="conv", type="Convolution", bottom=["data"])
    blob = layer.blobs.add()
    blob.shape.dim.extend([1, 1, 2, 2])
    blob.data.extend([0.5, -1.0, 2.0, 3.25])
    net.layer.add(name="relu", type="ReLU")  # no blobs: not in the table
    layers = caffemodel.decode_net(net.SerializeToString(), "x.caffemodel")
    assert list(layers) == ["conv"]
    assert layers["conv"][0].tolist() == [[[[0.5, -1.0], [2.0, 3.25]]]]


def test_solverstate_both_ways_with_extras_kept_as_unknown_field():
    history = [torch.tensor([1.5, -2.0]), torch.zeros(1, 3)]
    buf = caffemodel.encode_state({"iter": 40, "current_step": 3, "learned_net": "a.caffemodel",
                                   "history": history, "type": "SGD"})
    state = SolverState.FromString(buf)  # Caffe's parser accepts caffe-py's field 1000
    assert (state.iter, state.current_step, state.learned_net) == (40, 3, "a.caffemodel")
    assert list(state.history[0].data) == [1.5, -2.0]
    assert list(state.history[1].shape.dim) == [1, 3]
    theirs = SolverState(iter=7, learned_net="/abs/dir/net_iter_7.caffemodel", current_step=1)
    h = theirs.history.add()
    h.shape.dim.extend([2])
    h.data.extend([3.0, 4.0])
    back = caffemodel.decode_state(theirs.SerializeToString(), "s.solverstate")
    assert (back["iter"], back["current_step"], back["learned_net"]) == (
        7, 1, "net_iter_7.caffemodel")
    assert back["history"][0].tolist() == [3.0, 4.0]


def test_read_net_streams_blobs_bigger_than_its_buffer_and_skips_the_rest(tmp_path):
    big = torch.arange(100_002, dtype=torch.float32).reshape(6, -1)  # 400 kB > the 64 KiB buffer
    net = NetParameter(name="n")
    layer = net.layer.add(name="fc", type="InnerProduct", bottom=["x" * 70_000])  # skipped
    blob = layer.blobs.add()
    blob.shape.dim.extend(big.shape)
    blob.data.extend(big.reshape(-1).tolist())
    small = layer.blobs.add()
    small.shape.dim.extend([2])
    small.data.extend([1.5, -2.5])
    path = tmp_path / "m.caffemodel"
    path.write_bytes(net.SerializeToString())
    layers = caffemodel.read_net(path)
    assert torch.equal(layers["fc"][0], big) and layers["fc"][1].tolist() == [1.5, -2.5]
    assert layers["fc"][0].is_contiguous() and layers["fc"][0].numpy().flags.writeable


def test_read_net_takes_double_and_unpacked_data_and_refuses_truncation(tmp_path):
    import struct

    from caffe_py.errors import SolverError
    from caffe_py.io.formats.wire import len_field, tag, varint

    unpacked = b"".join(tag(5, 5) + struct.pack("<f", v) for v in (1.0, 2.0))
    doubles = len_field(8, struct.pack("<2d", 0.5, 0.25))
    shape = len_field(7, len_field(1, varint(2)))
    buf = len_field(100, len_field(1, b"a") + len_field(7, shape + unpacked)
                    + len_field(7, shape + doubles))
    path = tmp_path / "m.caffemodel"
    path.write_bytes(buf)
    layers = caffemodel.read_net(path)
    assert [b.tolist() for b in layers["a"]] == [[1.0, 2.0], [0.5, 0.25]]
    path.write_bytes(buf[:-5])
    with pytest.raises(SolverError) as err:
        caffemodel.read_net(path)
    assert str(err.value) == (f"{path}: not a Caffe NetParameter (.caffemodel) (field 100 runs "
                              f"past the end ({len(buf)} > {len(buf) - 5} bytes))")
