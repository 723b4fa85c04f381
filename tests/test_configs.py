"""The shipped net configs: they build, with Caffe's shapes and parameter counts."""
from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import torch
from support import load_script, write_db

from caffe_py.io.formats.datum import Datum
from caffe_py.net import Net
from caffe_py.spec import yamlio
from caffe_py.spec.net_spec import load_net
from caffe_py.tools.mean import compute_mean

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def generator():
    return load_script(CONFIGS / "make_resnet50.py")


def write_shaped_db(path: Path, shape: tuple[int, int, int], n: int = 4) -> None:
    size = shape[0] * shape[1] * shape[2]
    write_db(path, [Datum(*shape, data=bytes((i * 7 + j) % 256 for j in range(size)),
                          label=i % 10) for i in range(n)])


def copy_config(name: str, root: Path) -> Path:
    """The config inside ``root/configs`` so that its ../data paths land in ``root/data``."""
    (root / "configs").mkdir(exist_ok=True)
    return Path(shutil.copy(CONFIGS / name, root / "configs" / name))


def rows(net: Net) -> list[tuple[str, list[tuple[int, ...]], int]]:
    return [(r.name, [shape for _, shape in r.tops], r.params) for r in net.summary()]


def test_resnet50_files_are_the_generators_output():
    make = generator()
    for filename, dummy in make.OUTPUTS.items():
        assert (CONFIGS / filename).read_text() == make.render(dummy), \
            f"{filename} is stale: run python configs/make_resnet50.py"


def test_resnet50_layer_counts():
    layers = yamlio.load(CONFIGS / "resnet50.yaml")["layer"]
    assert Counter(lp["type"] for lp in layers) == {
        "Convolution": 53, "BatchNorm": 53, "Scale": 53, "ReLU": 49, "Eltwise": 16,
        "Pooling": 2, "InnerProduct": 1, "Data": 2, "SoftmaxWithLoss": 1, "Accuracy": 2}
    dummy = yamlio.load(CONFIGS / "resnet50_dummy.yaml")["layer"]
    assert dummy[1:] == layers[2:]
    assert dummy[0]["dummy_data_param"]["shape"] == [{"dim": [256, 3, 224, 224]}, {"dim": [256]}]


def test_lenet_reads_fashion_mnist_next_to_the_repository():
    spec = load_net(CONFIGS / "lenet.yaml")
    sources = [lp.params["data_param"].source for lp in spec.layer[:2]]
    data = CONFIGS.parent / "data" / "fashion_mnist"
    assert sources == [str(data / "train_lmdb"), str(data / "test_lmdb")]


def test_lenet_shapes_and_parameters(tmp_path):
    config = copy_config("lenet.yaml", tmp_path)
    for split in ("train", "test"):
        write_shaped_db(tmp_path / "data" / "fashion_mnist" / f"{split}_lmdb", (1, 28, 28))
    train = Net(load_net(config), "TRAIN")
    assert rows(train) == [
        ("mnist", [(64, 1, 28, 28), (64,)], 0),
        ("conv1", [(64, 20, 24, 24)], 520),
        ("pool1", [(64, 20, 12, 12)], 0),
        ("conv2", [(64, 50, 8, 8)], 25050),
        ("pool2", [(64, 50, 4, 4)], 0),
        ("ip1", [(64, 500)], 400500),
        ("relu1", [(64, 500)], 0),
        ("ip2", [(64, 10)], 5010),
        ("loss", [()], 0)]
    assert [(p.name, p.lr_mult) for p in train.learnable_params()] == [
        ("conv1/0", 1.0), ("conv1/1", 2.0), ("conv2/0", 1.0), ("conv2/1", 2.0),
        ("ip1/0", 1.0), ("ip1/1", 2.0), ("ip2/0", 1.0), ("ip2/1", 2.0)]
    assert train.output_names == ["loss"] and [layer.name for layer in train.data_layers()] == \
        ["mnist"]
    test = Net(load_net(config), "TEST")
    assert test.blobs["data"] == (100, 1, 28, 28) and test.output_names == ["accuracy", "loss"]
    assert test.share_weights_with(train) == ["conv1", "conv2", "ip1", "ip2"]


