"""What a pycaffe Net is made from: its constructor's arguments, its net file (a prototxt of
any suffix, paths from the current directory as Caffe reads them, or a caffe-py YAML spec),
the caffe-py net built for it, and weights files."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from .. import api
from ..errors import CaffePyError
from ..layers import pycaffe as standin
from ..layers.base import RECORD_FILLERS
from ..net import Net as CaffePyNet
from ..passes import BATCHNORM_ELTWISE, BATCHNORM_RELU, BATCHNORM_SCALE, BIAS_ACTIVATION
from ..spec.layer_params.data import InputParameter
from ..spec.net_spec import BlobShape, NetParameter
from . import mode
from .errors import PycaffeError, missing

TRAIN, TEST = standin.TRAIN, standin.TEST
PHASES: dict[int, str] = {TRAIN: "TRAIN", TEST: "TEST"}
NET_OPTIONS = {BATCHNORM_SCALE: False, BIAS_ACTIVATION: False, BATCHNORM_RELU: False,
               BATCHNORM_ELTWISE: False}
"""A pycaffe net runs every layer by itself: no build-time fusion hides a blob."""


def net_args(args: tuple, kwargs: dict) -> tuple[str, int, int, list[str], str | None]:
    """pycaffe's two constructors: ``Net(file, phase, level=0, stages=None, weights=None)``
    (phase and weights also by keyword) and the older ``Net(file, weights, phase)``."""
    names = ("network_file", "phase", "level", "stages", "weights")
    if len(args) == 3 and isinstance(args[1], (str, Path)) and not kwargs:
        return str(args[0]), phase_of(args[2]), 0, [], str(args[1])
    if len(args) > len(names):
        raise PycaffeError(f"caffe.Net takes at most {len(names)} arguments "
                           f"({', '.join(names)}), got {len(args)}")
    given = dict(zip(names, args, strict=False))
    for key, value in kwargs.items():
        if key not in names:
            raise missing("caffe.Net(...) keyword", key, names)
        if key in given:
            raise PycaffeError(f"caffe.Net got '{key}' twice (by position and by keyword)")
        given[key] = value
    if "network_file" not in given or "phase" not in given:
        raise PycaffeError("caffe.Net needs the network file and a phase: caffe.Net(file, "
                           "caffe.TEST) or caffe.Net(file, weights, caffe.TEST)")
    weights = given.get("weights")
    return (str(given["network_file"]), phase_of(given["phase"]), int(given.get("level", 0)),
            [str(s) for s in given.get("stages") or []],
            None if weights is None else str(weights))


def phase_of(value: Any) -> int:
    if value in (TRAIN, TEST) and not isinstance(value, bool):
        return int(value)
    raise PycaffeError(f"phase must be caffe.TRAIN (0) or caffe.TEST (1), got {value!r}")


def check_file(path: str) -> None:
    """pycaffe's CheckFile: a file that does not open is 'Could not open file X'."""
    try:
        with open(path, "rb"):
            pass
    except OSError:
        raise PycaffeError(f"Could not open file {path}") from None


def build(spec: NetParameter, phase: str, stages: Iterable[str], level: int,
           device: torch.device | None = None, record: bool = True) -> CaffePyNet:
    """A caffe-py net for pycaffe: no fusions, fillers recorded for Caffe's stream."""
    options: dict[str, Any] = dict(NET_OPTIONS)
    if record:
        options[RECORD_FILLERS] = []
    return CaffePyNet(spec, phase, stages=stages, level=level,
                      device=device if device is not None else mode.device(), seed=0,
                      options=options)


def with_input_shapes(spec: NetParameter,
                       shapes: Mapping[str, tuple[int, ...]]) -> NetParameter:
    """``spec`` with its Input layers (and legacy inputs) declaring ``shapes``."""
    layers = []
    for layer in spec.layer:
        if layer.type == "Input":
            shape = [BlobShape(dim=list(shapes[t])) for t in layer.top]
            layer = dataclasses.replace(layer, params={**layer.params,
                                                       "input_param": InputParameter(shape)})
        layers.append(layer)
    legacy: dict[str, Any] = {}
    if spec.input:
        legacy = {"input_shape": [BlobShape(dim=list(shapes[n])) for n in spec.input],
                  "input_dim": []}
    return dataclasses.replace(spec, layer=layers, **legacy)


def prototxt_node(path: str, kind: str) -> Any:
    """A prototxt file (any suffix) of ``kind`` ('net' or 'solver') as the YAML mapping
    caffe-py reads; the nets a solver names are read the same way."""
    from ..spec import yamlio
    from ..tools.to_yaml import prototxt_as_yaml

    yamlio.FOREIGN.setdefault(".prototxt", prototxt_as_yaml)
    return yamlio.loads(prototxt_as_yaml(Path(path), kind), source=path)


def load_net_spec(path: str) -> NetParameter:
    """A net file as pycaffe reads it: a prototxt whatever its suffix (Caffe's paths, from
    the current directory), or a caffe-py YAML spec."""
    if path.endswith((".yaml", ".yml")):
        return api.net_spec(path)
    from ..spec.net_spec import parse_net
    from ..spec.schema import Source

    return parse_net(prototxt_node(path, "net"), Source.of(path))


def attach_feeds(net: CaffePyNet) -> Any:
    """Readers for a standalone net's Data layers (a solver attaches its own)."""
    if not net.data_layers():
        return None
    from ..io import ReaderPool, attach_feeds

    pool = ReaderPool(replicas=1)
    attach_feeds(net, pool, replica=0, device=net.device, seed=0)
    return pool


def read_weights(path: str) -> dict[str, list[torch.Tensor]]:
    """Caffe's CopyTrainedLayersFrom reads HDF5 for '.h5', else a binary NetParameter
    whatever the suffix; a caffe-py snapshot (.pt) is read as caffe-py reads it."""
    from ..solver import caffemodel, snapshot

    if path.endswith(".h5") or Path(path).suffix == ".pt":
        return snapshot.load_weights(path)
    try:
        return caffemodel.read_net(path)
    except CaffePyError:
        return snapshot.load_weights(path)
