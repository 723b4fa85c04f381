"""A weights file of a net with two layers of one name, written by the genuine Caffe: loading
it fills the first layer of the name with the second's blobs and leaves the second alone,
as Caffe's CopyTrainedLayersFrom does (every source layer goes to the first target layer of
its name).

duplicate_names/twins.caffemodel was written by pycaffe 1.0 from net.prototxt with the first
'twin' at weights 1 / bias 10 and the second at 2 / 20; loading it back with
``caffe.Net("net.prototxt", "twins.caffemodel", caffe.TEST)`` gave the first 'twin' 2 / 20 and
the second its fillers' zeros.
"""
from __future__ import annotations

from pathlib import Path

from caffe_py.net import Net
from caffe_py.solver.snapshot import load_weights
from caffe_py.spec.net_spec import load_net
from caffe_py.tools.to_yaml import import_file

HERE = Path(__file__).parent / "duplicate_names"


def test_a_caffe_weights_file_with_a_repeated_name_loads_as_in_caffe(tmp_path):
    import_file(HERE / "net.prototxt", tmp_path / "net.yaml", root=HERE)
    net = Net(load_net(tmp_path / "net.yaml"), "TEST")
    net.copy_from(load_weights(HERE / "twins.caffemodel"), source="twins.caffemodel")
    first, second = (layer for layer in net.layers if layer.name == "twin")
    assert first.weight.flatten().tolist() == [2.0] * 4 and first.bias.tolist() == [20.0] * 2
    assert second.weight.flatten().tolist() == [0.0] * 4 and second.bias.tolist() == [0.0] * 2
