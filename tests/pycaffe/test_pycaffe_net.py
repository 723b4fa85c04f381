"""caffe_py.pycaffe.Net: Caffe's blob list, memory semantics and passes over caffe-py's Net."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import caffe_py.pycaffe as caffe
from caffe_py.pycaffe.errors import PycaffeAttributeError, PycaffeError
from caffe_py.solver.caffemodel import read_net

NET = """
name: "small"
force_backward: true
layer { name: "in" type: "Input" top: "data" top: "target"
  input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } shape { dim: 2 dim: 5 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.2 }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "ip" top: "ip" }
layer { name: "sig" type: "Sigmoid" bottom: "ip" top: "sig" }
layer { name: "sum" type: "Eltwise" bottom: "ip" bottom: "sig" top: "sum" }
layer { name: "loss" type: "EuclideanLoss" bottom: "sum" bottom: "target" top: "loss"
  loss_weight: 0.5 }
"""


@pytest.fixture
def net_file(tmp_path):
    path = tmp_path / "small.prototxt"
    path.write_text(NET)
    return str(path)


@pytest.fixture
def net(net_file):
    caffe.set_random_seed(5)
    return caffe.Net(net_file, caffe.TEST)


def _fill(net):
    rng = np.random.RandomState(0)
    net.blobs["data"].data[...] = rng.normal(0, 1, (2, 3, 4, 4))
    net.blobs["target"].data[...] = rng.normal(0, 1, (2, 5))


def _reference(net):
    """The net's loss and gradients by plain torch autograd, from its present weights."""
    w = torch.tensor(net.params["ip"][0].data, requires_grad=True)
    b = torch.tensor(net.params["ip"][1].data, requires_grad=True)
    x = torch.tensor(net.blobs["data"].data, requires_grad=True)
    t = torch.tensor(net.blobs["target"].data)
    ip = torch.relu(x.reshape(2, -1) @ w.T + b)
    total = ip + torch.sigmoid(ip)
    loss = ((total - t) ** 2).sum() / (2 * 2)  # the blob: the layer's own value
    (0.5 * loss).backward()                      # the gradient: times the loss weight
    return loss.item(), ip.detach().numpy(), x.grad.numpy(), w.grad.numpy()


def test_blobs_and_layers_are_caffes_list_with_its_splits(net):
    assert list(net.blobs) == ["data", "target", "ip", "ip_relu_0_split_0", "ip_relu_0_split_1",
                               "sig", "sum", "loss"]
    assert net._layer_names == ["in", "ip", "relu", "ip_relu_0_split", "sig", "sum", "loss"]
    assert [layer.type for layer in net.layers] == ["Input", "InnerProduct", "ReLU", "Split",
                                                    "Sigmoid", "Eltwise", "EuclideanLoss"]
    assert net.inputs == ["data", "target"] and net.outputs == ["loss"]
    assert net._inputs == [0, 1] and net._outputs == [7]
    assert net.blob_loss_weights["loss"] == 0.5 and net.blob_loss_weights["sum"] == 0
    assert net.bottom_names["sum"] == ["ip_relu_0_split_1", "sig"]
    assert net.top_names["ip_relu_0_split"] == ["ip_relu_0_split_0", "ip_relu_0_split_1"]
    assert list(net.params) == ["ip"] and net.params["ip"][0].data.shape == (5, 48)
    assert net.blobs["data"].shape == (2, 3, 4, 4) and net.blobs["data"].count == 96
    assert (net.blobs["data"].num, net.blobs["data"].channels) == (2, 3)


def test_forward_leaves_in_place_results_and_returns_the_outputs(net):
    _fill(net)
    out = net.forward()
    loss, ip, _, _ = _reference(net)
    assert list(out) == ["loss"]
    np.testing.assert_allclose(out["loss"], loss, rtol=1e-5)
    np.testing.assert_allclose(net.blobs["ip"].data, ip, rtol=1e-5)  # after the ReLU
    assert (net.blobs["ip"].data >= 0).all()
    assert net.blobs["ip_relu_0_split_1"].data is not None
    np.testing.assert_array_equal(net.blobs["ip_relu_0_split_0"].data, net.blobs["ip"].data)