def test_cifar10_quick_shapes_and_parameters(tmp_path):
    config = copy_config("cifar10_quick.yaml", tmp_path)
    data = tmp_path / "data" / "cifar10"
    for split in ("train", "test"):
        write_shaped_db(data / f"cifar10_{split}_lmdb", (3, 32, 32))
    compute_mean(data / "cifar10_train_lmdb", data / "mean.binaryproto")
    net = Net(load_net(config), "TEST")
    assert [(name, shapes[0], n) for name, shapes, n in rows(net)[1:]] == [
        ("conv1", (100, 32, 32, 32), 2432),
        ("pool1", (100, 32, 16, 16), 0),
        ("relu1", (100, 32, 16, 16), 0),
        ("conv2", (100, 32, 16, 16), 25632),
        ("relu2", (100, 32, 16, 16), 0),
        ("pool2", (100, 32, 8, 8), 0),
        ("conv3", (100, 64, 8, 8), 51264),
        ("relu3", (100, 64, 8, 8), 0),
        ("pool3", (100, 64, 4, 4), 0),
        ("ip1", (100, 64), 65600),
        ("ip2", (100, 10), 650),
        ("accuracy", (), 0),
        ("loss", (), 0)]


def test_resnet50_dummy_builds_with_the_published_parameter_count():
    spec = load_net(CONFIGS / "resnet50_dummy.yaml")
    net = Net(spec, "TEST")
    assert sum(r.params for r in net.summary()) == 25_557_032
    assert net.blobs["pool5"] == (256, 2048, 1, 1) and net.blobs["fc1000"] == (256, 1000)
    assert net.blobs["res3a"] == (256, 512, 28, 28) and net.blobs["res5c"] == (256, 2048, 7, 7)
    assert net.output_names == ["accuracy", "accuracy_top5", "loss"]  # by name, as Caffe
    frozen = [p.name for p in net.learnable_params() if p.lr_mult == 0]
    assert frozen == []  # BatchNorm's statistics are buffers, never learnable params


def test_resnet50_wiring_trains_one_step_at_a_sixteenth_of_the_width():
    # Full width takes ~15 s on two cores; the wiring (in-place BatchNorm/Scale/ReLU, the
    # shortcuts, the Eltwise sums, the 7x7 pool) is the same at 1/16 of the channels.
    spec = load_net(CONFIGS / "resnet50_dummy.yaml")
    for shape in spec.layer[0].params["dummy_data_param"].shape:
        shape.dim[0] = 2
    for lp in spec.layer:
        if lp.type == "Convolution":
            lp.params["convolution_param"].num_output //= 16
    net = Net(spec, "TRAIN")
    assert net.blobs["res5c"] == (2, 128, 7, 7) and net.blobs["fc1000"] == (2, 1000)
    loss = net().loss
    # the labels are 0 and fc1000 starts near 0: the loss is close to log(1000)
    assert abs(loss.item() - 6.9078) < 0.5
    loss.backward()
    grads = [p.param.grad for p in net.learnable_params()]
    assert len(grads) == 53 + 2 * 53 + 2
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_cpy_net_prints_the_layer_table(tmp_path):
    from click.testing import CliRunner

    from caffe_py.cli import cli

    config = copy_config("lenet.yaml", tmp_path)
    for split in ("train", "test"):
        write_shaped_db(tmp_path / "data" / "fashion_mnist" / f"{split}_lmdb", (1, 28, 28))
    result = CliRunner().invoke(cli, ["net", str(config), "--phase", "TEST", "--stage", "s",
                                      "--level", "2"])
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout.splitlines() == [
        "net 'LeNet' (TEST, stage s, level 2)",
        "layer     type             top shapes                params",
        "mnist     Data             data [100, 1, 28, 28]          0",
        "                           label [100]",
        "conv1     Convolution      conv1 [100, 20, 24, 24]      520",
        "pool1     Pooling          pool1 [100, 20, 12, 12]        0",
        "conv2     Convolution      conv2 [100, 50, 8, 8]     25,050",
        "pool2     Pooling          pool2 [100, 50, 4, 4]          0",
        "ip1       InnerProduct     ip1 [100, 500]           400,500",
        "relu1     ReLU             ip1 [100, 500]                 0",
        "ip2       InnerProduct     ip2 [100, 10]              5,010",
        "accuracy  Accuracy         accuracy []                    0",
        "loss      SoftmaxWithLoss  loss []                        0",
        "10 layers, 431,080 learnable parameters (1.64 MiB as float32)",
        "inputs: none; outputs: accuracy, loss; loss: 1 * loss"]
