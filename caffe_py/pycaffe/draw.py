"""pycaffe's ``caffe.draw``: a NetParameter as a Graphviz graph (pydot), as pycaffe draws it.

Layers are record nodes (convolutions red, poolings orange, inner products purple, in-place
neuron layers green, others blue) labelled with name, type and, for spatial layers, kernel
size, stride and pad; blobs are grey octagons; edges from a layer to its tops carry the batch
size of a Data layer or the output count of a Convolution or InnerProduct. ``phase`` keeps the
layers whose include/exclude rules name that phase. Needs pydot (and Graphviz's ``dot`` to
render), as pycaffe's does; ``cpy draw`` draws caffe-py's own way without them.
"""
from __future__ import annotations

from typing import Any

from ..errors import CaffePyError
from .proto import caffe_pb2

LAYER_STYLE_DEFAULT = {"shape": "record", "fillcolor": "#6495ED", "style": "filled"}
NEURON_LAYER_STYLE = {"shape": "record", "fillcolor": "#90EE90", "style": "filled"}
BLOB_STYLE = {"shape": "octagon", "fillcolor": "#E0E0E0", "style": "filled"}
_COLORS = {"Convolution": "#FF5050", "Deconvolution": "#FF5050", "Pooling": "#FF9900",
           "InnerProduct": "#CC33FF"}


def _pydot() -> Any:
    try:
        import pydotplus as pydot
    except ImportError:
        try:
            import pydot
        except ImportError:
            raise CaffePyError("caffe.draw needs pydot (and Graphviz), as pycaffe does: pip "
                               "install pydot (or caffe-py[pycaffe])") from None
    return pydot


def get_pooling_types_dict() -> dict[int, str]:
    """Pooling method number -> name."""
    desc = caffe_pb2.PoolingParameter.PoolMethod.DESCRIPTOR
    return {v.number: name for name, v in desc.values_by_name.items()}


def get_edge_label(layer: Any) -> str:
    """What the edges to a layer's tops say."""
    if layer.type == "Data":
        return f"Batch {layer.data_param.batch_size}"
    if layer.type in ("Convolution", "Deconvolution"):
        return str(layer.convolution_param.num_output)
    if layer.type == "InnerProduct":
        return str(layer.inner_product_param.num_output)
    return '""'


def get_layer_lr_mult(layer: Any) -> tuple[float, float]:
    """The weights' and biases' lr_mult of a Convolution, Deconvolution or InnerProduct."""
    if layer.type not in ("Convolution", "Deconvolution", "InnerProduct"):
        raise ValueError(f"{layer.type} layers do not have a learning rate multiplier")
    specs = list(layer.param)
    if len(specs) > 2:
        raise ValueError("Could not parse the learning rate multiplier")
    mults = [float(getattr(p, "lr_mult", 1.0)) for p in specs] + [1.0] * (2 - len(specs))
    return mults[0], mults[1]


def get_layer_label(layer: Any, rankdir: str, display_lrm: bool = False) -> str:
    """A layer node's label: name, type and (spatial layers) kernel size, stride and pad,
    stacked vertically unless the graph runs top-bottom."""
    separator = " " if rankdir in ("TB", "BT") else r"\n"
    parts = [layer.name]
    if layer.type == "Pooling":
        parts.append(f"({layer.type} {get_pooling_types_dict()[layer.pooling_param.pool]})")
    else:
        parts.append(f"({layer.type})")
    if layer.type in ("Convolution", "Deconvolution", "Pooling"):
        if layer.type == "Pooling":
            p = layer.pooling_param
            kernel, stride, pad = p.kernel_size, p.stride, p.pad
        else:
            c = layer.convolution_param
            kernel = c.kernel_size[0] if len(c.kernel_size) else 1
            stride = c.stride[0] if len(c.stride) else 1
            pad = c.pad[0] if len(c.pad) else 0
        parts.append(separator.join([f"kernel size: {kernel:d}", f"stride: {stride:d}",
                                     f"pad: {pad:d}"]))
    if display_lrm and layer.type in ("Convolution", "Deconvolution", "InnerProduct"):
        weights, biases = get_layer_lr_mult(layer)
        if weights or biases:
            parts.append(f"lr mult: {weights:.1f}, {biases:.1f}")
    return '"' + separator.join(parts) + '"'


def choose_color_by_layertype(layertype: str) -> str:
    return _COLORS.get(layertype, "#6495ED")


def _included(layer: Any, phase: int | None) -> bool:
    if phase is None:
        return True
    if len(layer.include) and len(layer.exclude):
        raise ValueError(f"layer {layer.name} has both include and exclude specified.")
    included = len(layer.include) == 0
    for rule in layer.include:
        included = included or rule.phase == phase
    for rule in layer.exclude:
        included = included and not rule.phase == phase
    return included


def get_pydot_graph(caffe_net: Any, rankdir: str, label_edges: bool = True,
                    phase: int | None = None, display_lrm: bool = False) -> Any:
    """The pydot graph of a NetParameter (see the module docstring)."""
    pydot = _pydot()
    graph = pydot.Dot(caffe_net.name if caffe_net.name else "Net", graph_type="digraph",
                      rankdir=rankdir)
    nodes: dict[str, Any] = {}
    edges: list[tuple[str, str, str]] = []
    for layer in caffe_net.layer:
        if not _included(layer, phase):
            continue
        label = get_layer_label(layer, rankdir, display_lrm=display_lrm)
        node = f"{layer.name}_{layer.type}"
        in_place = len(layer.bottom) == 1 and len(layer.top) == 1 and \
            layer.bottom[0] == layer.top[0]
        if in_place:
            nodes[node] = pydot.Node(label, **NEURON_LAYER_STYLE)
        else:
            style = dict(LAYER_STYLE_DEFAULT, fillcolor=choose_color_by_layertype(layer.type))
            nodes[node] = pydot.Node(label, **style)
        for bottom in layer.bottom:
            nodes[bottom + "_blob"] = pydot.Node(bottom, **BLOB_STYLE)
            edges.append((bottom + "_blob", node, '""'))
        for top in layer.top:
            nodes[top + "_blob"] = pydot.Node(top)
            edges.append((node, top + "_blob", get_edge_label(layer) if label_edges else '""'))
    for node_obj in nodes.values():
        graph.add_node(node_obj)
    for src, dst, label in edges:
        graph.add_edge(pydot.Edge(nodes[src], nodes[dst], label=label))
    return graph


def draw_net(caffe_net: Any, rankdir: str, ext: str = "png", phase: int | None = None,
             display_lrm: bool = False) -> bytes:
    """The net drawn by Graphviz in format ``ext`` (bytes)."""
    return get_pydot_graph(caffe_net, rankdir, phase=phase,
                           display_lrm=display_lrm).create(format=ext)


def draw_net_to_file(caffe_net: Any, filename: str, rankdir: str = "LR",
                     phase: int | None = None, display_lrm: bool = False) -> None:
    """Draw the net into ``filename``, in the format its extension names ('.raw': the
    Graphviz source)."""
    ext = filename[filename.rfind(".") + 1:]
    image = draw_net(caffe_net, rankdir, ext, phase, display_lrm)
    with open(filename, "wb") as out:
        out.write(image)


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    from .errors import missing

    raise missing("caffe.draw", name, [n for n in globals() if not n.startswith("_")])
