"""The Net's own semantics, on toy layers (conftest) plus Input and DummyData."""
from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import torch
import torch.nn.modules.module as module_hooks

from caffe_py import net as net_module
from caffe_py.errors import NetError
from caffe_py.net import Net

pytestmark = pytest.mark.usefixtures("toy_layers")

PHASED = """
name: phased
input: data
input_shape: {dim: [2, 3]}
layer:
  - {name: a, type: ToyScale, bottom: data, top: a, include: {phase: TRAIN}}
  - {name: a, type: ToyScale, bottom: data, top: a, include: {phase: TEST},
     toy_param: {value: 2}}
  - {name: deep, type: ToyScale, bottom: a, top: deep, include: {min_level: 1}}
  - {name: staged, type: ToyScale, bottom: a, top: staged, include: {stage: [x, y]}}
  - {name: notx, type: ToyScale, bottom: a, top: notx, include: {not_stage: x}}
  - {name: nottest, type: ToyScale, bottom: a, top: nottest, exclude: {phase: TEST}}
"""


def names(net: Net) -> list[str]:
    return [layer.name for layer in net.layers]


def test_phase_level_and_stage_rules(spec_of):
    spec = spec_of(PHASED)
    assert names(Net(spec, "TRAIN")) == ["input", "a", "notx", "nottest"]
    assert names(Net(spec, "TEST")) == ["input", "a", "notx"]
    assert names(Net(spec, "TEST", level=1)) == ["input", "a", "deep", "notx"]
    assert names(Net(spec, "TRAIN", stages=["x"])) == ["input", "a", "nottest"]
    assert names(Net(spec, "TRAIN", stages=["x", "y"])) == ["input", "a", "staged", "nottest"]
    out = Net(spec, "TEST")({"data": torch.ones(2, 3)}).outputs
    assert out["notx"].tolist() == [[2.0] * 3] * 2


def test_legacy_inputs_become_an_input_layer(spec_of):
    net = Net(spec_of("name: n\ninput: [x, y]\ninput_dim: [2, 3, 1, 1, 4, 1, 1, 1]\n"))
    assert net.layers[0].spec.type == "Input" and net.layers[0].name == "input"
    assert net.blobs == {"x": (2, 3, 1, 1), "y": (4, 1, 1, 1)}
    assert net.input_names == ["x", "y"] and net.output_names == ["x", "y"]


def test_inputs_are_checked_by_name(spec_of):
    net = Net(spec_of("name: n\ninput: x\ninput_shape: {dim: [2, 3]}\n"))
    with pytest.raises(NetError) as err:
        net({"x": torch.ones(2, 3), "z": torch.ones(1)})
    assert str(err.value) == "net 'n': 'z' is not an input of the net (its inputs: x)"
    with pytest.raises(NetError) as err:
        net()
    assert str(err.value) == ("net.yaml:2: input: layer 'input' (Input): no tensor given for "
                              "input(s) x; pass them in the net's inputs, keyed by top name")



def test_a_one_input_net_takes_the_tensor_alone(spec_of):
    """``net(x)`` as a PyTorch module: the output tensor, or the outputs by name."""
    net = Net(spec_of("name: n\ninput: x\ninput_shape: {dim: [2, 3]}\nlayer:\n"
                      "  - {name: a, type: ToyScale, bottom: x, top: a, toy_param: {value: 3}}\n"))
    assert net(torch.ones(2, 3)).tolist() == [[3.0] * 3] * 2
    two = Net(spec_of("name: n\ninput: x\ninput_shape: {dim: [2, 3]}\nlayer:\n"
                      "  - {name: a, type: ToyScale, bottom: x, top: a}\n"
                      "  - {name: b, type: ToyScale, bottom: x, top: b, toy_param: {value: 2}}\n"))
    out = two(torch.ones(2, 3))
    assert sorted(out) == ["a", "b"] and out["b"].tolist() == [[2.0] * 3] * 2
    pair = Net(spec_of("name: n\ninput: [x, y]\ninput_dim: [2, 3, 1, 1, 4, 1, 1, 1]\n"))
    with pytest.raises(NetError) as err:
        pair(torch.ones(2, 3, 1, 1))
    assert str(err.value) == ("net 'n' has 2 inputs (x, y), so a tensor alone does not say "
                              "which it is; pass a dict {name: tensor}")


