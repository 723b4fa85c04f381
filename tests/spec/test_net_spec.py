"""NetParameter / LayerParameter: Caffe's field names line for line, and their errors."""
from __future__ import annotations

import logging

import pytest

from caffe_py.errors import SpecError
from caffe_py.spec.schema import is_set

pytestmark = pytest.mark.usefixtures("toy_layers")

# Every LayerParameter field as a prototxt writes it, one YAML line each.
FULL = """
name: full
input: data
input_shape: {dim: [2, 3]}
force_backward: true
layer:
  - name: s
    type: ToyScale
    bottom: data
    top: s
    param:
      - {name: shared_w, lr_mult: 2, decay_mult: 0, share_mode: PERMISSIVE}
    loss_weight: 0.5
    include: {phase: TRAIN, stage: [a, b], not_stage: c, min_level: 1, max_level: 3}
    propagate_down: false
    toy_param: {value: 2.0, bias_term: false}
  - {name: legacy, type: ToyScale, bottom: s, top: [t], phase: TEST, exclude: []}
"""


def test_every_layer_field(spec_of):
    net = spec_of(FULL)
    assert (net.name, net.input, net.input_shape[0].dim, net.force_backward) == \
        ("full", ["data"], [2, 3], True)
    s, legacy = net.layer
    assert (s.bottom, s.top, s.loss_weight, s.propagate_down) == (["data"], ["s"], [0.5], [False])
    p = s.param[0]
    assert (p.name, p.lr_mult, p.decay_mult, p.share_mode) == ("shared_w", 2.0, 0.0, "PERMISSIVE")
    rule = s.include[0]
    assert (rule.phase, rule.stage, rule.not_stage, rule.min_level, rule.max_level) == \
        ("TRAIN", ["a", "b"], ["c"], 1, 3)
    assert s.params["toy_param"].value == 2.0 and is_set(s.params["toy_param"], "bias_term")
    assert legacy.params["toy_param"].value == 1.0  # an absent block is its defaults
    assert legacy.phase == "TEST" and legacy.top == ["t"]


def test_include_rules_follow_caffe(spec_of):
    s = spec_of(FULL).layer[0]
    assert s.kept_for("TRAIN", 1, {"a", "b"})
    assert not s.kept_for("TRAIN", 0, {"a", "b"})     # below min_level
    assert not s.kept_for("TRAIN", 4, {"a", "b"})     # above max_level
    assert not s.kept_for("TRAIN", 2, {"a"})          # every stage must be set
    assert not s.kept_for("TRAIN", 2, {"a", "b", "c"})  # a not_stage is set
    assert not s.kept_for("TEST", 2, {"a", "b"})
    legacy = spec_of(FULL).layer[1]
    assert legacy.kept_for("TEST") and not legacy.kept_for("TRAIN")


def error_of(spec_of, text: str) -> str:
    with pytest.raises(SpecError) as err:
        spec_of(text)
    return str(err.value)


def test_layer_errors(spec_of):
    head = "name: n\nlayer:\n"
    assert error_of(spec_of, head + "  - {name: a, typ: ToyScale}\n") == \
        "net.yaml:3: layer[0]: the layer has no 'type'; add e.g. 'type: Convolution'"
    assert error_of(spec_of, head + "  - {type: ToyScale, top: x}\n") == \
        "net.yaml:3: layer[0]: the ToyScale layer has no name; add 'name: <unique name>'"
    assert error_of(spec_of, head + "  - 5\n") == \
        ("net.yaml:3: layer[0]: expected a mapping (a layer), got 5; write the layer's fields "
         "under it, e.g. '- name: conv1'")
    assert error_of(spec_of, head + "  - {name: a, type: ToyScale, toy_parm: {}}\n") == \
        ("net.yaml:3: layer[0].toy_parm: unknown key 'toy_parm' in a ToyScale layer; did you "
         "mean 'toy_param'?")
    assert error_of(spec_of, head + "  - {name: a, type: ToyAdd, dropout_parm: {}}\n") == \
        ("net.yaml:3: layer[0].dropout_parm: unknown key 'dropout_parm' in a ToyAdd layer; "
         "valid keys: bottom, exclude, include, loss_weight, name, param, phase, "
         "propagate_down, top, type")
    assert error_of(spec_of, head + "  - {name: a, type: 3}\n") == \
        "net.yaml:3: layer[0].type: type must be a string, got 3"


def test_a_block_caffe_knows_for_another_type_is_ignored_with_a_warning(spec_of, caplog):
    head = "name: n\nlayer:\n"
    caplog.set_level(logging.WARNING, "caffe_py")
    net = spec_of(head + "  - {name: a, type: Input, input_param: {shape: {dim: 1}},\n"
                         "     dummy_data_param: {}, window_data_param: {anything: 1}}\n"
                         "  - {name: b, type: ToyAdd, toy_param: {}, bottom: [a, a], top: b}\n")
    assert net.layer[0].params.keys() == {"input_param"} and net.layer[1].params == {}
    assert [r.getMessage() for r in caplog.records] == [
        "Warning: net.yaml:4: layer[0].dummy_data_param: 'dummy_data_param' does not apply to "
        "an Input layer, so it is ignored (as Caffe ignores it); an Input layer takes "
        "input_param",
        "Warning: net.yaml:4: layer[0].window_data_param: 'window_data_param' does not apply "
        "to an Input layer, so it is ignored (as Caffe ignores it); an Input layer takes "
        "input_param",
        "Warning: net.yaml:5: layer[1].toy_param: 'toy_param' does not apply to a ToyAdd "
        "layer, so it is ignored (as Caffe ignores it); a ToyAdd layer takes no parameter "
        "block"]


def test_every_block_of_caffes_layer_parameter_is_known():
    """The table of caffe.proto's blocks holds every block caffe-py's BVLC types take; a
    fork's block is known when caffe-py has a type that takes it."""
    from caffe_py.spec import layer_params
    from caffe_py.spec.layer_params.forks import BVLC_TYPES
    own = {key for name, blocks in layer_params.LAYER_PARAMS.items() for key in blocks
           if not key.startswith("toy") and name in BVLC_TYPES}
    assert own <= layer_params.CAFFE_LAYER_BLOCKS
    assert len(layer_params.CAFFE_LAYER_BLOCKS) == 49
    assert layer_params.caffe_block("bn_param")  # the forks' BN takes it
    assert layer_params.caffe_block("multibox_loss_param")  # SSD's MultiBoxLoss takes it
    assert not layer_params.caffe_block("domain_transform_param")  # a fork's, not here


def test_unknown_type_suggests_the_nearest(spec_of):
    assert error_of(spec_of, "name: n\nlayer:\n  - name: a\n    type: ToyScal\n") == \
        "net.yaml:4: layer[0].type: unknown layer type 'ToyScal'; did you mean 'ToyScale'?"


def test_an_empty_layer_list_is_no_layers(spec_of):
    assert spec_of("name: n\nlayer:\n").layer == []


def test_net_errors(spec_of):
    assert error_of(spec_of, "- a\n") == \
        "net.yaml:1: a net spec is a mapping with 'name' and 'layer'"
    assert error_of(spec_of, "name: n\ninput: [a, b]\ninput_shape: {dim: [1]}\n") == \
        ("net.yaml:3: input_shape: 2 inputs but 1 input_shape entries; give one input_shape "
         "per input")
    assert error_of(spec_of, "name: n\nlayers: []\n") == \
        "net.yaml:2: layers: unknown key 'layers' in NetParameter; did you mean 'layer'?"
