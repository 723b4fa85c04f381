"""Python layers: Caffe's pycaffe-style classes run unchanged (numpy blobs, their backward in
autograd), the torch-native form, where the module is found, and the errors."""
from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
import torch
from layer_helpers import build

from caffe_py.errors import NetError
from caffe_py.layers import pycaffe
from caffe_py.net import Net
from caffe_py.spec.net_spec import load_net


def python(layer: str, bottoms: str = "x", tops: str = "y", param_str: str | None = None,
           module: str = "python_layers") -> str:
    extra = f", param_str: '{param_str}'" if param_str is not None else ""
    return (f"name: py\ntype: Python\nbottom: [{bottoms}]\ntop: [{tops}]\n"
            f"python_param: {{module: {module}, layer: {layer}{extra}}}\n")


def test_caffe_style_layer_forward_and_backward_through_numpy():
    layer = build(python("SimpleLayer"), [(2, 3)])
    assert layer.top_shapes == [(2, 3)]
    x = torch.randn(2, 3, requires_grad=True)
    y = layer(x)
    np.testing.assert_allclose(y.detach().numpy(), 10 * x.detach().numpy(), rtol=1e-6)
    y.backward(torch.full((2, 3), 0.5))
    assert x.grad.tolist() == [[5.0] * 3] * 2


def test_bvlc_pyloss_example_runs_unchanged():
    layer = build(python("EuclideanLossLayer", "a, b", "loss"), [(4, 3), (4, 3)])
    assert layer.top_shapes == [(1,)]
    a = torch.randn(4, 3, requires_grad=True)
    b = torch.randn(4, 3, requires_grad=True)
    loss = layer(a, b)
    want = ((a - b) ** 2).sum() / 4 / 2
    assert loss.shape == (1,) and loss.item() == pytest.approx(want.item(), rel=1e-5)
    # its backward ignores the top's diff (the loss weight), as it does in Caffe
    loss.backward(torch.tensor([2.0]))
    np.testing.assert_allclose(a.grad.numpy(), (a - b).detach().numpy() / 4, rtol=1e-5)
    np.testing.assert_allclose(b.grad.numpy(), -(a - b).detach().numpy() / 4, rtol=1e-5)


def test_blobs_are_learnable_and_diffs_accumulate_as_in_caffe():
    layer = build(python("ScaledByBlob", param_str="0.5"), [(2, 3, 2)])
    assert layer.blob_names == ["blob0"]
    assert isinstance(layer.blob0, torch.nn.Parameter) and layer.blob0.tolist() == [1, 2, 3]
    x = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer.double(), (x,))
    layer.blob0.grad = None
    for _ in range(2):  # two backward passes (iter_size 2): the blob's diff keeps adding
        layer(x.detach()).sum().backward()
    np.testing.assert_allclose(layer.blob0.grad.numpy(), 2 * x.detach().sum((0, 2)).numpy())


def test_a_diff_the_layer_sets_stays_set_across_passes():
    # BVLC's test ParameterLayer sets blobs[0].diff[0] = 1 in backward: Caffe's diff is then 1
    layer = build(python("SetsDiff"), [(3,)])
    x = torch.ones(3, requires_grad=True)
    for _ in range(2):
        layer(x).sum().backward()
    assert layer.blob0.grad.tolist() == [1.0]


def test_phase_and_scalar_top():
    layer = build(python("PhaseLayer", tops="phase"), [(2,)], phase="TEST")
    assert layer.top_shapes == [()]
    assert float(layer(torch.zeros(2))) == pycaffe.TEST == 1


def test_torch_native_layer_uses_autograd_and_its_blobs():
    layer = build(python("ChannelScale", param_str="2"), [(2, 3, 4)])
    assert layer.blob_names == ["blob0"] and layer.blob0.tolist() == [2.0] * 3
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(layer.double(), (x,))
    two = build(python("TwoTops", tops="y, phase"), [(2, 2)], phase="TEST")
    y, phase = two(torch.zeros(2, 2))
    assert two.top_shapes == [(2, 2), ()] and y.tolist() == [[1.0] * 2] * 2 and phase == 1


def test_a_torch_layers_blobs_outside_a_net_say_where_they_live():
    import python_layers

    layer = python_layers.ChannelScale()
    with pytest.raises(NetError) as err:
        layer.setup([(2, 3, 4)])
    assert str(err.value) == (
        "ChannelScale.add_blob: a TorchLayer's blobs live in a net; build it from a net spec's "
        "Python layer (python_param: {layer: 'ChannelScale', module: ...}) instead of calling "
        "it on its own")
    with pytest.raises(NetError, match=r"^ChannelScale\.blobs: a TorchLayer's blobs live"):
        assert layer.blobs is None   # raises first


