"""pycaffe's semantics beyond the examples, printed and saved so that two pycaffes can be
compared (caffe-py's own script, run under BVLC's pycaffe for the fixtures): Caffe's random
stream (every filler, Dropout's masks), the blob list (splits, in place, loss weights),
forward and backward over parts of a net, surgery on parameters, reshaping, batching,
weights files, caffe.io's messages, and a solver's steps, updates, tests and snapshots.
Every array goes to api_arrays.npz, every fact to stdout."""
import os

import numpy as np

import caffe
from caffe import layers as L
from caffe import params as P
from caffe.proto import caffe_pb2
from google.protobuf import text_format

arrays = {}


def keep(name, value):
    arrays[name] = np.array(value, dtype=np.float64)


# --- Caffe's random stream: every filler, and Dropout -------------------------------------
FILLERS = """
name: "fillers"
input: "data"
input_shape { dim: 2 dim: 3 dim: 6 dim: 6 }
layer { name: "g" type: "Convolution" bottom: "data" top: "g"
  convolution_param { num_output: 40 kernel_size: 3
    weight_filler { type: "gaussian" mean: 0.1 std: 0.5 }
    bias_filler { type: "uniform" min: -2 max: 3 } } }
layer { name: "x" type: "Convolution" bottom: "data" top: "x"
  convolution_param { num_output: 8 kernel_size: 3
    weight_filler { type: "xavier" variance_norm: AVERAGE } bias_filler { type: "msra" } } }
layer { name: "p" type: "InnerProduct" bottom: "data" top: "p"
  inner_product_param { num_output: 7
    weight_filler { type: "positive_unitball" }
    bias_filler { type: "gaussian" std: 2 sparse: 3 } } }
layer { name: "s" type: "InnerProduct" bottom: "data" top: "s"
  inner_product_param { num_output: 30 weight_filler { type: "gaussian" std: 1 sparse: 10 } } }
layer { name: "c" type: "Convolution" bottom: "data" top: "c"
  convolution_param { num_output: 4 kernel_size: 1 weight_filler { type: "constant" value: 0.25 }
    bias_filler { type: "msra" variance_norm: FAN_OUT } } }
layer { name: "d" type: "Dropout" bottom: "p" top: "d" dropout_param { dropout_ratio: 0.3 } }
"""
with open("fillers.prototxt", "w") as f:
    f.write(FILLERS)
net = caffe.Net("fillers.prototxt", caffe.TRAIN)
for layer, blobs in net.params.items():
    for i, blob in enumerate(blobs):
        keep(f"filler_{layer}_{i}", blob.data)
net.blobs["data"].data[...] = 1
for k in range(3):
    net.forward()
    keep(f"dropout_{k}", net.blobs["d"].data)

# --- the blob list ----------------------------------------------------------------------------
BLOBS = """
name: "blobs"
force_backward: true
layer { name: "in" type: "Input" top: "data" top: "target"
  input_param { shape { dim: 3 dim: 2 dim: 5 dim: 5 } shape { dim: 3 dim: 4 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 }
    bias_filler { type: "uniform" min: -0.5 max: 0.5 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "xavier" }
    bias_filler { type: "constant" value: 0.1 } } }
layer { name: "sig" type: "Sigmoid" bottom: "ip" top: "sig" }
layer { name: "sum" type: "Eltwise" bottom: "ip" bottom: "sig" top: "sum" }
layer { name: "loss" type: "EuclideanLoss" bottom: "sum" bottom: "target" top: "loss"
  loss_weight: 0.5 }
layer { name: "aux" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "aux"
  loss_weight: 2 }
"""
with open("blobs.prototxt", "w") as f:
    f.write(BLOBS)
net = caffe.Net("blobs.prototxt", caffe.TEST)
print("blob names", list(net.blobs.keys()))
print("layer names", list(net._layer_names))
print("layer types", [layer.type for layer in net.layers])
print("inputs", net.inputs, "outputs", net.outputs)
print("loss weights", list(net.blob_loss_weights.items()))
print("tops", list(net.top_names.items()))
print("bottoms", list(net.bottom_names.items()))
print("params", [(k, [b.data.shape for b in v]) for k, v in net.params.items()])
rng = np.random.RandomState(3)
data = rng.normal(0, 1, (3, 2, 5, 5))
target = rng.normal(0, 1, (3, 4))
out = net.forward(data=data, target=target)
print("forward", sorted(out), float(out["loss"]), float(out["aux"]))
for name, blob in net.blobs.items():
    keep(f"blob_{name}", blob.data)
grads = net.backward()
print("backward returns", sorted(grads))
for name, blob in net.blobs.items():
    keep(f"diff_{name}", blob.diff)
for name, blobs in net.params.items():
    keep(f"param_diff_{name}", blobs[0].diff)