IN_PLACE = """
name: inplace
input: data
input_shape: {dim: [2, 3, 4]}
layer:
  - {name: s1, type: ToyScale, bottom: data, top: s1, toy_param: {value: 2}}
  - {name: s2, type: ToyScale, bottom: s1, top: s1, toy_param: {value: 3}}
  - {name: loss, type: ToyLoss, bottom: s1, top: [loss, mean]}
"""


def test_in_place_rebinds_and_shapes_are_inferred(spec_of):
    net = Net(spec_of(IN_PLACE))
    assert net.blobs == {"data": (2, 3, 4), "s1": (2, 3, 4), "loss": (), "mean": ()}
    result = net({"data": torch.ones(2, 3, 4)})
    # s1 = 6 everywhere: loss = 24 * 36 / 2; 'mean' is an output with weight 0
    assert result.loss.item() == 432.0
    assert list(result.outputs) == ["loss", "mean"]
    assert result.outputs["mean"].item() == 6.0
    assert net.loss_weights == {"loss": 1.0}


def test_explicit_loss_weights_on_any_top(spec_of):
    text = IN_PLACE.replace("top: [loss, mean]}", "top: [loss, mean], loss_weight: [0.5, 2]}")
    text = text.replace("top: s1, toy_param: {value: 3}}",
                        "top: s1, toy_param: {value: 3}, loss_weight: 0.25}")
    net = Net(spec_of(text))
    result = net({"data": torch.ones(2, 3, 4)})
    # 0.25 * sum(s1) + 0.5 * 432 + 2 * 6
    assert result.loss.item() == pytest.approx(0.25 * 144 + 216 + 12)
    assert net.loss_weights == {"s1": 0.25, "loss": 0.5, "mean": 2.0}


def test_no_loss_is_a_zero_scalar(spec_of):
    result = Net(spec_of(PHASED))({"data": torch.ones(2, 3)})
    assert result.loss.shape == () and result.loss.item() == 0.0


def test_outputs_are_unconsumed_tops_sorted_by_name(spec_of):
    net = Net(spec_of(PHASED), "TRAIN")  # produced notx, then nottest
    assert net.output_names == ["nottest", "notx"]
    assert list(net({"data": torch.ones(2, 3)}).outputs) == ["nottest", "notx"]


def test_propagate_down_false_detaches_that_bottom(spec_of):
    net = Net(spec_of("""
name: pd
input: data
input_shape: {dim: [1, 2]}
layer:
  - {name: left, type: ToyScale, bottom: data, top: left}
  - {name: right, type: ToyScale, bottom: data, top: right}
  - {name: add, type: ToyAdd, bottom: [left, right], top: sum, propagate_down: [true, false]}
  - {name: loss, type: ToyLoss, bottom: sum, top: loss}
"""))
    net({"data": torch.tensor([[1.0, 2.0]])}).loss.backward()
    # sum = 2x; d loss / d left.w = sum * x = 2x^2
    assert net.layer_by_name("left").weight.grad.tolist() == [2.0, 8.0]
    assert net.layer_by_name("right").weight.grad is None


MULTS = """
name: mults
input: data
input_shape: {dim: [2, 3]}
layer:
  - name: s1
    type: ToyScale
    bottom: data
    top: s1
    param: [{lr_mult: 1}, {lr_mult: 2, decay_mult: 0}]
    toy_param: {bias_term: true}
  - {name: frozen, type: ToyScale, bottom: s1, top: s2, param: {lr_mult: 0}}
  - {name: stat, type: ToyStat, bottom: s2, top: s3, param: [{lr_mult: 0.5}, {lr_mult: 0}]}
"""


def test_learnable_params_carry_multipliers(spec_of):
    net = Net(spec_of(MULTS))
    got = [(p.name, tuple(p.param.shape), p.lr_mult, p.decay_mult)
           for p in net.learnable_params()]
    assert got == [("s1/0", (3,), 1.0, 1.0), ("s1/1", (3,), 2.0, 0.0),
                   ("frozen/0", (3,), 0.0, 1.0), ("stat/0", (3,), 0.5, 1.0)]
    frozen = net.layer_by_name("frozen").weight
    assert not frozen.requires_grad
    assert [len(b) for b in net.layer_blobs().values()] == [2, 1, 2]


