"""prototxt -> YAML: Caffe's own example files through caffe-py's loaders, legacy upgrades,
the YAML text itself, and the conversion errors with their prototxt positions."""
from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import pytest

from caffe_py.errors import SpecError
from caffe_py.spec import yamlio
from caffe_py.spec.net_spec import NetParameter, load_net
from caffe_py.spec.schema import to_dict
from caffe_py.spec.solver_spec import load_solver
from caffe_py.tools.prototxt import PrototxtError, parse, parse_file
from caffe_py.tools.to_yaml import V1_LAYER_TYPES, convert, detect_kind, import_file

FIXTURES = Path(__file__).parent / "fixtures"
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture
def caffe_root(tmp_path: Path) -> Path:
    """A Caffe checkout in miniature: the example files where Caffe keeps them."""
    for name, folder in (("lenet_train_test", "mnist"), ("lenet_solver", "mnist"),
                         ("lenet_v1", "mnist"), ("lenet_v1_deploy", "mnist"),
                         ("cifar10_quick_train_test", "cifar10")):
        (tmp_path / "examples" / folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(FIXTURES / f"{name}.prototxt", tmp_path / "examples" / folder)
    return tmp_path


def imported_net(root: Path, rel: str) -> NetParameter:
    out = root / "configs" / (Path(rel).stem + ".yaml")
    import_file(root / rel, out, root=root)
    return load_net(out)


def by_name(net: NetParameter) -> dict:
    return {(lp.name, lp.include[0].phase if lp.include else None): lp for lp in net.layer}


def test_lenet_fields(caffe_root):
    net = imported_net(caffe_root, "examples/mnist/lenet_train_test.prototxt")
    assert net.name == "LeNet"
    assert [lp.name for lp in net.layer] == ["mnist", "mnist", "conv1", "pool1", "conv2", "pool2",
                                             "ip1", "relu1", "ip2", "accuracy", "loss"]
    train, test = net.layer[0], net.layer[1]
    assert [r.phase for r in train.include] == ["TRAIN"] and train.top == ["data", "label"]
    assert [r.phase for r in test.include] == ["TEST"]
    assert train.params["transform_param"].scale == 0.00390625
    data = train.params["data_param"]
    assert (data.batch_size, data.backend) == (64, "LMDB")
    assert data.source == str(caffe_root / "examples/mnist/mnist_train_lmdb")  # Caffe's cwd
    assert test.params["data_param"].batch_size == 100
    conv1 = net.layer[2]
    conv = conv1.params["convolution_param"]
    assert (conv.kernel_size, conv.num_output, conv.stride) == ([5], 20, [1])
    assert (conv.weight_filler.type, conv.bias_filler.type) == ("xavier", "constant")
    assert [(p.lr_mult, p.decay_mult) for p in conv1.param] == [(1, 1), (2, 1)]
    assert conv1.bottom == ["data"] and conv1.top == ["conv1"]
    pool = net.layer[3].params["pooling_param"]
    assert (pool.pool, pool.kernel_size, pool.stride) == ("MAX", 2, 2)
    assert net.layer[6].params["inner_product_param"].num_output == 500
    assert net.layer[9].bottom == ["ip2", "label"]


def _structure(net: NetParameter) -> list[dict]:
    """Every layer as plain data, with its type's blocks, minus the data sources."""
    out = []
    for lp in net.layer:
        params = {k: to_dict(v) for k, v in lp.params.items()}
        if "data_param" in params:
            params["data_param"]["source"] = None
        out.append({**to_dict(lp), "params": params})
    return out


def test_lenet_matches_the_shipped_config(caffe_root):
    shipped = CONFIGS / "lenet.yaml"
    if not shipped.exists():
        pytest.skip("configs/lenet.yaml is not in this checkout")
    net = imported_net(caffe_root, "examples/mnist/lenet_train_test.prototxt")
    reference = load_net(shipped)
    assert net.name == reference.name
    assert _structure(net) == _structure(reference)


def test_cifar10_quick_fields_and_shipped_config(caffe_root):
    net = imported_net(caffe_root, "examples/cifar10/cifar10_quick_train_test.prototxt")
    layers = by_name(net)
    assert len(net.layer) == 15
    conv1 = layers["conv1", None].params["convolution_param"]
    assert (conv1.num_output, conv1.pad, conv1.kernel_size) == (32, [2], [5])
    assert (conv1.weight_filler.type, conv1.weight_filler.std) == ("gaussian", 0.0001)
    assert layers["pool2", None].params["pooling_param"].pool == "AVE"
    assert layers["ip1", None].params["inner_product_param"].weight_filler.std == 0.1
    mean = layers["cifar", "TRAIN"].params["transform_param"].mean_file
    assert mean == str(caffe_root / "examples/cifar10/mean.binaryproto")
    shipped = CONFIGS / "cifar10_quick.yaml"
    if shipped.exists():
        def no_paths(n: NetParameter) -> list[dict]:
            rows = _structure(n)
            for row in rows:
                if "transform_param" in row["params"]:
                    row["params"]["transform_param"]["mean_file"] = None
            return rows
        assert no_paths(net) == no_paths(load_net(shipped))


def test_lenet_solver(caffe_root):
    out = caffe_root / "configs" / "lenet_solver.yaml"
    report = import_file(caffe_root / "examples/mnist/lenet_solver.prototxt", out,
                         root=caffe_root)
    assert report.kind == "solver"
    assert report.summary == "solver SGD, lr_policy inv, max_iter 10000"
    solver = load_solver(out)
    assert (solver.base_lr, solver.momentum, solver.weight_decay) == (0.01, 0.9, 0.0005)
    assert (solver.lr_policy, solver.gamma, solver.power) == ("inv", 0.0001, 0.75)
    assert (solver.test_iter, solver.test_interval, solver.max_iter) == ([100], 500, 10000)
    assert (solver.display, solver.snapshot, solver.solver_mode) == (100, 5000, "GPU")
    assert solver.net == str(caffe_root / "configs" / "lenet_train_test.yaml")
    assert solver.snapshot_prefix == str(caffe_root / "examples/mnist/lenet")
    text = out.read_text()
    assert "net: lenet_train_test.yaml\n" in text
    assert "snapshot_prefix: ../examples/mnist/lenet\n" in text
    assert "# The train/test net protocol buffer definition\nnet:" in text
    assert len(report.notes) == 2 and report.notes[0].startswith(
        "net: examples/mnist/lenet_train_test.prototxt is now lenet_train_test.yaml; import it "
        "too: cpy import-prototxt ")
    assert report.notes[0].endswith("lenet_train_test.yaml")


def test_v1_net_is_upgraded_as_caffe_does(caffe_root):
    text = convert(parse_file(FIXTURES / "lenet_v1.prototxt"), "net",
                   source="lenet_v1.prototxt").text
    assert "layers" not in text.replace("'layers'", "")
    net = imported_net(caffe_root, "examples/mnist/lenet_v1.prototxt")
    assert [lp.type for lp in net.layer] == ["Data", "Data", "Convolution", "Pooling",
                                             "InnerProduct", "ReLU", "InnerProduct", "Accuracy",
                                             "SoftmaxWithLoss"]
    layers = by_name(net)
    conv1 = layers["conv1", None]
    assert conv1.params["convolution_param"].kernel_size == [5]
    assert conv1.params["convolution_param"].num_output == 20
    assert [(p.lr_mult, p.decay_mult) for p in conv1.param] == [(1, 1), (2, 1)]
    ip1 = layers["ip1", None]
    assert [(p.lr_mult, p.decay_mult) for p in ip1.param] == [(1, 1), (2, 0)]
    train = layers["mnist", "TRAIN"]
    # UpgradeNetDataTransformation: data_param.scale moved into transform_param
    assert train.params["transform_param"].scale == 0.00390625
    assert train.params["data_param"].scale == 1.0
    assert [r.phase for r in layers["accuracy", "TEST"].include] == ["TEST"]
    assert layers["pool1", None].params["pooling_param"].pool == "MAX"


def test_v1_deploy_inputs_become_input_shape_and_the_net_runs(caffe_root):
    import torch

    from caffe_py.net import Net

    net_spec = imported_net(caffe_root, "examples/mnist/lenet_v1_deploy.prototxt")
    assert net_spec.input == ["data"]
    assert [s.dim for s in net_spec.input_shape] == [[64, 1, 28, 28]]
    assert net_spec.input_dim == []
    torch.manual_seed(0)
    net = Net(net_spec, "TEST")
    assert net.blobs["prob"] == (64, 10)
    prob = net({"data": torch.rand(64, 1, 28, 28)}).outputs["prob"]
    assert torch.allclose(prob.sum(dim=1), torch.ones(64))


def test_yaml_text_follows_the_prototxt_line_for_line():
    text = '''# my net
name: "tiny"  # a name
input: "data"
input_shape { dim: 1 dim: 3 dim: 8 dim: 8 }
layer {
  name: "conv"   # the conv
  type: "Convolution"
  bottom: "data" top: "conv"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  convolution_param { num_output: 4 kernel_size: 3 bias_term: f
    weight_filler { type: "gaussian" std: 1e-8 } }
  # after the block
}
layer { name: "yes" type: "Dropout" bottom: "conv" top: "conv" }
layer {
  name: "odd: name" type: "ReLU" bottom: "conv" top: "true"
  relu_param { negative_slope: -inf }
}
'''
    conv = convert(parse(text, "tiny.prototxt"), "net", source="tiny.prototxt")
    assert conv.text == '''# Imported from tiny.prototxt by cpy import-prototxt.
# my net
name: tiny  # a name
input: data
input_shape: [{dim: [1, 3, 8, 8]}]
layer:
  - name: conv  # the conv
    type: Convolution
    bottom: data
    top: conv
    param: [{lr_mult: 1, decay_mult: 1}, {lr_mult: 2, decay_mult: 0}]
    convolution_param:
      num_output: 4
      kernel_size: 3
      bias_term: false
      weight_filler: {type: gaussian, std: 1.0e-08}
    # after the block
  - {name: "yes", type: Dropout, bottom: conv, top: conv}
  - name: "odd: name"
    type: ReLU
    bottom: conv
    top: "true"
    relu_param: {negative_slope: -.inf}
'''
    assert conv.source_line(14) == 10 and conv.source_line(18) == 14
    loaded = yamlio.loads(conv.text)
    assert loaded["layer"][1]["name"] == "yes" and loaded["layer"][2]["top"] == "true"
    assert loaded["layer"][0]["convolution_param"]["weight_filler"]["std"] == 1e-08
    relu = loaded["layer"][2]["relu_param"]["negative_slope"]
    assert math.isinf(relu) and relu < 0


@pytest.mark.parametrize("value", ["null", "1", "1e-4", "yes", "on", "~", "a: b", "x # y",
                                   "-lead", "[x]", "tab\there", "é", " pad", "C:\\dir"])
def test_strings_load_back_as_the_same_string(value):
    conv = convert(parse(f"name: {_quote(value)}\nlayer {{ name: 'a' type: 'ReLU' }}"), "net",
                   source="s")
    assert yamlio.loads(conv.text)["name"] == value


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\t", "\\t") + '"'


def test_repeated_scalars_become_lists_and_single_ones_stay_scalars():
    conv = convert(parse('layer { name: "c" type: "Convolution" bottom: "a" bottom: "b" '
                         'top: "c" convolution_param { kernel_size: 3 kernel_size: 5 '
                         'num_output: 1 } include { phase: TEST } }'), "net", source="s")
    layer = yamlio.loads(conv.text)["layer"][0]
    assert layer["bottom"] == ["a", "b"] and layer["top"] == "c"
    assert layer["convolution_param"]["kernel_size"] == [3, 5]
    assert layer["include"] == [{"phase": "TEST"}]


def test_paths_are_rewritten_from_caffes_directory_to_the_output(tmp_path):
    msg = parse('layer { name: "d" type: "Data" top: "x" data_param { source: "a/db" '
                'batch_size: 1 backend: LMDB } transform_param { mean_file: '
                '"/abs/mean.binaryproto" } }')
    moved = convert(msg, "net", source="s", root=tmp_path, out=tmp_path / "cfg" / "n.yaml")
    layer = yamlio.loads(moved.text)["layer"][0]
    assert layer["data_param"]["source"] == "../a/db"
    assert layer["transform_param"]["mean_file"] == "/abs/mean.binaryproto"
    assert moved.notes == [f"relative paths were rewritten from {tmp_path} (where Caffe ran; "
                           f"--caffe-root) to be relative to {tmp_path / 'cfg'}"]
    same = convert(msg, "net", source="s", root=tmp_path, out=tmp_path / "n.yaml")
    assert yamlio.loads(same.text)["layer"][0]["data_param"]["source"] == "a/db"
    assert same.notes == []


def test_solver_type_enum_is_upgraded():
    conv = convert(parse('net: "n.prototxt" base_lr: 0.1 solver_type: NESTEROV momentum: 0.9'),
                   "solver", source="s")
    loaded = yamlio.loads(conv.text)
    assert list(loaded) == ["net", "base_lr", "type", "momentum"]
    assert loaded["type"] == "Nesterov" and loaded["net"] == "n.yaml"


def test_enums_written_as_numbers_are_read_as_caffe_reads_them():
    """protobuf's text format takes an enum's number: Caffe reads `operation: 1` as SUM, a V1
    `type: 4` as CONVOLUTION and `solver_type: 1` as NESTEROV."""
    conv = convert(parse('net: "n.prototxt" base_lr: 0.1 solver_type: 1 momentum: 0.9'),
                   "solver", source="s")
    assert yamlio.loads(conv.text)["type"] == "Nesterov"
    v1 = convert(parse('layers { name: "c" type: 4 bottom: "x" top: "c" }'), "net",
                 source="s")
    assert yamlio.loads(v1.text)["layer"][0]["type"] == "Convolution"
    net = convert(parse('layer { name: "c" type: "Input" top: "c" } '
                        'layer { name: "e" type: "Eltwise" bottom: "c" bottom: "c" top: "e" '
                        'eltwise_param { operation: 1 } }'), "net", source="s")
    spec = load_net_text(net.text)
    assert spec.layer[1].params["eltwise_param"].operation == "SUM"


def load_net_text(text: str) -> NetParameter:
    from caffe_py.spec.net_spec import parse_net
    from caffe_py.spec.schema import Source

    return parse_net(yamlio.loads(text), Source())


def test_inline_solver_nets_are_converted_as_nets():
    conv = convert(parse('base_lr: 0.1 net_param { name: "inline" layers { name: "r" '
                         'type: RELU bottom: "x" top: "x" } }'), "solver", source="s")
    net = yamlio.loads(conv.text)["net_param"]
    assert net == {"name": "inline", "layer": [{"name": "r", "type": "ReLU", "bottom": "x",
                                                "top": "x"}]}


def test_detect_kind():
    assert detect_kind(parse("layer { name: 'a' }"), "s") == "net"
    assert detect_kind(parse("layers { name: 'a' }"), "s") == "net"
    assert detect_kind(parse("base_lr: 0.1"), "s") == "solver"
    assert detect_kind(parse("train_net: 'x'"), "s") == "solver"
    with pytest.raises(SpecError) as info:
        detect_kind(parse("name: 'x'"), "x.prototxt")
    assert str(info.value) == ("x.prototxt: cannot tell whether this is a net or a solver: it "
                               "has no 'layer'/'layers' and no 'base_lr'/'net'/'train_net'; pass "
                               "--kind net or --kind solver")


@pytest.mark.parametrize("kind, text, message", [
    ("net", 'layer { name: "a" type: "ReLU" }\nlayers { name: "b" type: RELU }',
     "n.prototxt:2:1: the net has both 'layer' (current) and 'layers' (V1) blocks; Caffe "
     "refuses to upgrade it too; write every layer as 'layer { ... }'"),
    ("net", 'layers {\n  type: CONVOLUTON\n}',
     "n.prototxt:2:3: unknown V1 layer type 'CONVOLUTON'; did you mean CONVOLUTION? V1 types: "
     + ", ".join(sorted(t for t in V1_LAYER_TYPES if t != "NONE"))),
    ("net", 'layers { layer { type: "convolution" } }',
     "n.prototxt:1:18: unknown V0 layer type 'convolution'; V0 types: accuracy, bnll, concat, "
     "conv, data, dropout, euclidean_loss, flatten, hdf5_data, hdf5_output, im2col, images, "
     "infogain_loss, innerproduct, lrn, multinomial_logistic_loss, pool, relu, sigmoid, "
     "softmax, softmax_loss, split, tanh, window_data, padding"),
    ("net", 'input: "data"\ninput_dim: 1\ninput_dim: 2',
     "n.prototxt:2:1: 2 input_dim values for 1 input(s); Caffe takes 4 (N, C, H, W) per input; "
     "give 4 input_dim values per input"),
    ("net", 'layer { name: "c" type: "Convolution"\n  convolution_param { num_output: 1\n'
            '    num_output: 2 } }',
     "n.prototxt:3:5: 'num_output' is given 2 times (first at line 2) but it is not a repeated "
     "field; keep one of them"),
    ("solver", 'base_lr: 0.1\ntype: "SGD"\nsolver_type: ADAM',
     "n.prototxt:3:1: both solver_type (the old enum) and type are given; Caffe refuses this "
     "too; keep type"),
    ("solver", "solver_type: FAST",
     "n.prototxt:1:1: unknown solver_type 'FAST'; use one of SGD, NESTEROV, ADAGRAD, RMSPROP, "
     "ADADELTA, ADAM"),
])
def test_conversion_errors_point_into_the_prototxt(kind, text, message):
    with pytest.raises(PrototxtError) as info:
        convert(parse(text, "n.prototxt"), kind, source="n.prototxt")
    assert str(info.value) == message


def test_a_spec_that_does_not_load_names_both_files(tmp_path):
    src = tmp_path / "bad.prototxt"
    src.write_text('name: "bad"\nlayer {\n  name: "c"\n  type: "Convolution"\n'
                   '  convolution_param {\n    num_output: 2\n    kernel_sise: 3\n  }\n}\n')
    out = tmp_path / "bad.yaml"
    with pytest.raises(SpecError) as info:
        import_file(src, out, root=tmp_path)
    assert str(info.value) == (
        f"{out}:8: layer[0].convolution_param.kernel_sise: unknown key 'kernel_sise' in "
        f"ConvolutionParameter; did you mean 'kernel_size'?; it comes from {src}:7; {out} was "
        "written, so fix it there (or fix the prototxt and import again)")
    assert out.read_text().splitlines()[7] == "      kernel_sise: 3"


def test_output_may_not_overwrite_the_input(tmp_path):
    src = tmp_path / "n.prototxt"
    src.write_text("layer { name: 'a' type: 'ReLU' }")
    with pytest.raises(SpecError) as info:
        import_file(src, src)
    assert str(info.value) == (f"{src}: the output would overwrite the input; name a .yaml file "
                               "as OUT")
    assert src.read_text() == "layer { name: 'a' type: 'ReLU' }"


def test_conversion_leaves_the_parsed_message_alone():
    msg = parse_file(FIXTURES / "lenet_v1.prototxt")
    before = dataclasses.replace(msg, fields=list(msg.fields))
    convert(msg, "net", source="s")
    assert [f.name for f in msg.fields] == [f.name for f in before.fields]
    assert msg.all("layers")[2].value.first("blobs_lr").value == 1


def _random_tree(rng, depth: int) -> list[tuple[str, object]]:
    """(key, value) pairs; a value is a scalar or a nested list of pairs; keys may repeat."""
    pairs = []
    for _ in range(rng.randint(0, 4)):
        key = f"k{rng.randint(0, 3)}"
        kind = rng.choice(["int", "float", "str", "bool", "block"] if depth else
                          ["int", "float", "str", "bool"])
        if kind == "int":
            value = rng.randint(-10**6, 10**6)
        elif kind == "float":
            value = rng.choice([rng.uniform(-1e3, 1e3), 10.0 ** rng.randint(-12, 12), -0.0])
        elif kind == "str":
            value = "".join(rng.choice("ab :#'\"\\\t-[]{}é1") for _ in range(rng.randint(0, 6)))
        elif kind == "bool":
            value = rng.random() < 0.5
        else:
            value = _random_tree(rng, depth - 1)
        pairs.append((key, value))
    return pairs


def _prototxt(pairs, rng) -> str:
    out = []
    for key, value in pairs:
        if isinstance(value, list):
            out.append(f"{key} {{\n{_prototxt(value, rng)}}}" if rng.random() < 0.5
                       else f"{key} < {_prototxt(value, rng)} >")
        elif isinstance(value, bool):
            out.append(f"{key}: {'true' if value else 'false'}")
        elif isinstance(value, str):
            out.append(f"{key}: {_quote(value)}  # c")
        else:
            out.append(f"{key}: {value!r}")
    return "\n".join(out) + "\n"


def _expected(pairs):
    """What the YAML must load as: repeated keys grouped into lists at their first place."""
    out: dict = {}
    for key, value in pairs:
        value = _expected(value) if isinstance(value, list) else value
        out.setdefault(key, []).append(value)
    return {k: v[0] if len(v) == 1 else v for k, v in out.items()}


def test_random_trees_load_back_as_written():
    import random

    rng = random.Random(1701)
    for _ in range(150):
        pairs = [("layer", [("name", "x"), ("type", "ReLU")])] + _random_tree(rng, 3)
        text = _prototxt(pairs, rng)
        loaded = yamlio.loads(convert(parse(text), "net", source="r").text)
        expected = _expected(pairs)
        expected["layer"] = [expected["layer"]]
        assert loaded == expected, text


def test_a_data_layer_without_backend_reads_leveldb_as_in_caffe():
    msg = parse('layer { name: "d" type: "Data" top: "x" data_param { source: "db" '
                'batch_size: 1 } }\n'
                'layer { name: "e" type: "Data" top: "y" data_param { source: "db2" '
                'batch_size: 1 backend: LMDB } }')
    conv = convert(msg, "net", source="s")
    layers = yamlio.loads(conv.text)["layer"]
    assert [layer["data_param"]["backend"] for layer in layers] == ["LEVELDB", "LMDB"]
    assert "backend: LEVELDB  # Caffe's default: the prototxt gives no backend" in conv.text
    assert conv.notes == ["a Data layer's data_param gives no backend, so Caffe reads LEVELDB "
                          "(caffe.proto's default); the YAML says backend: LEVELDB (write LMDB "
                          "there if the database is an LMDB)"]


def test_deconvnets_v1_unpooling_is_segnets_upsample():
    from caffe_py.net import Net

    text = ('input: "data" input_dim: 1 input_dim: 2 input_dim: 6 input_dim: 6 '
            'layers { name: "pool" type: POOLING bottom: "data" top: "pool" top: "pool_mask" '
            'pooling_param { pool: MAX kernel_size: 2 stride: 2 } } '
            'layers { name: "bn" type: BN bottom: "pool" top: "pool" '
            'bn_param { scale_filler { type: "constant" value: 1 } } } '
            'layers { name: "unpool" type: UNPOOLING bottom: "pool" bottom: "pool_mask" '
            'top: "unpool" unpooling_param { unpool: MAX kernel_size: 2 stride: 2 '
            'unpool_size: 6 } }')
    conv = convert(parse(text), "net", source="s")
    layers = yamlio.loads(conv.text)["layer"]
    assert [layer["type"] for layer in layers[-2:]] == ["BN", "Upsample"]
    assert layers[-1]["upsample_param"] == {"upsample_h": 6, "upsample_w": 6}
    net = Net(load_net_text(conv.text), "TEST")
    assert net.blobs["unpool"] == (1, 2, 6, 6)
    with pytest.raises(PrototxtError, match="unpool: AVE has no caffe-py form"):
        convert(parse(text.replace("unpool: MAX", "unpool: AVE")), "net", source="s")