net.backward()
keep("param_diff_conv_twice", net.params["conv"][0].diff)
net.clear_param_diffs()
print("cleared", float(np.abs(net.params["ip"][0].diff).sum()))
net.backward(start="sum", end="ip")
keep("partial_backward_ip", net.blobs["ip"].diff)
keep("partial_backward_param", net.params["ip"][0].diff)
# a write into a blob is what the next layers read
net.blobs["conv"].data[...] = np.abs(net.blobs["conv"].data) + 0.25
part = net.forward(start="ip", end="sum", blobs=["sig"])
print("forward part", sorted(part))
keep("part_sum", part["sum"])
held = net.blobs["sig"].data  # a view: the next forward writes through it
net.params["ip"][0].data[...] = 0
net.params["ip"][1].data[...] = np.arange(4)
net.forward()
keep("surgery_sig", held)
print("held view follows", bool(np.allclose(held, 1 / (1 + np.exp(-np.arange(4))))))
# reshape: another batch (the images keep the size the inner product was made for)
net.blobs["data"].reshape(2, 2, 5, 5)
net.blobs["target"].reshape(2, 4)
net.reshape()
print("reshaped", [(k, v.data.shape) for k, v in net.blobs.items()])
net.blobs["data"].data[...] = rng.normal(0, 1, (2, 2, 5, 5))
net.blobs["target"].data[...] = 0
net.forward()
keep("reshaped_loss", net.blobs["loss"].data)
keep("reshaped_ip", net.blobs["ip"].data)
# forward_all pads the last batch (a net whose outputs have a batch axis)
DEPLOY = """
name: "deploy"
input: "data"
input_shape { dim: 3 dim: 2 dim: 5 dim: 5 }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "xavier" } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""
with open("deploy.prototxt", "w") as f:
    f.write(DEPLOY)
deploy = caffe.Net("deploy.prototxt", caffe.TEST)
all_out = deploy.forward_all(data=rng.normal(0, 1, (5, 2, 5, 5)), blobs=["ip"])
print("forward_all", sorted((k, v.shape) for k, v in all_out.items()))
keep("forward_all_ip", all_out["ip"])
keep("forward_all_prob", all_out["prob"])
# weights files
net.save("blobs.caffemodel")
again = caffe.Net("blobs.prototxt", caffe.TEST, weights="blobs.caffemodel")
print("reloaded", [bool(np.array_equal(a.data, b.data)) for k in net.params
                   for a, b in zip(net.params[k], again.params[k])])
older = caffe.Net("blobs.prototxt", "blobs.caffemodel", caffe.TEST)
fresh = caffe.Net("blobs.prototxt", caffe.TEST)
fresh.copy_from("blobs.caffemodel")
print("copied", bool(np.array_equal(older.params["conv"][0].data, fresh.params["conv"][0].data)))
shared = caffe.Net("blobs.prototxt", caffe.TEST)
shared.share_with(net)
net.params["conv"][1].data[...] = 7
print("shared", float(shared.params["conv"][1].data[0]))

# --- Classifier and Detector ------------------------------------------------------------------
from PIL import Image  # noqa: E402

SMALL = """
name: "small"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 2 dim: 3 dim: 8 dim: 8 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 2 kernel_size: 3 weight_filler { type: "gaussian" std: 0.05 } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 0.05 } } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }
"""
with open("small.prototxt", "w") as f:
    f.write(SMALL)
caffe.Net("small.prototxt", caffe.TEST).save("small.caffemodel")
Image.fromarray(rng.randint(0, 256, (20, 18, 3)).astype(np.uint8)).save("picture.png")
mean = np.array([0.2, 0.4, 0.6]) * 255
classifier = caffe.Classifier("small.prototxt", "small.caffemodel", image_dims=(11, 10),
                              mean=mean, raw_scale=255, channel_swap=(2, 1, 0))
picture = caffe.io.load_image("picture.png")
keep("classifier_oversampled", classifier.predict([picture, picture[::-1]]))
keep("classifier_center", classifier.predict([picture], oversample=False))
detector = caffe.Detector("small.prototxt", "small.caffemodel", mean=mean, raw_scale=255,
                          channel_swap=(2, 1, 0))
detections = detector.detect_windows([("picture.png", [np.array([0, 0, 10, 12]),
                                                        np.array([3, 4, 19, 17])])])
print("detections", [(d["filename"], list(d["window"])) for d in detections])
keep("detections", [d["prediction"] for d in detections])

# --- caffe.io and caffe_pb2 -------------------------------------------------------------------
array = rng.normal(0, 1, (2, 3, 4)).astype(np.float32)
blob = caffe.io.array_to_blobproto(array, diff=array * 2)
keep("io_blobproto", caffe.io.blobproto_to_array(blob))
keep("io_blobproto_diff", caffe.io.blobproto_to_array(blob, return_diff=True))
text = caffe.io.arraylist_to_blobprotovector_str([array, array[0]])
print("blobprotovector", len(text), [a.shape for a in
                                     caffe.io.blobprotovector_str_to_arraylist(text)])
datum = caffe.io.array_to_datum(array, 3)
print("datum", datum.channels, datum.height, datum.width, datum.label, len(datum.float_data))
keep("io_datum", caffe.io.datum_to_array(datum))
legacy = caffe_pb2.BlobProto(num=1, channels=2, height=1, width=2, data=[1, 2, 3, 4])
keep("io_legacy", caffe.io.blobproto_to_array(legacy))
transformer = caffe.io.Transformer({"data": (1, 3, 8, 6)})
transformer.set_transpose("data", (2, 0, 1))
transformer.set_channel_swap("data", (2, 1, 0))
transformer.set_raw_scale("data", 255.0)
transformer.set_mean("data", np.array([10.0, 20.0, 30.0]))
transformer.set_input_scale("data", 0.5)
image = rng.uniform(0, 1, (8, 6, 3)).astype(np.float32)
pre = transformer.preprocess("data", image)
keep("io_preprocess", pre)
keep("io_deprocess", transformer.deprocess("data", pre))
keep("io_resize", caffe.io.resize_image(image, (5, 9)))
keep("io_resize_4", caffe.io.resize_image(rng.uniform(0, 1, (6, 6, 4)), (9, 3)))
keep("io_oversample", caffe.io.oversample([image, image[::-1]], (4, 4)))
param = caffe_pb2.NetParameter()
text_format.Merge(BLOBS, param)
print("prototxt", param.name, len(param.layer), param.layer[1].convolution_param.num_output,
      param.layer[-1].loss_weight[0])
print(text_format.MessageToString(param.layer[1]).replace("\n", " | "))

# --- a solver ---------------------------------------------------------------------------------
def small_net(source, batch):
    n = caffe.NetSpec()
    n.data, n.label = L.Data(batch_size=batch, backend=P.Data.LMDB, source=source,
                             transform_param=dict(scale=1. / 255), ntop=2)
    n.ip1 = L.InnerProduct(n.data, num_output=20, weight_filler=dict(type="xavier"),
                           param=[dict(lr_mult=1), dict(lr_mult=2)])
    n.relu1 = L.ReLU(n.ip1, in_place=True)
    n.drop = L.Dropout(n.ip1, in_place=True, dropout_ratio=0.2)
    n.score = L.InnerProduct(n.ip1, num_output=10, weight_filler=dict(type="gaussian", std=0.1))
    n.loss = L.SoftmaxWithLoss(n.score, n.label)
    n.acc = L.Accuracy(n.score, n.label, include=dict(phase=caffe.TEST))
    return n.to_proto()


with open("train.prototxt", "w") as f:
    f.write(str(small_net("mnist/mnist_train_lmdb", 16)))
with open("test.prototxt", "w") as f:
    f.write(str(small_net("mnist/mnist_test_lmdb", 20)))
s = caffe_pb2.SolverParameter()
s.train_net = "train.prototxt"
s.test_net.append("test.prototxt")
s.test_iter.append(3)
s.test_interval = 4
s.base_lr = 0.05
s.momentum = 0.9
s.weight_decay = 0.001
s.lr_policy = "step"
s.gamma = 0.5
s.stepsize = 3
s.max_iter = 8
s.display = 0
s.snapshot_prefix = "snap/small"
s.random_seed = 31337
os.makedirs("snap", exist_ok=True)
with open("solver.prototxt", "w") as f:
    f.write(str(s))
solver = caffe.get_solver("solver.prototxt")
print("solver", type(solver).__name__, solver.iter, len(solver.test_nets))
print("solver blobs", list(solver.net.blobs.keys()), list(solver.test_nets[0].blobs.keys()))
keep("solver_init_ip1", solver.net.params["ip1"][0].data)
keep("solver_test_init_ip1", solver.test_nets[0].params["ip1"][0].data)
solver.test_nets[0].forward()
keep("test_before_first_test", solver.test_nets[0].blobs["score"].data)
before = solver.net.params["ip1"][0].data.copy()
solver.step(1)
print("after one step", solver.iter, float(solver.net.blobs["loss"].data))
keep("update_ip1", solver.net.params["ip1"][0].diff)
keep("step_matches", before - solver.net.params["ip1"][0].data)
keep("step1_score", solver.net.blobs["score"].data)
keep("step1_test_score", solver.test_nets[0].blobs["score"].data)
for k in range(4):
    solver.step(1)
    keep(f"loss_{k}", solver.net.blobs["loss"].data)
    solver.test_nets[0].forward()
    keep(f"test_acc_{k}", solver.test_nets[0].blobs["acc"].data)
solver.snapshot()
print("snapshots", sorted(os.listdir("snap")))
solver.step(2)
keep("final_ip1", solver.net.params["ip1"][0].data)
other = caffe.SGDSolver("solver.prototxt")
other.restore("snap/small_iter_5.solverstate")
print("restored", other.iter)
other.step(2)
keep("resumed_ip1", other.net.params["ip1"][0].data)
adam = caffe.AdamSolver("solver.prototxt")
adam.step(2)
keep("adam_ip1", adam.net.params["ip1"][0].data)

np.savez("api_arrays.npz", **arrays)
print("saved", len(arrays), "arrays")
