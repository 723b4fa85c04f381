"""V0 nets (2014's `layers { layer { ... } }`) upgrade as Caffe's upgrade_net_proto_text does."""
from __future__ import annotations

from pathlib import Path

import pytest

from caffe_py.spec import yamlio
from caffe_py.spec.net_spec import load_net
from caffe_py.tools.prototxt import PrototxtError, parse, parse_file
from caffe_py.tools.to_yaml import convert, import_file

FIXTURES = Path(__file__).parent / "fixtures" / "v0"


def layers_of(path: Path) -> list[dict]:
    """The layers the importer makes of a prototxt (an Input layer of Caffe's input upgrade
    left out: caffe-py keeps the net's input fields)."""
    text = convert(parse_file(path), "net", source=str(path)).text
    return [lp for lp in yamlio.loads(text)["layer"] if lp["type"] != "Input"]


@pytest.mark.parametrize("name", ["imagenet", "allparams", "twotops"])
def test_v0_nets_upgrade_to_what_caffes_tool_writes(name):
    """Caffe's own V0 test nets, against the output of its upgrade_net_proto_text."""
    assert layers_of(FIXTURES / f"{name}_v0.prototxt") == \
        layers_of(FIXTURES / f"{name}_v2.prototxt")


def test_padding_layers_fold_into_the_convolution_they_feed():
    conv = convert(parse_file(FIXTURES / "twotops_v0.prototxt"), "net", source="t")
    layers = yamlio.loads(conv.text)["layer"]
    assert [lp["name"] for lp in layers] == ["data", "conv1", "fc8", "conv2", "loss"]
    for conv_layer in (layers[1], layers[3]):  # both read the padding layer's top
        assert conv_layer["bottom"] == "data" and conv_layer["convolution_param"]["pad"] == 2
    assert conv.notes == [
        "upgraded a V0 net of 5 layers (the 2014 'layers { layer { ... } }' form) to V1 as "
        "Caffe's UpgradeV0Net, folding 1 padding layer(s) into the layers they feed",
        "upgraded 5 V1 'layers' blocks to 'layer' (as Caffe's UpgradeV1Net)",
        "a Data layer's data_param gives no backend, so Caffe reads LEVELDB (caffe.proto's "
        "default); the YAML says backend: LEVELDB (write LMDB there if the database is an "
        "LMDB)"]


def test_the_imagenet_v0_net_imports_and_loads(tmp_path):
    out = tmp_path / "imagenet.yaml"
    import_file(FIXTURES / "imagenet_v0.prototxt", out, root=tmp_path)
    net = load_net(out)
    assert len(net.layer) == 24 and net.layer[0].params["transform_param"].crop_size == 227
    pool = net.layer[3].params["pooling_param"]
    assert (net.layer[3].type, pool.pool, pool.kernel_size, pool.stride) == \
        ("Pooling", "MAX", 3, 2)


def test_fields_that_do_not_apply_are_dropped_with_a_note():
    conv = convert(parse('name: "n"\nstate { phase: TRAIN }\nlayers {\n  layer {\n'
                         '    name: "r" type: "relu" num_output: 3\n    new_num: 2\n  }\n'
                         '  bottom: "x" top: "y"\n}\ninput: "x"'), "net", source="n")
    assert yamlio.loads(conv.text) == {"name": "n", "layer": [
        {"name": "r", "type": "ReLU", "bottom": "x", "top": "y"}], "input": "x"}
    assert conv.notes[:3] == [
        "line 5: V0 field 'num_output' does not apply to a 'relu' layer; dropped, as Caffe's "
        "upgrade drops it",
        "line 6: V0 field 'new_num' has no V1 equivalent; dropped, as Caffe's upgrade drops it",
        "line 2: 'state' is not part of a V0 net; dropped, as Caffe's UpgradeV0Net drops it"]


@pytest.mark.parametrize("text, message", [
    ('layers { layer { name: "c" type: "conv" } bottom: "nowhere" }',
     "n.prototxt:1:43: Unknown bottom blob 'nowhere' (bottom index 0): no net input or "
     "earlier layer makes it; name a net input or a top of an earlier layer"),
    ('input: "x"\nlayers { layer { type: "padding" pad: 1 } bottom: "x" top: "p" }\n'
     'layers { layer { type: "relu" } bottom: "p" top: "r" }',
     "n.prototxt:3:33: a padding layer feeds a relu layer with 1 bottom(s); Caffe folds "
     "padding only into a conv or pool layer with one bottom"),
    ('layers { layer { name: "a" } }\nlayers { name: "b" }',
     "n.prototxt:2:1: a 'layers' block without a 'layer' block in a V0 net; write every layer "
     "of a V0 net as 'layers { layer { ... } bottom top }'"),
    ('layers { layer { name: "a" type: "conv" kernel: 3 } }',
     "n.prototxt:1:41: unknown V0 layer field 'kernel'"),
    ('layers: 3\nlayers { layer { name: "a" type: "conv" } }',
     "n.prototxt:1:1: a 'layers' block without a 'layer' block in a V0 net; write every layer "
     "of a V0 net as 'layers { layer { ... } bottom top }'"),
])
def test_v0_errors_point_into_the_prototxt(text, message):
    with pytest.raises(PrototxtError) as info:
        convert(parse(text, "n.prototxt"), "net", source="n.prototxt")
    assert str(info.value) == message
