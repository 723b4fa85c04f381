"""pycaffe's NetSpec: nets written as Python calls, serialized as Caffe's NetParameter.

    n = caffe.NetSpec()
    n.data, n.label = L.Data(source="train_lmdb", backend=P.Data.LMDB, batch_size=64, ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20,
                            weight_filler=dict(type="xavier"), param=[dict(lr_mult=1)])
    n.loss = L.SoftmaxWithLoss(n.conv1, n.label)
    open("train.prototxt", "w").write(str(n.to_proto()))

``L.<Type>(*bottoms, **fields)`` makes a layer: a field of the type's ``<type>_param`` message
goes there, a field ending in ``param`` (``param``, ``transform_param``...) and any other field
go on the LayerParameter itself; lists fill repeated fields, dicts fill messages. ``ntop``
sets the number of tops and ``in_place=True`` writes the top over the bottom. Names: a top
assigned to the NetSpec is named after the attribute; others, and layers with no top, are
named ``<Type><n>`` in the order ``to_proto`` meets them, as pycaffe names them.
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Any

from .proto import caffe_pb2


def _param_names() -> dict[str, str]:
    """Layer type -> its block's field prefix, from LayerParameter's ``*_param`` fields
    (``Convolution`` -> ``convolution``, ``Transformation`` -> ``transform``...)."""
    layer = caffe_pb2.LayerParameter.DESCRIPTOR
    out = {}
    for f in layer.fields:
        if f.name.endswith("_param") and f.message_type is not None:
            out[f.message_type.name[:-len("Parameter")]] = f.name[:-len("_param")]
    return out


_PARAM_NAMES = _param_names()


def assign_proto(proto: Any, name: str, val: Any) -> None:
    """Set field ``name`` of ``proto`` from a Python value: a list fills a repeated field
    (one value is a list of one), a dict fills a message, field by field, recursively."""
    repeated = hasattr(getattr(proto, name), "extend")
    if repeated and not isinstance(val, list):
        val = [val]
    if isinstance(val, list):
        if val and isinstance(val[0], dict):
            for item in val:
                message = getattr(proto, name).add()
                for key, value in item.items():
                    assign_proto(message, key, value)
        else:
            getattr(proto, name).extend(val)
    elif isinstance(val, dict):
        for key, value in val.items():
            assign_proto(getattr(proto, name), key, value)
    else:
        setattr(proto, name, val)


class Top:
    """One output blob of a layer (its ``n``-th top)."""

    def __init__(self, fn: Function, n: int):
        self.fn = fn
        self.n = n

    def to_proto(self) -> Any:
        """A NetParameter with every layer needed to compute this top."""
        return to_proto(self)

    def _to_proto(self, layers: OrderedDict, names: dict, autonames: Counter) -> None:
        self.fn._to_proto(layers, names, autonames)


class Function:
    """A layer: its type, its bottoms (Tops) and its fields."""

    def __init__(self, type_name: str, inputs: tuple, params: dict[str, Any]):
        self.type_name = type_name
        for index, bottom in enumerate(inputs):
            if not isinstance(bottom, Top):
                raise TypeError(f"{type_name} input {index} is not a Top (type is "
                                f"{type(bottom)})")
        self.inputs = inputs
        self.params = dict(params)
        self.ntop = self.params.pop("ntop", 1)
        self.in_place = self.params.pop("in_place", False)
        self.tops = tuple(Top(self, n) for n in range(self.ntop))

    def _get_name(self, names: dict, autonames: Counter) -> str:
        if self not in names:
            if self.ntop > 0:
                names[self] = self._get_top_name(self.tops[0], names, autonames)
            else:
                autonames[self.type_name] += 1
                names[self] = f"{self.type_name}{autonames[self.type_name]}"
        return names[self]

    def _get_top_name(self, top: Top, names: dict, autonames: Counter) -> str:
        if top not in names:
            autonames[top.fn.type_name] += 1
            names[top] = f"{top.fn.type_name}{autonames[top.fn.type_name]}"
        return names[top]

    def _to_proto(self, layers: OrderedDict, names: dict, autonames: Counter) -> None:
        if self in layers:
            return
        bottoms = []
        for bottom in self.inputs:
            bottom._to_proto(layers, names, autonames)
            bottoms.append(layers[bottom.fn].top[bottom.n])
        layer = caffe_pb2.LayerParameter()
        layer.type = self.type_name
        layer.bottom.extend(bottoms)
        if self.in_place:
            layer.top.extend(layer.bottom)
        else:
            for top in self.tops:
                layer.top.append(self._get_top_name(top, names, autonames))
        layer.name = self._get_name(names, autonames)
        for key, value in self.params.items():
            if key.endswith("param"):  # param (ParamSpecs), transform_param, <type>_param...
                assign_proto(layer, key, value)
                continue
            try:
                block = getattr(layer, _PARAM_NAMES[self.type_name] + "_param")
                assign_proto(block, key, value)
            except (AttributeError, KeyError):
                assign_proto(layer, key, value)
        layers[self] = layer


def to_proto(*tops: Top) -> Any:
    """A NetParameter with every layer needed to compute ``tops`` (names made up)."""
    layers: OrderedDict = OrderedDict()
    autonames: Counter = Counter()
    for top in tops:
        top.fn._to_proto(layers, {}, autonames)
    net = caffe_pb2.NetParameter()
    net.layer.extend(layers.values())
    return net


class NetSpec:
    """Tops assigned as attributes (or items) name themselves; ``to_proto`` serializes every
    layer needed for them, in the order they were assigned."""

    def __init__(self) -> None:
        super().__setattr__("tops", OrderedDict())

    def __setattr__(self, name: str, value: Any) -> None:
        self.tops[name] = value

    def __getattr__(self, name: str) -> Any:
        try:
            return self.tops[name]
        except KeyError:
            raise AttributeError(f"NetSpec has no top '{name}' (its tops: "
                                 f"{', '.join(self.tops) or 'none'})") from None

    def __setitem__(self, key: str, value: Any) -> None:
        self.__setattr__(key, value)

    def __getitem__(self, item: str) -> Any:
        return self.__getattr__(item)

    def to_proto(self) -> Any:
        names = {v: k for k, v in self.tops.items()}
        autonames: Counter = Counter()
        layers: OrderedDict = OrderedDict()
        for top in self.tops.values():
            top._to_proto(layers, names, autonames)
        net = caffe_pb2.NetParameter()
        net.layer.extend(layers.values())
        return net


class Layers:
    """``L.<Type>(*bottoms, **fields)``: a layer of that type (see the module docstring)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def layer_fn(*args: Any, **kwargs: Any) -> Any:
            fn = Function(name, args, kwargs)
            if fn.ntop == 0:
                return fn
            if fn.ntop == 1:
                return fn.tops[0]
            return fn.tops
        return layer_fn


class Parameters:
    """``P.<Type>.<VALUE>``: an enum value of ``<Type>Parameter`` (``P.Pooling.MAX``)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        class Param:
            def __getattr__(self, param_name: str) -> Any:
                return getattr(getattr(caffe_pb2, name + "Parameter"), param_name)
        return Param()


layers = Layers()
params = Parameters()

__all__ = ["NetSpec", "layers", "params", "to_proto", "assign_proto", "Top", "Function"]


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    from .errors import missing

    raise missing("caffe.net_spec", name, [n for n in globals() if not n.startswith("_")])
