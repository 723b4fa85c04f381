"""Caffe's lenient rules in Net::Init: a loss layer's automatic top, layers sharing a name,
the net-level state and the order of the outputs (toy layers from conftest)."""
from __future__ import annotations

import logging

import pytest
import torch

from caffe_py.errors import NetError
from caffe_py.net import Net
from caffe_py.spec.net_spec import NetState, merge_states

pytestmark = pytest.mark.usefixtures("toy_layers")

AUTO = """
name: auto
input: data
input_shape: {dim: [2, 3]}
layer:
  - {name: s, type: ToyScale, bottom: data, top: s, toy_param: {value: 2}}
  - {name: loss, type: ToyLoss, bottom: s}
  - {name: loss2, type: ToyLoss, bottom: s, loss_weight: 0.5}
"""


def test_a_loss_layer_without_top_gets_an_automatic_one(spec_of):
    net = Net(spec_of(AUTO))
    assert [layer.spec.top for layer in net.layers[2:]] == [["(automatic)"], ["(automatic)#2"]]
    assert net.blobs["(automatic)"] == () and net.blobs["(automatic)#2"] == ()
    assert net.loss_weights == {"(automatic)": 1.0, "(automatic)#2": 0.5}
    # the automatic tops carry the loss but are no output (and 's' is read): none is left
    result = net({"data": torch.ones(2, 3)})
    assert net.output_names == [] and result.outputs == {}
    assert result.loss.item() == 1.5 * 12.0  # sum(s^2) / 2 = 6 * 4 / 2, weighted 1 + 0.5
    assert [r.tops for r in net.summary()][2] == [("(automatic)", ())]


def test_an_automatic_top_cannot_be_read(spec_of):
    text = AUTO + "  - {name: t, type: ToyScale, bottom: (automatic), top: t}\n"
    with pytest.raises(NetError) as err:
        Net(spec_of(text))
    assert str(err.value) == ("net.yaml:9: layer[3].bottom: Unknown bottom blob '(automatic)' "
                              "(layer 't', bottom index 0); name a top of an earlier layer in "
                              "this phase (blobs so far: data, s)")


def test_only_loss_layers_get_automatic_tops(spec_of):
    with pytest.raises(NetError) as err:
        Net(spec_of(AUTO.replace("{name: loss, type: ToyLoss, bottom: s}",
                                 "{name: loss, type: ToyScale, bottom: s}")))
    assert str(err.value) == ("net.yaml:7: layer[1]: layer 'loss' (ToyScale): takes exactly 1 "
                              "top(s), got 0")


TWINS = """
name: twins
input: data
input_shape: {dim: [1, 2]}
layer:
  - {name: twin, type: ToyScale, bottom: data, top: a, toy_param: {value: 2}}
  - {name: twin, type: ToyScale, bottom: a, top: b, toy_param: {value: 3}}
  - {name: loss, type: ToyLoss, bottom: b, top: l1}
  - {name: loss, type: ToyLoss, bottom: a, top: l2, loss_weight: 0}
"""


def test_layers_may_share_a_name(spec_of, caplog):
    caplog.set_level(logging.WARNING, "caffe_py")
    net = Net(spec_of(TWINS))
    assert [layer.name for layer in net.layers] == ["input", "twin", "twin", "loss", "loss"]
    assert net({"data": torch.ones(1, 2)}).loss.item() == 36.0  # b = 6: sum(b^2) / 2
    assert [r.getMessage() for r in caplog.records] == [
        "Warning: net.yaml:7: layer[1]: layer 'twin' (ToyScale): an earlier layer (line 6) has "
        "this name, so weights files and the TEST net's sharing reach only that one (as in "
        "Caffe): this layer's blobs are never loaded; give the layer its own name"]
    assert net.layer_by_name("twin").weight.tolist() == [3.0, 3.0]  # Caffe's: the last