def test_a_write_into_a_blob_is_what_the_next_layers_read(net):
    _fill(net)
    net.forward()
    held = net.blobs["sig"].data  # a view, as pycaffe's: later passes write through it
    net.blobs["ip"].data[...] = 0
    out = net.forward(start="sig", end="sig", blobs=["sum"])
    assert sorted(out) == ["sig", "sum"]
    np.testing.assert_allclose(held, 0.5)
    net.params["ip"][0].data[...] = 0  # surgery: the weights themselves
    net.params["ip"][1].data[...] = np.arange(5)
    net.forward()
    np.testing.assert_allclose(held[0], 1 / (1 + np.exp(-np.arange(5))), rtol=1e-6)


def test_backward_writes_diffs_and_accumulates_parameter_diffs(net):
    _fill(net)
    net.forward()
    grads = net.backward()
    _, _, dx, dw = _reference(net)
    assert sorted(grads) == ["data", "target"]
    np.testing.assert_allclose(grads["data"], dx, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(net.params["ip"][0].diff, dw, rtol=1e-4, atol=1e-7)
    assert net.blobs["loss"].diff == pytest.approx(0.5)  # the loss weight, as Caffe sets it
    net.backward()
    np.testing.assert_allclose(net.params["ip"][0].diff, 2 * dw, rtol=1e-4, atol=1e-7)
    net.clear_param_diffs()
    assert not net.params["ip"][0].diff.any()


def test_backward_before_any_forward_is_one_line(net):
    with pytest.raises(PycaffeError, match=r"^net.backward: layer 'loss' \(EuclideanLoss\) has "
                                           r"not run forward since the net was made; call "
                                           r"net.forward\(\) first$"):
        net.backward()


def test_forward_with_inputs_checks_them_as_pycaffe(net):
    with pytest.raises(PycaffeError, match="^Input blob arguments do not match net inputs.$"):
        net.forward(data=np.zeros((2, 3, 4, 4)))
    with pytest.raises(PycaffeError, match="^Input is not batch sized$"):
        net.forward(data=np.zeros((3, 3, 4, 4)), target=np.zeros((3, 5)))
    with pytest.raises(PycaffeError, match="^'nope' is not a layer of net 'small'"):
        net.forward(start="nope")


def test_reshape_gives_every_blob_its_new_shape(net):
    net.blobs["data"].reshape(4, 3, 4, 4)
    net.blobs["target"].reshape(4, 5)
    net.reshape()
    assert [net.blobs[k].data.shape for k in ("ip", "ip_relu_0_split_1", "sum")] == \
        [(4, 5)] * 3
    net.forward()
    assert net.blobs["sig"].data.shape == (4, 5)


def test_input_shapes_that_change_a_layers_weights_say_so(net):
    """An InnerProduct fed 2 x 3 x 2 x 2 where its weights take 3 x 4 x 4 values: the error
    names the reshaped input and the shape to go back to (it spoke of layers across phases)."""
    from caffe_py.errors import NetError

    net.blobs["data"].reshape(2, 3, 2, 2)
    with pytest.raises(NetError) as info:
        net.forward()
    assert str(info.value) == ("layer 'ip' blob 0: shape [5, 12] here but "
                               "[5, 48] in net 'small' (TEST); the inputs' new shapes (data "
                               "2x3x2x2) change this layer's weights; reshape the inputs back to "
                               "data 2x3x4x4, target 2x5")


def test_an_image_of_another_size_sets_the_net_up_again(tmp_path):
    path = tmp_path / "conv.prototxt"
    path.write_text('input: "data"\ninput_shape { dim: 1 dim: 1 dim: 6 dim: 6 }\n'
                    'layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"\n'
                    '  convolution_param { num_output: 2 kernel_size: 3\n'
                    '    weight_filler { type: "constant" value: 1 } } }\n')
    net = caffe.Net(str(path), caffe.TEST)
    weights = net.params["conv"][0].data
    net.blobs["data"].reshape(1, 1, 9, 7)
    net.blobs["data"].data[...] = 1
    net.forward()
    assert net.blobs["conv"].data.shape == (1, 2, 7, 5)
    np.testing.assert_allclose(net.blobs["conv"].data, 9)
    weights[...] = 2  # still the net's weights after the new set-up
    net.forward()
    np.testing.assert_allclose(net.blobs["conv"].data, 18)


def test_save_writes_a_caffemodel_and_the_constructors_read_it(net, net_file, tmp_path):
    path = tmp_path / "w.caffemodel"
    net.save(str(path))
    blobs = read_net(path)
    np.testing.assert_array_equal(blobs["ip"][0].numpy(), net.params["ip"][0].data)
    for other in (caffe.Net(net_file, caffe.TEST, weights=str(path)),
                  caffe.Net(net_file, str(path), caffe.TEST),
                  caffe.Net(net_file, phase=caffe.TEST, weights=str(path))):
        np.testing.assert_array_equal(other.params["ip"][0].data, net.params["ip"][0].data)
    fresh = caffe.Net(net_file, caffe.TRAIN)
    fresh.copy_from(str(path))
    np.testing.assert_array_equal(fresh.params["ip"][1].data, net.params["ip"][1].data)
    fresh.share_with(net)
    net.params["ip"][1].data[...] = 3
    assert fresh.params["ip"][1].data[0] == 3


def test_forward_all_pads_the_last_batch(tmp_path):
    path = tmp_path / "deploy.prototxt"
    path.write_text('input: "data"\ninput_shape { dim: 3 dim: 2 }\n'
                    'layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"\n'
                    '  inner_product_param { num_output: 2 weight_filler { type: "constant" '
                    'value: 1 } } }\n')
    net = caffe.Net(str(path), caffe.TEST)
    out = net.forward_all(data=np.arange(10, dtype=np.float32).reshape(5, 2))
    np.testing.assert_allclose(out["ip"], [[1, 1], [5, 5], [9, 9], [13, 13], [17, 17]])


def test_set_input_arrays_feeds_a_memory_data_layer(tmp_path):
    path = tmp_path / "memory.prototxt"
    path.write_text('layer { name: "m" type: "MemoryData" top: "data" top: "label"\n'
                    '  memory_data_param { batch_size: 2 channels: 1 height: 1 width: 3 } }\n')
    net = caffe.Net(str(path), caffe.TEST)
    data = np.arange(12, dtype=np.float32).reshape(4, 1, 1, 3)
    net.set_input_arrays(data, np.arange(4, dtype=np.float32))
    net.forward()
    np.testing.assert_array_equal(net.blobs["data"].data, data[:2])
    net.forward()
    np.testing.assert_array_equal(net.blobs["label"].data, [2, 3])
    with pytest.raises(PycaffeError, match="^data array must be float32$"):
        net.set_input_arrays(data.astype(np.float64), np.arange(4, dtype=np.float32))


def test_callbacks_run_around_each_layer(net):
    seen = []
    net.before_forward(lambda i: seen.append(("f", i)))
    net.after_backward(lambda i: seen.append(("b", i)))
    net.forward(end="ip")
    assert seen == [("f", 0), ("f", 1)]


def test_constructor_errors_are_one_line(net_file, tmp_path):
    with pytest.raises(PycaffeError, match=f"^Could not open file {tmp_path}/none.prototxt$"):
        caffe.Net(str(tmp_path / "none.prototxt"), caffe.TEST)
    with pytest.raises(PycaffeError, match=r"^phase must be caffe.TRAIN \(0\) or caffe.TEST "
                                           r"\(1\), got 'TEST'$"):
        caffe.Net(net_file, phase="TEST")
    with pytest.raises(PycaffeAttributeError, match=r"^caffe.Net\(...\) keyword.phases is not "
                                                    r"covered by caffe-py's pycaffe; the "
                                                    r"nearest covered name is caffe.Net\(...\) "
                                                    r"keyword.phase"):
        caffe.Net(net_file, phases=caffe.TEST)


def test_an_uncovered_attribute_names_the_nearest_covered_one(net):
    with pytest.raises(PycaffeAttributeError) as info:
        net.forward_al()
    assert str(info.value) == ("caffe.Net.forward_al is not covered by caffe-py's pycaffe; the "
                               "nearest covered name is caffe.Net.forward_all "
                               "(docs/pycaffe.md lists what is covered)")
    assert isinstance(info.value, AttributeError)
    assert not hasattr(net, "nope")
    with pytest.raises(AttributeError, match="caffe.Blob.dataa is not covered.*caffe.Blob.data "):
        _ = net.blobs["data"].dataa