def test_too_many_param_entries(spec_of):
    spec = spec_of(MULTS.replace("param: {lr_mult: 0}}", "param: [{lr_mult: 0}, {}]}"))
    with pytest.raises(NetError) as err:
        Net(spec)
    assert str(err.value) == ("net.yaml:12: layer[1].param: layer 'frozen' (ToyScale): 2 param "
                              "entries for 1 blob(s) (weight); give at most one param entry "
                              "per blob, in blob order")


SHARED = """
name: shared
input: data
input_shape: {dim: [1, 4]}
layer:
  - {name: a, type: ToyScale, bottom: data, top: a, param: {name: w, lr_mult: 2},
     toy_param: {value: 2}}
  - {name: b, type: ToyScale, bottom: data, top: b, param: {name: w}, toy_param: {value: 5}}
  - {name: add, type: ToyAdd, bottom: [a, b], top: sum}
  - {name: loss, type: ToyLoss, bottom: sum, top: loss}
"""


def test_shared_params_are_one_tensor_listed_once(spec_of):
    net = Net(spec_of(SHARED))
    a, b = net.layer_by_name("a"), net.layer_by_name("b")
    assert a.weight is b.weight
    params = net.learnable_params()
    assert [(p.name, p.lr_mult) for p in params] == [("a/0", 2.0)]
    assert a.weight.tolist() == [2.0] * 4  # the owner's filler wins
    assert [r.params for r in net.summary()] == [0, 4, 0, 0, 0]
    net({"data": torch.ones(1, 4)}).loss.backward()
    # sum = 2 * w * x = 4; d/dw = sum * x from each branch: 4 + 4
    assert a.weight.grad.tolist() == [8.0] * 4


def test_sharer_may_repeat_or_set_the_owners_multipliers(spec_of):
    same = SHARED.replace("param: {name: w}", "param: {name: w, lr_mult: 2}")
    assert Net(spec_of(same)).learnable_params()[0].lr_mult == 2.0
    adopted = SHARED.replace("param: {name: w, lr_mult: 2}", "param: {name: w}")
    adopted = adopted.replace("param: {name: w}, toy_param: {value: 5}",
                              "param: {name: w, decay_mult: 3}, toy_param: {value: 5}")
    got = Net(spec_of(adopted)).learnable_params()[0]
    assert (got.lr_mult, got.decay_mult) == (1.0, 3.0)


def test_strict_sharing_needs_equal_shapes_permissive_equal_counts(spec_of):
    text = SHARED.replace("param: {name: w}, toy_param: {value: 5}",
                          "param: {name: w}, toy_param: {shape: [2, 2]}")
    with pytest.raises(NetError) as err:
        Net(spec_of(text))
    assert str(err.value) == (
        "net.yaml:8: layer[1].param: layer 'b' (ToyScale): cannot share param 'w' (owner layer "
        "'a'): shape [2, 2] here vs [4] in the owner (share_mode STRICT); make the shapes equal, "
        "or set share_mode: PERMISSIVE if only the counts must match")
    net = Net(spec_of(text.replace("param: {name: w}",
                                   "param: {name: w, share_mode: PERMISSIVE}")))
    a, b = net.layer_by_name("a"), net.layer_by_name("b")
    assert b.weight.shape == (2, 2) and b.weight.data_ptr() == a.weight.data_ptr()
    assert [p.name for p in net.learnable_params()] == ["a/0"]
    net({"data": torch.ones(1, 4)}).loss.backward()
    assert a.weight.grad.tolist() == [8.0] * 4
    with torch.no_grad():
        a.weight.fill_(0.5)  # a solver update on the owner reaches the sharer
    assert net({"data": torch.ones(1, 4)}).outputs["loss"].item() == 2.0


def test_seed_decides_the_initial_weights(spec_of):
    text = """
name: seeded
layer:
  - {name: d, type: DummyData, top: noise, dummy_data_param: {shape: {dim: [3]},
     data_filler: {type: gaussian}}}
"""
    first = Net(spec_of(text), seed=1)()
    again = Net(spec_of(text), seed=1)()
    other = Net(spec_of(text), seed=2)()
    assert torch.equal(first.outputs["noise"], again.outputs["noise"])
    assert not torch.equal(first.outputs["noise"], other.outputs["noise"])


