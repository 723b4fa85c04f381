"""caffe-py from Python: nets for inference, deploy nets from train/test specs, training.

    import caffe_py
    net = caffe_py.load_net("deploy.yaml", weights="lenet_iter_10000.caffemodel")
    out = caffe_py.predict(net, data=images)          # {"prob": (N, 10) numpy array}

Specs are YAML files or Caffe prototxts; weights are caffe-py snapshots (``.pt``), Caffe's
``.caffemodel`` or its HDF5 weights. docs/python.md has runnable examples.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .errors import NetError
from .net import Net
from .spec import yamlio
from .spec.net_spec import LayerParameter, NetParameter, parse_layer
from .spec.net_spec import load_net as load_net_spec
from .spec.schema import Source

if TYPE_CHECKING:
    from .solver.solver import Solver

DATA_TYPES = frozenset({"Data", "ImageData", "HDF5Data", "WindowData", "MemoryData",
                        "DummyData", "Input"})
"""Layer types that bring data into a net (a deploy net replaces them by one Input)."""


def net_spec(spec: str | Path | NetParameter) -> NetParameter:
    """A net spec from a YAML file, a Caffe prototxt, or as given (parsed already)."""
    if isinstance(spec, NetParameter):
        return spec
    if Path(spec).suffix.lower() == ".prototxt" and ".prototxt" not in yamlio.FOREIGN:
        from .tools.to_yaml import prototxt_as_yaml

        yamlio.FOREIGN[".prototxt"] = prototxt_as_yaml
    return load_net_spec(spec)


def load_net(spec: str | Path | NetParameter, weights: str | Path | None = None, *,
             phase: str = "TEST", device: str | torch.device = "cpu",
             stages: Iterable[str] = ()) -> Net:
    """A net built from ``spec`` (a file or a parsed spec) for ``phase``, with ``weights``
    copied in by layer name, in eval mode."""
    from .solver.snapshot import load_weights

    net = Net(net_spec(spec), phase, device=device, stages=stages)
    if weights is not None:
        net.copy_from(load_weights(weights), source=weights)
    return net.eval()


def deploy_spec(spec: str | Path | NetParameter,
                input_shapes: Mapping[str, Sequence[int]]) -> NetParameter:
    """The deploy net of a train/test spec, as Caffe users write deploy.prototxt: its TEST
    layers, the data layers replaced by one Input layer with ``input_shapes`` (blob ->
    shape, e.g. ``{"data": (1, 3, 224, 224)}``), the layers that need what is gone (labels)
    dropped, and a SoftmaxWithLoss that lost its labels made a Softmax with top ``prob``."""
    net = net_spec(spec)
    kept = [layer for layer in net.layer if layer.kept_for("TEST") and layer.type not in
            DATA_TYPES]
    data_tops = {top for layer in net.layer if layer.type in DATA_TYPES for top in layer.top}
    unknown = [name for name in input_shapes if name not in data_tops]
    if unknown:
        raise NetError(f"deploy: '{unknown[0]}' is not a data layer's top (those are: "
                       f"{', '.join(sorted(data_tops))})")
    layers = [parse_layer({"name": "input", "type": "Input", "top": list(input_shapes),
                           "input_param": {"shape": [{"dim": [int(d) for d in shape]}
                                                     for shape in input_shapes.values()]}},
                          Source(), "layer")]
    available = set(input_shapes)
    for layer in kept:
        deployed = _deployed(layer, available)
        if deployed is not None:
            layers.append(deployed)
            available.update(deployed.top)
    return dataclasses.replace(net, layer=layers, state=None)


def _deployed(layer: LayerParameter, available: set[str]) -> LayerParameter | None:
    """The layer in the deploy net, or None when it needs a blob that is gone."""
    if all(b in available for b in layer.bottom):
        return layer
    if layer.type == "SoftmaxWithLoss" and layer.bottom and layer.bottom[0] in available:
        return parse_layer({"name": layer.name, "type": "Softmax", "bottom": [layer.bottom[0]],
                            "top": ["prob"]}, Source(), "layer")
    return None


def predict(net: Net, **inputs: Any) -> dict[str, np.ndarray]:
    """Run ``net`` forward on numpy arrays or tensors (by input blob name); its outputs as
    numpy arrays, by name."""
    device = net.device
    feed = {name: torch.as_tensor(np.asarray(value) if not isinstance(value, torch.Tensor)
                                  else value, dtype=torch.float32).to(device)
            for name, value in inputs.items()}
    with torch.no_grad():
        out = net(feed)
    return {name: value.detach().cpu().numpy() for name, value in out.outputs.items()}


def train_solver(solver: str | Path, *, devices: str | Sequence[Any] | None = None,
                 sets: Sequence[str] = (), inputs: Mapping[str, Any] | None = None,
                 test_inputs: Mapping[str, Any] | None = None, **options: Any) -> Solver:
    """Train as ``cpy train`` does, with the same checks, files and lines: the solver file with
    ``sets`` overrides (``KEY=VALUE``, as ``--set``) on ``devices`` (``--gpus`` text such as
    "0,1" or "cpu:2", a list of devices, or None: the solver's solver_mode and device_id, as
    the command); ``options`` are :class:`~caffe_py.options.TrainOptions` fields (weights,
    snapshot="latest" or a state, overwrite=True, precision...). ``inputs`` trains on arrays
    from Python: numpy arrays (or tensors) by top name for the TRAIN net's MemoryData layer,
    e.g. ``{"data": x, "label": y}`` with x (N, C, H, W) and y (N,), N a multiple of its
    batch_size (several replicas take rows i, i+R, ...; the read position is saved in the
    solver state, so a resume reads on exactly); ``test_inputs`` the same for the TEST nets.
    The log lines go to stderr unless logging is configured (``logging.basicConfig`` or a
    handler on "caffe_py"). Returns the trained root Solver (its ``net``, ``iter``,
    ``last_test``)."""
    from .logs import lines_to_stderr
    from .options import TrainOptions
    from .train import train

    with lines_to_stderr():
        return train(solver, devices, TrainOptions(inputs=inputs, test_inputs=test_inputs,
                                                   **options), sets=sets)