def test_weights_of_a_shared_name_go_to_the_first_layer_as_in_caffe(spec_of):
    net = Net(spec_of(TWINS))
    first, second = net.layers[1], net.layers[2]
    assert list(net.layer_blobs()) == ["twin"] and net.layer_blobs()["twin"][0] is first.weight
    assert net.copy_from({"twin": [torch.tensor([7.0, 8.0])]}).copied == ["twin"]
    assert first.weight.tolist() == [7.0, 8.0] and second.weight.tolist() == [3.0, 3.0]
    with pytest.raises(NetError) as err:
        net.copy_from({"twin": [torch.zeros(3)]}, source="w.caffemodel")
    assert str(err.value) == ("w.caffemodel: layer 'twin' (ToyScale, line 6) blob 0: shape [3] "
                              "in the weights, [2] in the net; the weights are for another net "
                              "(or rename the layer to start it afresh)")


def test_sharing_a_repeated_name_follows_caffe(spec_of):
    train = Net(spec_of(TWINS))
    test = Net(spec_of(TWINS), "TEST")
    # Caffe's ShareTrainedLayersWith: each TRAIN layer goes to the first TEST layer of its
    # name, so the first 'twin' ends up with the second TRAIN 'twin's blob
    assert test.share_weights_with(train) == ["twin"]
    assert test.layers[1].weight is train.layers[2].weight
    assert test.layers[2].weight is not train.layers[2].weight


STATED = """
name: stated
state: {phase: TEST, level: 2, stage: [deploy]}
input: data
input_shape: {dim: [1, 2]}
layer:
  - {name: train_only, type: ToyScale, bottom: data, top: t, include: {phase: TRAIN}}
  - {name: deep, type: ToyScale, bottom: data, top: d, include: {min_level: 2}}
  - {name: deploy, type: ToyScale, bottom: data, top: e, include: {stage: [deploy, x]}}
"""


def test_the_net_level_state_chooses_the_layers(spec_of):
    spec = spec_of(STATED)
    assert (spec.state.phase, spec.state.level, spec.state.stage) == ("TEST", 2, ["deploy"])
    net = Net(spec)
    assert (net.phase, net.level, net.stages) == ("TEST", 2, frozenset({"deploy"}))
    assert [layer.name for layer in net.layers] == ["input", "deep"]
    # as Caffe's tools: the caller's phase and level win, its stages add to the net's
    net = Net(spec, "TRAIN", level=0, stages=["x"])
    assert [layer.name for layer in net.layers] == ["input", "train_only", "deploy"]


def test_solver_states_merge_over_the_nets_as_caffe(spec_of):
    net_state = spec_of(STATED).state
    merged = merge_states("TRAIN", net_state, NetState(stage=["x"]))
    assert (merged.phase, merged.level, merged.stage) == ("TEST", 2, ["deploy", "x"])
    merged = merge_states("TRAIN", None, NetState(level=3))
    assert (merged.phase, merged.level, merged.stage) == ("TRAIN", 3, [])
    only_stage = spec_of("name: n\nstate: {stage: a}\n").state
    assert merge_states("TEST", only_stage, None).phase == "TEST"
    assert merge_states("TRAIN", only_stage, None).phase == "TRAIN"


ORDER = """
name: order
input: data
input_shape: {dim: [2, 3]}
layer:
  - {name: z, type: ToyScale, bottom: data, top: zeta}
  - {name: loss, type: ToyLoss, bottom: zeta, top: [loss, Mean]}
  - {name: acc, type: ToyScale, bottom: data, top: acc}
"""


def test_outputs_are_numbered_by_name_as_in_caffes_set(spec_of):
    net = Net(spec_of(ORDER))
    # std::set<string> orders by bytes: capitals first
    assert net.output_names == ["Mean", "acc", "loss"]
    assert list(net({"data": torch.ones(2, 3)}).outputs) == ["Mean", "acc", "loss"]