def test_copy_from_by_layer_name(spec_of):
    net = Net(spec_of(MULTS))
    result = net.copy_from({"s1": [torch.full((3,), 7.0), torch.full((1, 1, 1, 3), 8.0)],
                            "absent": [torch.zeros(1)]}, source="w.caffemodel")
    assert (result.copied, result.ignored) == (["s1"], ["absent"])
    s1 = net.layer_by_name("s1")
    assert s1.weight.tolist() == [7.0] * 3 and s1.bias.tolist() == [8.0] * 3
    with pytest.raises(NetError) as err:
        net.copy_from({"frozen": [torch.zeros(4)]}, source="w.caffemodel")
    assert str(err.value) == ("w.caffemodel: layer 'frozen' blob 0: shape [4] in the weights, "
                              "[3] in the net; the weights are for another net (or rename the "
                              "layer to start it afresh)")
    with pytest.raises(NetError) as err:
        net.copy_from({"stat": [torch.zeros(3)]}, source="w.caffemodel")
    assert str(err.value) == ("w.caffemodel: layer 'stat' has 1 blob(s) in the weights but 2 in "
                              "the net; the weights are for another net")


@pytest.mark.parametrize("value,problem", [
    (torch.full((1, 1, 1, 3), 1e300, dtype=torch.float64),
     "holds values past float32's range (the largest magnitude is 1e+300); the file is damaged "
     "or not this net's weights"),
    (torch.zeros((1, 1, 1, 3), dtype=torch.complex64),
     "holds complex64 values, not real numbers; the file is damaged or not weights: use an "
     "earlier snapshot"),
    (torch.zeros((1, 1, 1, 3)).to_sparse(),
     "holds sparse_coo values, not real numbers; the file is damaged or not weights: use an "
     "earlier snapshot"),
])
def test_weights_that_would_load_wrong_are_refused(spec_of, value, problem):
    """float64 1e300 passed the finite check and became inf (the run's loss then NaN, exit 0);
    complex values lost their imaginary part; float8 and sparse tensors were tracebacks."""
    net = Net(spec_of(MULTS))
    with pytest.raises(NetError) as err:
        net.copy_from({"s1": [torch.full((3,), 7.0), value]}, source="w.pt")
    assert str(err.value) == f"w.pt: layer 's1' blob 1 {problem}"


def test_test_net_shares_the_train_nets_blobs(spec_of):
    spec = spec_of(MULTS.replace("  - {name: frozen",
                                 "  - {name: only_test, type: ToyScale, bottom: s1, top: t, "
                                 "include: {phase: TEST}}\n  - {name: frozen"))
    train, test = Net(spec, "TRAIN"), Net(spec, "TEST", seed=5)
    assert test.share_weights_with(train) == ["s1", "frozen", "stat"]
    for name in ("s1", "frozen", "stat"):
        mine, theirs = test.layer_by_name(name).blobs(), train.layer_by_name(name).blobs()
        assert all(a is b for a, b in zip(mine, theirs, strict=True))
    assert test.layer_by_name("only_test").weight is not None
    train({"data": torch.ones(2, 3)})
    train({"data": torch.ones(2, 3)})
    assert test.layer_by_name("stat").count.item() == 2.0  # BatchNorm-like state is shared too
    with torch.no_grad():
        train.layer_by_name("s1").weight.fill_(3.0)
    assert test({"data": torch.ones(2, 3)}).outputs["s3"].tolist() == [[3.0] * 3] * 2


def test_share_weights_with_checks_shapes(spec_of):
    train = Net(spec_of(MULTS))
    test = Net(spec_of(MULTS.replace("dim: [2, 3]", "dim: [2, 5]")), "TEST")
    with pytest.raises(NetError) as err:
        test.share_weights_with(train)
    assert str(err.value) == ("layer 's1' blob 0: shape [5] here but [3] in net 'mults' (TRAIN); "
                              "layers of one name must match across phases")


def test_layer_by_name_suggests(spec_of):
    net = Net(spec_of(MULTS))
    with pytest.raises(NetError) as err:
        net.layer_by_name("frozn")
    assert str(err.value) == "net 'mults' (TRAIN) has no layer 'frozn'; did you mean 'frozen'?"