def test_python_layer_in_a_net_trains_its_blob(spec_of):
    spec = spec_of(textwrap.dedent("""\
        name: n
        input: [x, t]
        input_shape: [{dim: [4, 3, 2]}, {dim: [4, 3, 2]}]
        layer:
          - name: s
            type: Python
            bottom: x
            top: s
            python_param: {module: python_layers, layer: ScaledByBlob}
          - name: loss
            type: Python
            bottom: [s, t]
            top: loss
            loss_weight: 1
            python_param: {module: python_layers, layer: EuclideanLossLayer}
        """))
    net = Net(spec)
    x, t = torch.randn(4, 3, 2), torch.randn(4, 3, 2)
    result = net({"x": x, "t": t})
    result.loss.backward()
    scale = net.layer_by_name("s").blob0
    want = ((x * torch.tensor([1.0, 2, 3]).view(1, 3, 1) - t) * x).sum((0, 2)) / 4
    np.testing.assert_allclose(scale.grad.numpy(), want.numpy(), rtol=1e-5)


def write_module(tmp_path, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))


def test_module_beside_the_spec_file_is_found(tmp_path):
    write_module(tmp_path, "beside_mod_a", """\
        import caffe
        class Double(caffe.Layer):
            def reshape(self, bottom, top):
                top[0].reshape(*bottom[0].data.shape)
            def forward(self, bottom, top):
                top[0].data[...] = 2 * bottom[0].data
            def backward(self, top, propagate_down, bottom):
                bottom[0].diff[...] = 2 * top[0].diff
        """)
    (tmp_path / "net.yaml").write_text(textwrap.dedent("""\
        name: n
        input: x
        input_shape: {dim: [2]}
        layer:
          - {name: d, type: Python, bottom: x, top: y,
             python_param: {module: beside_mod_a, layer: Double}}
        """))
    try:
        net = Net(load_net(tmp_path / "net.yaml"))
        assert net({"x": torch.tensor([1.0, 2.0])}).outputs["y"].tolist() == [2.0, 4.0]
    finally:
        sys.path.remove(str(tmp_path))


def error_of(text: str, shapes=((2,),)) -> str:
    with pytest.raises(NetError) as err:
        build(text, list(shapes))(torch.zeros(*shapes[0]))
    return str(err.value)


def test_a_missing_module_or_class_is_one_line_naming_the_layer():
    assert error_of(python("X", module="no_such_module_here")) == (
        "<string>:1: layer[0]: layer 'py' (Python): cannot find python_param.module "
        "'no_such_module_here'; put no_such_module_here.py on PYTHONPATH")
    assert error_of(python("SimpleLayr")) == (
        f"<string>:1: layer[0]: layer 'py' (Python): module 'python_layers' "
        f"({sys.modules['python_layers'].__file__}) has no class 'SimpleLayr'; did you mean "
        "'SimpleLayer'?")


def test_exceptions_in_the_users_code_name_the_module_and_line(tmp_path):
    message = error_of(python("RaisesInSetup"))
    file = sys.modules["python_layers"].__file__
    line = next(i for i, text in enumerate(open(file), 1) if "bad param_str" in text)
    assert message == ("<string>:1: layer[0]: layer 'py' (Python): python_layers."
                       "RaisesInSetup.setup raised RuntimeError: bad param_str "
                       f"({file}:{line})")
    assert "RaisesInForward.forward raised ValueError: no data here (" in \
        error_of(python("RaisesInForward"))
    write_module(tmp_path, "broken_mod_b", "import numpy\nimport not_a_module_xyz\n")
    sys.path.append(str(tmp_path))
    try:
        assert error_of(python("X", module="broken_mod_b")) == (
            "<string>:1: layer[0]: layer 'py' (Python): importing module 'broken_mod_b' raised "
            "ModuleNotFoundError: No module named 'not_a_module_xyz' "
            f"({tmp_path / 'broken_mod_b.py'}:2)")
        write_module(tmp_path, "broken_mod_c", "x = 1\ndef f(:\n")
        assert error_of(python("X", module="broken_mod_c")) == (
            "<string>:1: layer[0]: layer 'py' (Python): importing module 'broken_mod_c' raised "
            f"SyntaxError: invalid syntax ({tmp_path / 'broken_mod_c.py'}:2)")
    finally:
        sys.path.remove(str(tmp_path))


def test_the_stand_in_caffe_module_says_what_it_lacks():
    build(python("SimpleLayer"), [(2,)])
    import caffe
    assert caffe is pycaffe and caffe.TRAIN == 0 and caffe.TEST == 1
    with pytest.raises(AttributeError, match="'Net' belongs to pycaffe's whole interface: run "
                                             "the script with python -m caffe_py.pycaffe"):
        caffe.Net  # noqa: B018
    blob = pycaffe.Blob((2, 3, 4))
    assert (blob.num, blob.channels, blob.height, blob.width, blob.count) == (2, 3, 4, 1, 24)
    blob.reshape(5)
    assert blob.data.shape == blob.diff.shape == (5,)


def test_a_class_without_caffes_methods_is_one_line(tmp_path):
    """A class with no setup was an AttributeError from the call; every method is checked
    before any is called."""
    write_module(tmp_path, "bare_mod_d", "class L:\n    def __init__(self, *args):\n"
                                         "        pass\n")
    sys.path.append(str(tmp_path))
    try:
        assert error_of(python("L", module="bare_mod_d")) == (
            "<string>:1: layer[0]: layer 'py' (Python): bare_mod_d.L has no setup(...) method; "
            "define setup as a Caffe Python layer does (subclass caffe.Layer and define setup, "
            "reshape, forward and backward)")
    finally:
        sys.path.remove(str(tmp_path))
