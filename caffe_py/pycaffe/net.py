"""pycaffe's ``caffe.Net`` over caffe-py's Net: Caffe's layer list, blobs and passes.

A caffe-py Net computes with autograd and keeps no blobs between passes; a pycaffe script sees
Caffe's net instead: the layers after Caffe's InsertSplits (a blob read by several layers gets
a Split layer and ``<blob>_<layer>_<i>_split_<k>`` tops), every blob's memory in Caffe's blob
order, each layer run in turn from that memory (so a write to ``.data`` is what the next
forward reads, and ``forward(start=, end=)`` starts and stops anywhere), its tops written back
(an in-place ReLU leaves the post-ReLU values, as in Caffe), and a backward that writes every
blob's ``diff`` layer by layer from the top diffs in memory (a loss top's diff holds its loss
weight, as Caffe sets it). Layers run as caffe-py's; a layer that needs backward is recorded
with autograd during the forward and differentiated per layer during the backward.
"""
from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import NetError
from ..fileio import atomic_write_bytes
from ..layers.base import RECORD_FILLERS, Layer
from ..net import Net as CaffePyNet
from . import caffe_stream
from .blobs import (
    Capture,
    LayerView,
    NetBlob,
    ParamBlob,
    param_blobs,
    param_diff,
    pull_mirrors,
    push_mirrors,
    python_object,
)
from .errors import PycaffeError, missing
from .files import (
    PHASES,
    TEST,
    TRAIN,
    attach_feeds,
    build,
    check_file,
    load_net_spec,
    net_args,
    read_weights,
    with_input_shapes,
)
from .wiring import top_shapes, wire

log = logging.getLogger(__name__)