def test_summary_rows(spec_of):
    rows = Net(spec_of(MULTS)).summary()
    assert [(r.name, r.type, r.tops, r.params) for r in rows] == [
        ("input", "Input", [("data", (2, 3))], 0),
        ("s1", "ToyScale", [("s1", (2, 3))], 6),
        ("frozen", "ToyScale", [("s2", (2, 3))], 3),
        ("stat", "ToyStat", [("s3", (2, 3))], 3)]


def test_force_backward_is_accepted(spec_of):
    net = Net(spec_of("name: fb\nforce_backward: true\n" + IN_PLACE.split("\n", 2)[2]))
    assert net({"data": torch.ones(2, 3, 4)}).loss.item() == 432.0


def test_build_context_carries_device_seed_and_options(spec_of):
    net = Net(spec_of(MULTS), "TEST", options={"fuse_bias_activation": False})
    layer = net.layer_by_name("s1")
    assert layer.ctx is net.ctx and layer.phase == "TEST"
    assert net.ctx.options == {"fuse_bias_activation": False}
    assert net.ctx.device == torch.device("cpu") and layer.weight.device.type == "cpu"


def test_unknown_phase_is_refused(spec_of):
    with pytest.raises(NetError) as err:
        Net(spec_of(MULTS), "VAL")
    assert str(err.value) == "phase 'VAL' is not TRAIN or TEST"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_net_on_cuda_keeps_blobs_and_loss_there(spec_of):
    net = Net(spec_of(IN_PLACE), device="cuda")
    assert all(p.param.is_cuda for p in net.learnable_params())
    result = net({"data": torch.ones(2, 3, 4, device="cuda")})
    assert result.loss.is_cuda and result.loss.item() == 432.0


def test_inputs_of_another_shape_name_the_layer(spec_of):
    net = Net(spec_of(MULTS))
    assert net({"data": torch.ones(5, 3)}).outputs["s3"].shape == (5, 3)  # batch may differ
    with pytest.raises(NetError) as err:
        net({"data": torch.ones(2, 4)})
    assert str(err.value) == ("layer 's1' (ToyScale): bottom 'data' has shape [2, 4] but the net "
                              "was built for [2, 3]; only the batch size (axis 0) may differ: "
                              "give inputs of the declared shape")


def test_layer_and_global_hooks_run_though_plain_layers_skip_the_module_call(spec_of):
    """Layers without hooks are called directly; a layer's own hook, and a global module hook,
    still run (then the layers go through nn.Module's call)."""
    net = Net(spec_of(PHASED), "TRAIN")
    seen = []
    net({"data": torch.ones(2, 3)})  # the forward plan is made before the hook comes
    handle = net.layer_by_name("notx").register_forward_hook(
        lambda layer, args, out: seen.append((layer.name, tuple(out.shape))))
    plain = net({"data": torch.ones(2, 3)}).outputs
    assert seen == [("notx", (2, 3))]
    handle.remove()
    every = torch.nn.modules.module.register_module_forward_hook(
        lambda layer, args, out: seen.append(getattr(layer, "name", None)))
    try:
        hooked = net({"data": torch.ones(2, 3)}).outputs
    finally:
        every.remove()
    assert seen[1:] == ["input", "a", "notx", "nottest", "phased"]  # the layers, then the net
    assert all(torch.equal(plain[k], hooked[k]) for k in plain)
    net({"data": torch.ones(2, 3)})
    assert len(seen) == 6  # both hooks removed: nothing more


def test_run_skips_the_module_call_unless_a_hook_needs_it(spec_of):
    """Net.run (what the eager step calls) is forward itself; a hook on the net, or a global
    one, still runs through it."""
    net = Net(spec_of(PHASED), "TRAIN")
    inputs = {"data": torch.ones(2, 3)}
    seen = []
    plain = net.run(inputs).outputs
    handle = net.register_forward_hook(lambda module, args, out: seen.append("net"))
    try:
        hooked = net.run(inputs).outputs
    finally:
        handle.remove()
    assert seen == ["net"]
    every = torch.nn.modules.module.register_module_forward_hook(
        lambda module, args, out: seen.append(type(module).__name__))
    try:
        net.run(inputs)
    finally:
        every.remove()
    assert seen == ["net", "Input", "ToyScale", "ToyScale", "ToyScale", "Net"]
    net.run(inputs)
    assert len(seen) == 6  # nothing more once the hooks are gone
    assert all(torch.equal(plain[k], hooked[k]) for k in plain)


# What net.py reads of torch's private hook registries to skip nn.Module.__call__ for a layer
# without hooks: nn.Module._call_impl's own test for "no hook, just call forward".
TORCH_HOOK_REGISTRIES = {
    "self._forward_hooks", "self._forward_pre_hooks", "self._backward_hooks",
    "self._backward_pre_hooks", "_global_forward_hooks", "_global_forward_pre_hooks",
    "_global_backward_hooks", "_global_backward_pre_hooks"}


def test_the_hook_registries_the_net_reads_are_the_ones_torch_checks():
    """net.py skips nn.Module.__call__ when torch itself would run no hook, reading torch's
    private registries to know (net._global_hooks, net._hooked, Net._forward_plan). This fails
    when a new torch renames them, checks another one before calling forward, or registers
    hooks elsewhere: then net.py's skip must change with it."""
    source = textwrap.dedent(inspect.getsource(torch.nn.Module._call_impl))
    fast_path = next((node.test.operand for node in ast.walk(ast.parse(source))
                      if isinstance(node, ast.If) and isinstance(node.test, ast.UnaryOp)
                      and isinstance(node.test.op, ast.Not)
                      and isinstance(node.test.operand, ast.BoolOp)), None)
    assert fast_path is not None, "torch's nn.Module call has no 'if not (hooks...)' fast " \
        "path any more: check what net.py's skip of it relies on"
    assert {ast.unparse(value) for value in fast_path.values} == TORCH_HOOK_REGISTRIES, \
        "torch's nn.Module call checks other hook registries now: update net.py's skip"


@pytest.mark.parametrize("register", [
    lambda m: m.register_forward_hook(lambda *a: None),
    lambda m: m.register_forward_pre_hook(lambda *a: None),
    lambda m: m.register_full_backward_hook(lambda *a: None),
    lambda m: m.register_full_backward_pre_hook(lambda *a: None),
    lambda m: m.register_forward_hook(lambda *a, **k: None, with_kwargs=True),
    lambda m: m.register_forward_hook(lambda *a: None, always_call=True),
], ids=["forward", "forward_pre", "full_backward", "full_backward_pre", "with_kwargs",
        "always_call"])
def test_every_kind_of_layer_hook_is_seen(register):
    layer = torch.nn.Linear(1, 1)
    assert not net_module._hooked(layer)
    handle = register(layer)
    assert net_module._hooked(layer)
    handle.remove()
    assert not net_module._hooked(layer)


@pytest.mark.parametrize("register", [
    lambda: module_hooks.register_module_forward_hook(lambda *a: None),
    lambda: module_hooks.register_module_forward_pre_hook(lambda *a: None),
    lambda: module_hooks.register_module_full_backward_hook(lambda *a: None),
    lambda: module_hooks.register_module_full_backward_pre_hook(lambda *a: None),
], ids=["forward", "forward_pre", "full_backward", "full_backward_pre"])
def test_every_kind_of_global_hook_is_seen(register):
    assert not net_module._global_hooks()
    handle = register()
    try:
        assert net_module._global_hooks()
    finally:
        handle.remove()
    assert not net_module._global_hooks()


def test_forward_follows_a_layer_put_in_place_of_another(spec_of):
    """forward works out each layer's bottoms and tops once; a layer replaced in the list
    afterwards is the one that runs."""
    import copy

    net = Net(spec_of(PHASED), "TRAIN")
    inputs = {"data": torch.ones(2, 3)}
    assert net(inputs).outputs["notx"].tolist() == [[1.0] * 3] * 2
    index = next(i for i, layer in enumerate(net.layers) if layer.name == "notx")
    tripled = copy.deepcopy(net.layers[index])
    with torch.no_grad():
        tripled.weight.fill_(3.0)
    net.layers[index] = tripled
    assert net(inputs).outputs["notx"].tolist() == [[3.0] * 3] * 2
    assert net(inputs).outputs["nottest"].tolist() == [[1.0] * 3] * 2