class Net:
    """pycaffe's ``caffe.Net`` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        network_file, phase, level, stages, weights = net_args(args, kwargs)
        check_file(network_file)
        spec = load_net_spec(network_file)
        self._bind(build(spec, PHASES[phase], stages, level), owner=None)
        if weights is not None:
            check_file(weights)
            self.copy_from(weights)

    @classmethod
    def of_solver(cls, net: CaffePyNet, solver: Any) -> Net:
        """The pycaffe view of a net a caffe-py Solver built (``solver.net``, ``test_nets``)."""
        view = cls.__new__(cls)
        view._bind(net, owner=solver)
        return view

    # --- building the view ---------------------------------------------------------------------
    def _bind(self, net: CaffePyNet, owner: Any) -> None:
        self._net = net
        self._owner = owner
        self._device = net.device
        self._before_fwd: list[Callable[[int], Any]] = []
        self._after_fwd: list[Callable[[int], Any]] = []
        self._before_bwd: list[Callable[[int], Any]] = []
        self._after_bwd: list[Callable[[int], Any]] = []
        self._tape: dict[int, tuple[list[torch.Tensor], tuple[torch.Tensor, ...]]] = {}
        wiring = wire(net)
        self._steps = wiring.steps
        self._names = wiring.names              # blob id -> name
        self._memory = wiring.memory            # blob id -> its memory
        self._input_ids, self._output_ids = wiring.input_ids, wiring.output_ids
        self._loss_weights = wiring.loss_weights
        caffe_stream.use_caffe_dropout(net)
        if owner is None:
            fills = net.ctx.options.get(RECORD_FILLERS, [])
            caffe_stream.refill(net, fills)
            fills.clear()  # the record holds the blobs first made: let shared ones go
            self._pool = attach_feeds(net)
            if self._pool is not None:
                weakref.finalize(self, self._pool.close)
        else:
            self._pool = None
            self._capture()
        self._cache: dict[str, Any] = {}

    def _capture(self) -> None:
        """A solver runs this net itself: its layers' outputs (and their gradients) go to the
        blobs' memory as they are computed, so that after ``solver.step`` the blobs hold the
        last batch, as Caffe's do."""
        for step in self._steps:
            if step.layer is None:
                continue
            tops = [self._memory[t] for t in step.tops]
            step.layer.register_forward_hook(Capture(tops))

    # --- pycaffe's properties --------------------------------------------------------------
    @property
    def _blob_names(self) -> list[str]:
        return list(self._names)

    @property
    def _layer_names(self) -> list[str]:
        return [s.name for s in self._steps]

    @property
    def _blobs(self) -> list[NetBlob]:
        blobs = self._cache.get("_blobs")
        if blobs is None:
            blobs = self._cache["_blobs"] = [NetBlob(m) for m in self._memory]
        return list(blobs)

    @property
    def blobs(self) -> OrderedDict[str, NetBlob]:
        """Blob name -> blob, in Caffe's order (input to output)."""
        if "blobs" not in self._cache:
            self._cache["blobs"] = OrderedDict(zip(self._names, self._blobs, strict=True))
        return self._cache["blobs"]

    @property
    def _blob_loss_weights(self) -> list[float]:
        return list(self._loss_weights)

    @property
    def blob_loss_weights(self) -> OrderedDict[str, float]:
        return OrderedDict(zip(self._names, self._loss_weights, strict=True))

    @property
    def layers(self) -> list[Any]:
        """pycaffe's layer list: a Python layer is the user's own object, as in Caffe."""
        if "layers" not in self._cache:
            self._cache["layers"] = [python_object(s) or LayerView(s) for s in self._steps]
        return list(self._cache["layers"])

    @property
    def layer_dict(self) -> OrderedDict[str, Any]:
        return OrderedDict(zip(self._layer_names, self.layers, strict=True))

    @property
    def params(self) -> OrderedDict[str, list[ParamBlob]]:
        """Layer name -> its blobs (weights, bias...), for the layers that have blobs."""
        if "params" not in self._cache:
            out: OrderedDict[str, list[ParamBlob]] = OrderedDict()
            for step in self._steps:
                if step.layer is not None and step.layer.blob_names:
                    out[step.name] = param_blobs(step)
            self._cache["params"] = out
        return self._cache["params"]

    @property
    def _inputs(self) -> list[int]:
        return list(self._input_ids)

    @property
    def _outputs(self) -> list[int]:
        return list(self._output_ids)

    @property
    def inputs(self) -> list[str]:
        return [self._names[i] for i in self._input_ids]

    @property
    def outputs(self) -> list[str]:
        return [self._names[i] for i in self._output_ids]

    def _top_ids(self, i: int) -> list[int]:
        return list(self._steps[i].tops)

    def _bottom_ids(self, i: int) -> list[int]:
        return list(self._steps[i].bottoms)

    @property
    def top_names(self) -> OrderedDict[str, list[str]]:
        return OrderedDict((s.name, [self._names[t] for t in s.tops]) for s in self._steps)

    @property
    def bottom_names(self) -> OrderedDict[str, list[str]]:
        return OrderedDict((s.name, [self._names[b] for b in s.bottoms]) for s in self._steps)

    # --- passes ----------------------------------------------------------------------------
    def forward(self, blobs: Sequence[str] | None = None, start: str | None = None,
                end: str | None = None, **kwargs: Any) -> dict[str, np.ndarray]:
        """pycaffe's forward: inputs by name (each batch-sized), layers ``start`` to ``end``
        (names, inclusive); returns the outputs (or ``end``'s tops) and ``blobs`` by name,
        as views of the blobs' memory."""
        blobs = list(blobs or [])
        start_ind = self._layer_index(start) if start is not None else 0
        if end is not None:
            end_ind = self._layer_index(end)
            outputs = set(self.top_names[end] + blobs)
        else:
            end_ind = len(self._steps) - 1
            outputs = set(self.outputs + blobs)
        if kwargs:
            if set(kwargs) != set(self.inputs):
                raise PycaffeError("Input blob arguments do not match net inputs.")
            for name, value in kwargs.items():
                if np.shape(value)[0] != self.blobs[name].shape[0]:
                    raise PycaffeError("Input is not batch sized")
                self.blobs[name].data[...] = value
        self._forward(start_ind, end_ind)
        return {out: self._blob(out).data for out in outputs}

    def backward(self, diffs: Sequence[str] | None = None, start: str | None = None,
                 end: str | None = None, **kwargs: Any) -> dict[str, np.ndarray]:
        """pycaffe's backward: top diffs of the outputs by name, layers ``start`` down to
        ``end``; returns the inputs' (or ``end``'s bottoms') diffs and ``diffs`` by name."""
        diffs = list(diffs or [])
        start_ind = self._layer_index(start) if start is not None else len(self._steps) - 1
        if end is not None:
            end_ind = self._layer_index(end)
            outputs = set(self.bottom_names[end] + diffs)
        else:
            end_ind = 0
            outputs = set(self.inputs + diffs)
        if kwargs:
            if set(kwargs) != set(self.outputs):
                raise PycaffeError("Top diff arguments do not match net outputs.")
            for name, value in kwargs.items():
                if np.shape(value)[0] != self.blobs[name].shape[0]:
                    raise PycaffeError("Diff is not batch sized")
                self.blobs[name].diff[...] = value
        self._backward(start_ind, end_ind)
        return {out: self._blob(out).diff for out in outputs}

    def forward_all(self, blobs: Sequence[str] | None = None,
                    **kwargs: Any) -> dict[str, np.ndarray]:
        """Forward the inputs in batches of the net's batch size (the last one padded);
        every output (and ``blobs``) for all of them."""
        all_outs: dict[str, list] = {out: [] for out in set(self.outputs + list(blobs or []))}
        for batch in self._batch(kwargs):
            outs = self.forward(blobs=blobs, **batch)
            for out, value in outs.items():
                all_outs[out].extend(value.copy())
        arrays = {out: np.asarray(values) for out, values in all_outs.items()}
        pad = len(next(iter(arrays.values()))) - len(next(iter(kwargs.values())))
        if pad:
            arrays = {out: value[:-pad] for out, value in arrays.items()}
        return arrays

    def forward_backward_all(self, blobs: Sequence[str] | None = None,
                             diffs: Sequence[str] | None = None,
                             **kwargs: Any) -> tuple[dict[str, np.ndarray],
                                                     dict[str, np.ndarray]]:
        """Forward and backward in batches: (outputs and ``blobs``, input diffs and
        ``diffs``), as pycaffe's."""
        all_outs: dict[str, list] = {o: [] for o in set(self.outputs + list(blobs or []))}
        all_diffs: dict[str, list] = {d: [] for d in set(self.inputs + list(diffs or []))}
        forward = list(self._batch({k: kwargs[k] for k in self.inputs if k in kwargs}))
        backward = list(self._batch({k: kwargs[k] for k in self.outputs if k in kwargs}))
        for k in range(max(len(forward), len(backward))):
            fb = forward[k] if k < len(forward) else {}
            bb = backward[k] if k < len(backward) else {}
            for out, value in self.forward(blobs=blobs, **fb).items():
                all_outs[out].extend(value.copy())
            for name, value in self.backward(diffs=diffs, **bb).items():
                all_diffs[name].extend(value.copy())
        outs = {k: np.asarray(v) for k, v in all_outs.items()}
        grads = {k: np.asarray(v) for k, v in all_diffs.items()}
        pad = len(next(iter(outs.values()))) - len(next(iter(kwargs.values())))
        if pad:
            outs = {k: v[:-pad] for k, v in outs.items()}
            grads = {k: v[:-pad] for k, v in grads.items()}
        return outs, grads

    def _batch(self, blobs: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """The inputs cut in batches of the net's batch size, the last padded with zeros."""
        if not blobs:
            return
        num = len(next(iter(blobs.values())))
        batch_size = next(iter(self.blobs.values())).shape[0]
        for b in range(num // batch_size):
            i = b * batch_size
            yield {name: blobs[name][i:i + batch_size] for name in blobs}
        remainder = num % batch_size
        if remainder:
            padded = {}
            for name, value in blobs.items():
                value = np.asarray(value)
                padding = np.zeros((batch_size - remainder,) + value.shape[1:])
                padded[name] = np.concatenate([value[-remainder:], padding])
            yield padded

    def _forward(self, start: int, end: int) -> float:
        """Caffe's ForwardFromTo(start, end): run layers ``start`` to ``end`` (inclusive) over
        the blobs' memory; returns the loss of the layers run."""
        self._prepare()
        loss = 0.0
        for i in range(start, end + 1):
            for callback in self._before_fwd:
                callback(i)
            loss += self._run(i)
            for callback in self._after_fwd:
                callback(i)
        pull_mirrors()  # a GPU net's statistics (BatchNorm) may have changed
        return loss

    def _backward(self, start: int, end: int) -> None:
        """Caffe's BackwardFromTo(start, end): layers ``start`` down to ``end``, each one that
        needs backward writing its bottoms' diffs and adding to its parameters' diffs."""
        push_mirrors()
        for i in range(start, end - 1, -1):
            for callback in self._before_bwd:
                callback(i)
            if self._steps[i].need_backward:
                self._run_backward(i)
            for callback in self._after_bwd:
                callback(i)

    def _prepare(self) -> None:
        """Before layers run: the solver's readers started, shared weights bound, and the net
        rebuilt if an input blob was given another image size."""
        if self._owner is not None:
            self._owner._solver.start()
        elif self._pool is not None:
            self._pool.start()
        self._rebuild_for_inputs(batch_too=False)
        self._net.bind_shared()
        push_mirrors()  # a script's writes into a GPU net's weights

    def _run(self, i: int) -> float:
        step = self._steps[i]
        if step.layer is None:  # a Split: its tops share the bottom's data, diffs of its shape
            shape = tuple(self._memory[step.bottoms[0]].data.shape)
            for top in step.tops:
                self._memory[top].reshape(shape)
            return 0.0
        if step.type == "Input":  # the data written into the input blobs stay
            return 0.0
        record = step.need_backward and torch.is_grad_enabled()
        bottoms = []
        for j, blob in enumerate(step.bottoms):
            value = self._memory[blob].data.to(self._device)
            if record:  # a copy: the layer's own top may overwrite this memory (in place)
                value = value.detach().clone().requires_grad_(step.bottom_need[j])
            bottoms.append(value)
        with torch.set_grad_enabled(record):
            try:
                out = step.layer.forward(*bottoms)
            except RuntimeError as exc:
                raise NetError(f"layer '{step.name}' ({step.type}): forward failed: "
                               f"{_first_line(exc)}") from None
        outs = () if out is None else (out,) if isinstance(out, torch.Tensor) else tuple(out)
        for top, value in zip(step.tops, outs, strict=True):
            self._memory[top].put(value)
        if record:
            self._tape[i] = (bottoms, outs)
        else:
            self._tape.pop(i, None)
        return sum(float(w) * float(o.detach().float().sum())
                   for w, o in zip(step.loss, outs, strict=True) if w)

    def _run_backward(self, i: int) -> None:
        step = self._steps[i]
        if step.layer is None:  # Split: the bottom's diff is the sum of the tops' diffs
            if step.bottom_need and step.bottom_need[0]:
                total = sum((self._memory[t].diff for t in step.tops), torch.zeros(()))
                self._memory[step.bottoms[0]].put_diff(total)
            return
        if step.type == "Input" or not (step.bottoms or any(
                isinstance(b, torch.nn.Parameter) for b in step.layer.blobs())):
            return  # nothing below it (an Input's backward does nothing in Caffe)
        tape = self._tape.get(i)
        if tape is None:
            raise PycaffeError(f"net.backward: layer '{step.name}' ({step.type}) has not run "
                               "forward since the net was made; call net.forward() first")
        bottoms, outs = tape
        pairs = [(o, self._memory[t].diff) for t, o in zip(step.tops, outs, strict=True)
                 if o.requires_grad]
        if not pairs:
            return
        wanted = [(j, x) for j, x in enumerate(bottoms) if x.requires_grad]
        params = [p for p in step.layer.blobs() if isinstance(p, torch.nn.Parameter)
                  and p.requires_grad]
        targets: list[torch.Tensor] = [x for _, x in wanted]
        targets += params
        grads = torch.autograd.grad(
            [o for o, _ in pairs], targets,
            [d.to(o.device, o.dtype).reshape(o.shape) for o, d in pairs],
            retain_graph=True, allow_unused=True)
        for (j, _), grad in zip(wanted, grads, strict=False):
            if grad is not None:
                self._memory[step.bottoms[j]].put_diff(grad)
        for param, grad in zip(params, grads[len(wanted):], strict=True):
            if grad is not None:
                param_diff(param).add_(grad.detach().to("cpu", torch.float32))

    def _layer_index(self, name: str) -> int:
        names = self._layer_names
        if name not in names:
            raise PycaffeError(f"'{name}' is not a layer of net '{self._net.name}' (its layers: "
                               f"{', '.join(names)})")
        return names.index(name)

    def _blob(self, name: str) -> NetBlob:
        blobs = self.blobs
        if name not in blobs:
            raise PycaffeError(f"'{name}' is not a blob of net '{self._net.name}' (its blobs: "
                               f"{', '.join(blobs)})")
        return blobs[name]

    # --- shapes ---------------------------------------------------------------------------
    def reshape(self) -> None:
        """Caffe's Net::Reshape: every blob takes the shape its layer gives it for the input
        blobs' present shapes (the net is set up again for them when they changed)."""
        self._rebuild_for_inputs(batch_too=True)
        for step in self._steps:
            if step.layer is None or step.type == "Input":
                continue
            for top, shape in zip(step.tops, top_shapes(step), strict=False):
                self._memory[top].reshape(shape)

    def _built_inputs(self) -> list[tuple[str, tuple[int, ...]]]:
        """Each Input top's name and the shape the caffe-py net was built for."""
        return [(self._names[top], tuple(built)) for step in self._steps
                if step.type == "Input" and step.layer is not None
                for top, built in zip(step.tops, step.layer.top_shapes, strict=True)]

    def _rebuild_for_inputs(self, batch_too: bool) -> None:
        """Set the caffe-py net up again when an input blob's shape differs from the one it
        was built for beyond the batch axis (or at all, with ``batch_too``), sharing every
        blob with the old one; the batch axis alone needs nothing (layers take any batch)."""
        changed = False
        shapes: dict[str, tuple[int, ...]] = {}
        for step in self._steps:
            if step.type != "Input" or step.layer is None:
                continue
            for top, built in zip(step.tops, step.layer.top_shapes, strict=True):
                now = tuple(self._memory[top].data.shape)
                shapes[self._names[top]] = now
                if now != tuple(built) and (batch_too or now[1:] != tuple(built)[1:]
                                            or len(now) != len(built)):
                    changed = True
        if not changed:
            return
        old = self._net
        new = build(with_input_shapes(old.spec, shapes), old.phase, old.stages, old.level,
                     device=old.device, record=False)
        as_built = {name: "x".join(map(str, dims)) for name, dims in self._built_inputs()}
        wanted = ", ".join(f"{name} {'x'.join(map(str, dims))}" for name, dims in
                           shapes.items() if "x".join(map(str, dims)) != as_built.get(name))
        back = ", ".join(f"{name} {dims}" for name, dims in as_built.items())
        new.share_weights_with(old, fix=f"the inputs' new shapes ({wanted}) change this "
                                        f"layer's weights; reshape the inputs back to {back}")
        caffe_stream.use_caffe_dropout(new)
        by_name: dict[str, list[Layer]] = {}
        for layer in new.layers:
            by_name.setdefault(layer.name, []).append(layer)
        for step in self._steps:
            if step.layer is not None:
                step.layer = by_name[step.name].pop(0)
        self._net = new
        self._tape.clear()
        self._cache.pop("layers", None)
        self._cache.pop("params", None)

    # --- weights --------------------------------------------------------------------------
    def copy_from(self, path: str) -> None:
        """Caffe's CopyTrainedLayersFrom: weights by layer name from a .caffemodel (or
        Caffe's HDF5 weights, or a caffe-py snapshot)."""
        check_file(path)
        self._net.copy_from(read_weights(path), source=path)
        pull_mirrors()

    def share_with(self, other: Net) -> None:
        """Caffe's ShareTrainedLayersWith: use ``other``'s blobs for same-named layers."""
        owner = self._owner
        if owner is not None and other is owner.net and self in owner.test_nets:
            owner.share_tests()  # a solver's TEST net: as its first test pass would
        else:
            self._net.share_weights_with(other._net)
        self._cache.pop("params", None)

    def save(self, path: str) -> None:
        """Write the weights as a binary NetParameter (a .caffemodel that Caffe reads)."""
        from ..solver.caffemodel import encode_net

        types = {layer.name: layer.spec.type for layer in self._net.layers}
        atomic_write_bytes(Path(path), encode_net(self._net.name, self._net.layer_blobs(),
                                                  types))

    def save_hdf5(self, path: str) -> None:
        """Write the weights in Caffe's HDF5 layout."""
        from ..solver import hdf5_snapshot

        hdf5_snapshot.save_weights(self._net.layer_blobs(), Path(path),
                                   [layer.name for layer in self._net.layers])

    def load_hdf5(self, path: str) -> None:
        """Copy weights from Caffe's HDF5 layout, by layer name."""
        from ..solver import hdf5_snapshot

        check_file(path)
        self._net.copy_from(hdf5_snapshot.load_weights(Path(path)), source=path)
        pull_mirrors()

    def clear_param_diffs(self) -> None:
        """Zero every learnable blob's diff (what a solver does before each iteration)."""
        for step in self._steps:
            if step.layer is not None:
                for blob in step.layer.blobs():
                    param_diff(blob).zero_()

    def set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        """Give a MemoryData first layer its rows (pycaffe's checks: float32, C-contiguous,
        4-D data, labels of one value per row)."""
        if labels.ndim == 1:
            labels = np.ascontiguousarray(labels[:, np.newaxis, np.newaxis, np.newaxis])
        self._set_input_arrays(data, labels)

    def _set_input_arrays(self, data: np.ndarray, labels: np.ndarray) -> None:
        for name, array in (("data array", data), ("labels array", labels)):
            if not array.flags["C_CONTIGUOUS"]:
                raise PycaffeError(f"{name} must be C contiguous")
            if array.ndim != 4:
                raise PycaffeError(f"{name} must be 4-d")
            if array.dtype != np.float32:
                raise PycaffeError(f"{name} must be float32")
        if data.shape[0] != labels.shape[0]:
            raise PycaffeError("data and labels must have the same first dimension")
        self._net.set_input_arrays(torch.from_numpy(data), torch.from_numpy(labels.reshape(-1)))

    # --- callbacks ------------------------------------------------------------------------
    def before_forward(self, callback: Callable[[int], Any]) -> None:
        self._before_fwd.append(callback)

    def after_forward(self, callback: Callable[[int], Any]) -> None:
        self._after_fwd.append(callback)

    def before_backward(self, callback: Callable[[int], Any]) -> None:
        self._before_bwd.append(callback)

    def after_backward(self, callback: Callable[[int], Any]) -> None:
        self._after_bwd.append(callback)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_net", "_steps", "_cache", "_owner"):
            raise AttributeError(name)
        raise missing("caffe.Net", name, [n for n in dir(type(self)) if not n.startswith("__")])

    def __repr__(self) -> str:
        return f"<caffe.Net '{self._net.name}' ({self._net.phase}), {len(self._steps)} layers>"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


__all__ = ["Net", "TRAIN", "TEST", "PycaffeError", "LayerView", "check_file", "load_net_spec"]
