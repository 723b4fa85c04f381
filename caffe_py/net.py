"""The Net: Caffe's Net::Init and Forward over a NetParameter, with PyTorch autograd.

A net is built for one phase (TRAIN or TEST), level and set of stages: layers whose
include/exclude rules do not match are dropped, then each kept layer is built in order with
the shapes of its bottoms (shape inference happens here, so a bad net fails before any data
flows). Blobs are named; a top equal to its bottom at the same index is in place and just
rebinds the name. Learnable blobs with the same ``param.name`` are one tensor (Caffe's weight
sharing). The loss is Caffe's: the sum over weighted tops of ``loss_weight * top.sum()``.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import types
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, cast, overload

import torch
from torch import nn
from torch.nn.modules import module as _nn_module

from .errors import DataError, NetError, one_line
from .layers import registry
from .layers.base import BuildContext, DeviceCheck, Layer, Shape
from .layers.data import Input
from .net_weights import CopyResult, WeightsMixin
from .passes import (
    fuse_batchnorm_eltwise,
    fuse_batchnorm_relu,
    fuse_batchnorm_scale,
    fuse_bias_activation,
)
from .spec.layer_params.data import InputParameter
from .spec.net_spec import BlobShape, LayerParameter, NetParameter, ParamSpec
from .spec.schema import is_set, location, message_at, place, suggest

log = logging.getLogger(__name__)
AUTOMATIC = "(automatic)"
"""The name Caffe gives the top it adds to a loss layer written without one (AutoTopBlobs)."""


_DEFAULT_OPTIONS: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "net_options", default=types.MappingProxyType({}))


@contextlib.contextmanager
def default_options(options: Mapping[str, Any]) -> Iterator[None]:
    """Net options for every net built inside the block (those built by a Solver included),
    under each net's own ``options``."""
    token = _DEFAULT_OPTIONS.set({**_DEFAULT_OPTIONS.get(), **options})
    try:
        yield
    finally:
        _DEFAULT_OPTIONS.reset(token)


@dataclass
class NetOutput:
    """What one forward pass gives."""

    loss: torch.Tensor
    """Scalar: sum of loss_weight * top.sum() over every weighted top (0 when none)."""
    outputs: dict[str, torch.Tensor]
    """Every top no later layer consumes, sorted by name as Caffe numbers them."""


@dataclass
class LearnableParam:
    """One learnable blob as the solver sees it (a shared blob is listed once, by its owner).

    A blob with ``lr_mult == 0`` is frozen: its ``requires_grad`` is False, so its ``grad``
    stays None (Caffe computes no gradient for it either).
    """

    name: str
    """'<owner layer>/<blob index>', e.g. 'conv1/0' for conv1's weights."""
    param: nn.Parameter
    lr_mult: float
    decay_mult: float


@dataclass
class SummaryRow:
    """One line of ``cpy net``: a layer, its tops with shapes, and its own parameter count."""

    name: str
    type: str
    tops: list[tuple[str, Shape]]
    params: int
    """Learnable values this layer owns (a blob it shares from another layer counts there)."""


@dataclass
class _Blob:
    """Where one Caffe blob of one layer lives, and how the solver treats it."""

    layer: Layer
    index: int
    attr: str
    lr_mult: float = 1.0
    decay_mult: float = 1.0
    owner: _Blob | None = None
    """The blob this one shares (None: it owns its tensor)."""


class LayerList(nn.ModuleList):
    """The net's layers in build order: an ``nn.ModuleList`` whose items are Layers.
    :attr:`version` counts its changes (the net's forward plan follows it)."""

    version = 0

    def __setitem__(self, idx: int, module: nn.Module) -> None:
        super().__setitem__(idx, module)
        self.version += 1

    def __delitem__(self, idx: int | slice) -> None:
        super().__delitem__(idx)
        self.version += 1

    def insert(self, index: int, module: nn.Module) -> None:
        super().insert(index, module)
        self.version += 1

    def append(self, module: nn.Module) -> LayerList:
        super().append(module)
        self.version += 1
        return self

    def extend(self, modules) -> LayerList:
        super().extend(modules)
        self.version += 1
        return self

    def __iter__(self) -> Iterator[Layer]:
        return cast("Iterator[Layer]", super().__iter__())

    @overload
    def __getitem__(self, idx: slice) -> LayerList: ...

    @overload
    def __getitem__(self, idx: int) -> Layer: ...

    def __getitem__(self, idx: int | slice) -> Layer | LayerList:
        return cast("Layer | LayerList", super().__getitem__(idx))


class Net(WeightsMixin, nn.Module):
    """A Caffe net built for one phase; call it with the net's inputs to run forward."""

    layers: LayerList  # type: ignore[assignment]  # the mixin's Sequence[Layer], made here

    def __init__(self, spec: NetParameter, phase: str | None = None, *,
                 stages: Iterable[str] = (), level: int | None = None,
                 device: str | torch.device = "cpu", seed: int = 0,
                 options: Mapping[str, Any] | None = None):
        super().__init__()
        state = spec.state
        phase = phase or (state.phase if state is not None else "TRAIN")
        if phase not in ("TRAIN", "TEST"):
            raise NetError(f"phase '{phase}' is not TRAIN or TEST")
        self.spec = spec
        self.name = spec.name
        self.phase = phase
        """The net's phase: as given, else the spec's ``state.phase``, else TRAIN."""
        self.stages = frozenset(stages) | frozenset(state.stage if state is not None else ())
        """The given stages and the spec's ``state.stage`` (Caffe adds them up)."""
        self.level = level if level is not None else (state.level if state is not None else 0)
        self.device = torch.device(device)
        self.ctx = BuildContext(phase=phase, device=self.device,
                                generator=torch.Generator().manual_seed(seed),
                                options={**_DEFAULT_OPTIONS.get(), **(options or {})})
        self.layers = LayerList()
        self._plan: list = []
        self._plan_key = -1
        self.blobs: dict[str, Shape] = {}
        """Every blob name -> its shape at build time (an in-place blob: its last shape)."""
        self._loss_weights: list[tuple[str, float]] = []
        self._blob_refs: list[_Blob] = []
        self._rebinds: list[tuple[Layer, str, Layer, str]] = []
        self._views: list[tuple[_Blob, _Blob, Shape]] = []  # (sharer, owner, sharer's shape)
        self.input_names: list[str] = []
        self.output_names: list[str] = []
        """The net's outputs (tops no later layer consumes), sorted by name: Caffe keeps its
        available blobs in a std::set, so ``Train net output #0`` is the first by name."""
        self._automatic: set[str] = set()
        self.register_state_dict_post_hook(_keys_by_layer_name)
        self.register_load_state_dict_pre_hook(_keys_by_position)
        self._build(self._kept_layers())
        self.fused: list[tuple[str, str]] = fuse_bias_activation(self)
        """(producer, activation) pairs whose bias add runs inside the activation kernel."""
        self.fused_norm: list[tuple[str, str]] = fuse_batchnorm_scale(self)
        """(BatchNorm, Scale) pairs run as one batch_norm with the Scale's blobs as affine."""
        self.fused_relu: list[tuple[str, str]] = fuse_batchnorm_relu(self)
        """(BatchNorm, ReLU) pairs whose ReLU the BatchNorm applies (the fused kernels on a
        GPU)."""
        self.fused_sum: list[tuple[str, str, str | None]] = fuse_batchnorm_eltwise(self)
        """(BatchNorm, Eltwise, ReLU or None): the Eltwise applies the BatchNorm to one bottom,
        sums, and applies the ReLU (the fused kernels on a GPU)."""

    # --- building ---------------------------------------------------------------------------
    def _kept_layers(self) -> list[LayerParameter]:
        """Caffe's FilterNet, plus the legacy ``input`` fields as an Input layer first.

        Two layers may share a name, as in Caffe; weights files and the TEST net's sharing
        then reach only the first of them (see :meth:`copy_from`), which a warning says when
        the later one has blobs of its own.
        """
        kept = [lp for lp in self.spec.layer if lp.kept_for(self.phase, self.level, self.stages)]
        legacy = self._legacy_input()
        return ([legacy] if legacy is not None else []) + kept

    def _legacy_input(self) -> LayerParameter | None:
        """``input`` + ``input_shape`` / ``input_dim`` become an Input layer named 'input'."""
        spec = self.spec
        if not spec.input:
            return None
        shapes = [list(s.dim) for s in spec.input_shape]
        if spec.input_dim:
            if shapes or len(spec.input_dim) != 4 * len(spec.input):
                raise NetError(message_at(
                    spec, f"{len(spec.input)} input(s) need {4 * len(spec.input)} input_dim "
                          f"values, got {len(spec.input_dim)}"
                    if not shapes else "input_shape and input_dim are both set",
                    "give input_shape (one per input) or 4 input_dim per input"))
            shapes = [spec.input_dim[4 * i:4 * i + 4] for i in range(len(spec.input))]
        if len(shapes) != len(spec.input):
            raise NetError(message_at(spec, f"{len(spec.input)} input(s) but {len(shapes)} "
                                            "shapes", "give one input_shape per input"))
        layer = LayerParameter(name="input", type="Input", top=list(spec.input))
        layer.params = {"input_param": InputParameter(shape=[BlobShape(dim=d) for d in shapes])}
        return place(layer, location(spec, "input"))

    def _build(self, layer_specs: list[LayerParameter]) -> None:
        producers: dict[str, LayerParameter] = {}   # blob name -> layer that last wrote it
        available: dict[str, None] = {}              # tops nobody has consumed yet, in order
        params_by_name: dict[str, _Blob] = {}
        for i, lp in enumerate(layer_specs):
            bottom_shapes = [self._bottom_shape(lp, k, layer_specs, i)
                             for k in range(len(lp.bottom))]
            cls = registry.lookup(lp.type)
            named = len(lp.top)
            lp = self._with_automatic_tops(lp, cls)
            self._check_wiring(lp, producers)
            layer = self._build_layer(cls, lp, bottom_shapes)
            self.layers.append(layer)
            for name in lp.bottom:
                available.pop(name, None)
            for j, (name, shape) in enumerate(zip(lp.top, layer.top_shapes, strict=True)):
                self.blobs[name] = shape
                weight = _loss_weight(layer, j)
                if weight != 0.0:
                    self._loss_weights.append((name, weight))
                if j >= named:  # an automatic top: no later layer may read it, not an output
                    continue
                producers[name] = lp
                available[name] = None
            if lp.type == "Input":
                self.input_names.extend(lp.top)
            self._register_blobs(layer, params_by_name)
        self.output_names = sorted(available)
        self._warn_shadowed_names()

    def _with_automatic_tops(self, lp: LayerParameter, cls: type[Layer]) -> LayerParameter:
        """Caffe's AutoTopBlobs: a loss layer written with fewer tops than it needs (none)
        gets anonymous ones, which carry its loss but feed no layer and are no output."""
        need = cls.tops[0] - len(lp.top)
        if not cls.is_loss or need <= 0:
            return lp
        tops = []
        for _ in range(need):
            name, k = AUTOMATIC, 1
            while name in self.blobs or name in tops:
                k += 1
                name = f"{AUTOMATIC}#{k}"
            tops.append(name)
        self._automatic.update(tops)
        return dataclasses.replace(lp, top=list(lp.top) + tops)

    def _build_layer(self, cls: type[Layer], lp: LayerParameter,
                     bottom_shapes: list[Shape]) -> Layer:
        try:
            return cls(lp, bottom_shapes, self.ctx)
        except DataError as exc:  # e.g. a Data layer's database is missing: say which layer
            raise DataError(message_at(lp, str(exc), named=True)) from None

    def _warn_shadowed_names(self) -> None:
        """A later layer with blobs whose name an earlier layer has: no weights file reaches
        its blobs (Caffe's CopyTrainedLayersFrom stops at the first layer of a name)."""
        first: dict[str, Layer] = {}
        for layer in self.layers:
            earlier = first.setdefault(layer.name, layer)
            if earlier is not layer and layer.blob_names:
                log.warning("Warning: " + message_at(
                    layer.spec, f"an earlier layer ({earlier.spec.where()}) has this name, so "
                                "weights files and the TEST net's sharing reach only that one "
                                "(as in Caffe): this layer's blobs are never loaded",
                    "give the layer its own name", named=True))

    def _bottom_shape(self, lp: LayerParameter, k: int, layer_specs: list[LayerParameter],
                      at: int) -> Shape:
        """The shape of bottom ``k`` of ``lp`` (layer ``at`` of ``layer_specs``)."""
        name = lp.bottom[k]
        if name in self.blobs and name not in self._automatic:
            return self.blobs[name]
        problem = f"Unknown bottom blob '{name}' (layer '{lp.name}', bottom index {k})"
        producer = next((x for x in layer_specs[at + 1:] if name in x.top), None)
        if producer is not None:
            raise NetError(message_at(
                lp, f"{problem}: only the later layer '{producer.name}' ({producer.where()}) "
                    "produces it",
                "a layer reads only blobs produced above it: move it below "
                f"'{producer.name}' or break the cycle", key="bottom"))
        dropped = next((x for x in self.spec.layer if name in x.top
                        and not x.kept_for(self.phase, self.level, self.stages)), None)
        if dropped is not None:
            raise NetError(message_at(
                lp, f"{problem}: only layer '{dropped.name}' ({dropped.where()}) produces it, "
                    f"and its include/exclude rules leave it out of the {self.phase} net",
                "make both layers belong to the same phases", key="bottom"))
        readable = [b for b in self.blobs if b not in self._automatic]
        near = suggest(name, readable)
        hint = f"did you mean '{near}'?" if near else \
            "name a top of an earlier layer in this phase"
        known = ", ".join(readable) or "none"
        raise NetError(message_at(lp, problem, f"{hint} (blobs so far: {known})", key="bottom"))

    def _check_wiring(self, lp: LayerParameter, producers: dict[str, LayerParameter]) -> None:
        for j, name in enumerate(lp.top):
            in_place = j < len(lp.bottom) and lp.bottom[j] == name
            if name in lp.top[:j]:
                raise NetError(message_at(
                    lp, f"Top blob '{name}' produced by multiple sources: it is named twice in "
                        "this layer's tops", "give each top its own name", key="top",
                    named=True))
            if name in producers and not in_place:
                first = producers[name]
                raise NetError(message_at(
                    lp, f"Top blob '{name}' produced by multiple sources: layer '{first.name}' "
                        f"({first.where()}) already produces it",
                    "rename one of the tops; in place needs top[k] == bottom[k]", key="top",
                    named=True))
        if lp.propagate_down and len(lp.propagate_down) != len(lp.bottom):
            raise NetError(message_at(
                lp, f"propagate_down has {len(lp.propagate_down)} entries for "
                    f"{len(lp.bottom)} bottoms", "give one per bottom, or none",
                key="propagate_down", named=True))
        if lp.loss_weight and len(lp.loss_weight) != len(lp.top):
            raise NetError(message_at(
                lp, f"loss_weight has {len(lp.loss_weight)} entries for {len(lp.top)} tops",
                "give one per top, or none", key="loss_weight", named=True))

    def _register_blobs(self, layer: Layer, params_by_name: dict[str, _Blob]) -> None:
        """Caffe's AppendParam: multipliers per blob, sharing by ``param.name``."""
        specs = layer.spec.param
        if len(specs) > len(layer.blob_names):
            raise NetError(message_at(
                layer.spec, f"{len(specs)} param entries for {len(layer.blob_names)} blob(s) "
                            f"({', '.join(layer.blob_names) or 'none'})",
                "give at most one param entry per blob, in blob order", key="param",
                named=True))
        for index, attr in enumerate(layer.blob_names):
            ps = specs[index] if index < len(specs) else ParamSpec()
            ref = _Blob(layer, index, attr, ps.lr_mult, ps.decay_mult)
            owner = params_by_name.get(ps.name) if ps.name else None
            if owner is None:
                if ps.name:
                    params_by_name[ps.name] = ref
            else:
                self._share(ref, ps, owner)
            tensor = getattr(layer, attr)
            if isinstance(tensor, nn.Parameter) and ref.owner is None and ref.lr_mult == 0:
                tensor.requires_grad_(False)
            self._blob_refs.append(ref)

    def _share(self, ref: _Blob, ps: ParamSpec, owner: _Blob) -> None:
        mine, theirs = getattr(ref.layer, ref.attr), getattr(owner.layer, owner.attr)
        who = f"param '{ps.name}' (owner layer '{owner.layer.name}')"
        problem, fix = None, None
        if ps.share_mode == "STRICT" and mine.shape != theirs.shape:
            problem = (f"shape {list(mine.shape)} here vs {list(theirs.shape)} in the owner "
                       "(share_mode STRICT)")
            fix = ("make the shapes equal, or set share_mode: PERMISSIVE if only the counts "
                   "must match")
        elif mine.numel() != theirs.numel():
            problem = (f"{mine.numel()} values here vs {theirs.numel()} in the owner "
                       "(share_mode PERMISSIVE)")
            fix = "make the element counts equal"
        elif isinstance(mine, nn.Parameter) != isinstance(theirs, nn.Parameter):
            problem = "one blob is learnable and the other is not"
            fix = "share blobs of the same kind"
        if problem is not None:
            raise NetError(message_at(ref.layer.spec, f"cannot share {who}: {problem}", fix,
                                      key="param", named=True))
        owner_spec = _param_spec(owner)
        for mult in ("lr_mult", "decay_mult"):
            if not is_set(ps, mult):
                setattr(ref, mult, getattr(owner, mult))
            elif owner_spec is not None and is_set(owner_spec, mult):
                if getattr(ps, mult) != getattr(owner_spec, mult):
                    raise NetError(message_at(
                        ref.layer.spec, f"Shared param '{ps.name}' has mismatched {mult}: "
                                        f"{getattr(ps, mult):g} here, "
                                        f"{getattr(owner_spec, mult):g} in the owner layer "
                                        f"'{owner.layer.name}'",
                        f"set the same {mult} on every sharer, or set it only on the owner",
                        key="param", named=True))
            else:  # Caffe: the first sharer that sets it decides
                setattr(owner, mult, getattr(ps, mult))
        ref.owner = owner
        if mine.shape == theirs.shape:
            setattr(ref.layer, ref.attr, theirs)
        else:  # PERMISSIVE: the sharer sees the owner's values in its own shape
            if isinstance(mine, nn.Parameter):
                del ref.layer._parameters[ref.attr]
            else:
                del ref.layer._buffers[ref.attr]
            self._views.append((ref, owner, tuple(mine.shape)))
            setattr(ref.layer, ref.attr, theirs.view(mine.shape))

    # --- forward ----------------------------------------------------------------------------
    @overload
    def forward(self, inputs: Mapping[str, torch.Tensor] | None = None) -> NetOutput: ...

    @overload
    def forward(self, inputs: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]: ...

    def forward(self, inputs: Mapping[str, torch.Tensor] | torch.Tensor | None = None
                ) -> NetOutput | torch.Tensor | dict[str, torch.Tensor]:
        """Run every layer in order; ``inputs`` maps each net input name to its tensor.

        A net of one input also takes the tensor alone, as a PyTorch module does
        (``net(x)``), and then returns its output: the tensor of a net with one output, else
        the outputs by name."""
        if isinstance(inputs, torch.Tensor):
            if len(self.input_names) != 1:
                raise NetError(f"net '{self.name}' has {len(self.input_names)} inputs "
                               f"({', '.join(self.input_names) or 'none'}), so a tensor alone "
                               "does not say which it is; pass a dict {name: tensor}")
            out = self._forward({self.input_names[0]: inputs}, _global_hooks()).outputs
            return next(iter(out.values())) if len(out) == 1 else out
        return self._forward(inputs, _global_hooks())

    def _forward(self, inputs: Mapping[str, torch.Tensor] | None, hooked: bool) -> NetOutput:
        """:meth:`forward`, ``hooked`` saying whether a global module hook is registered (then
        every layer goes through nn.Module's call)."""
        if inputs:
            inputs = dict(inputs)
            unknown = [k for k in inputs if k not in self.input_names]
            if unknown:
                raise NetError(f"net '{self.name}': '{unknown[0]}' is not an input of the net "
                               f"(its inputs: {', '.join(self.input_names) or 'none'})")
        else:
            inputs = {}
        if self._rebinds or self._views:
            self._bind_shared()
        blobs: dict[str, torch.Tensor] = {}
        for layer, bottom, detached, top, hooks, is_input in self._forward_plan():
            if is_input and isinstance(layer, Input):  # the flag spares the others the test
                layer.provide_named(inputs)
            bottoms = [blobs[b] for b in bottom]
            for k in detached:  # propagate_down: false
                bottoms[k] = bottoms[k].detach()
            try:  # a layer without hooks is called without nn.Module's two wrapper frames
                if hooked or hooks[0] or hooks[1] or hooks[2] or hooks[3]:
                    tops = layer(*bottoms)
                else:
                    tops = layer.forward(*bottoms)
            except RuntimeError as exc:
                reshaped = _reshaped_bottom(layer, bottoms)
                if reshaped is None:
                    raise
                raise NetError(reshaped) from exc
            if isinstance(tops, torch.Tensor):
                if len(top) == 1:
                    blobs[top[0]] = tops
                    continue
                tops = (tops,)
            elif tops is None:  # a layer without tops (Silence)
                tops = ()
            for name, value in zip(top, tops, strict=True):
                blobs[name] = value
        return NetOutput(self._loss(blobs), {name: blobs[name] for name in self.output_names})

    def _forward_plan(self) -> list[tuple[Layer, tuple[str, ...], tuple[int, ...],
                                          tuple[str, ...], tuple[dict, ...], bool]]:
        """Per layer, what :meth:`forward` needs of its spec and module: (layer, bottoms, the
        indices of the bottoms not propagated down, tops, its four hook dicts (nn.Module
        mutates them in place: empty, no hook), whether it is an Input), worked out once
        (and again if the layer list changes), not per layer per iteration."""
        key = self.layers.version
        if self._plan_key != key:
            self._plan = [(layer, tuple(layer.spec.bottom),
                           tuple(k for k, down in enumerate(layer.spec.propagate_down)
                                 if not down),
                           tuple(layer.spec.top),
                           (layer._forward_hooks, layer._forward_pre_hooks,
                            layer._backward_hooks, layer._backward_pre_hooks),
                           isinstance(layer, Input)) for layer in self.layers]
            self._plan_key = key
        return self._plan

    def run(self, inputs: Mapping[str, torch.Tensor] | None = None) -> NetOutput:
        """``self(inputs)``: :meth:`forward` called directly unless a module hook (the net's
        own or a global one) needs nn.Module's call, which costs a launch-bound eager step
        about 3% (two wrapper frames and their hook checks)."""
        hooked = _global_hooks()
        if hooked or _hooked(self):
            return self(inputs)
        return self._forward(inputs, False)

    def _loss(self, blobs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The sum of loss_weight * top.sum() over the weighted tops, in as few ops as the
        usual case allows (one scalar loss of weight 1: the top itself)."""
        loss: torch.Tensor | None = None
        for name, weight in self._loss_weights:
            top = blobs[name]
            term = top if top.dim() == 0 else top.sum()
            if weight != 1.0:
                term = term * weight
            loss = term if loss is None else loss + term
        return loss if loss is not None else torch.zeros((), device=self.device)

    def bind_shared(self) -> None:
        """Re-point shared blobs before running layers one by one outside :meth:`forward`
        (as pycaffe's Net does): what :meth:`forward` does first."""
        if self._rebinds or self._views:
            self._bind_shared()

    def _bind_shared(self) -> None:
        """Re-point shared blobs (a layer may have rebound its own attribute since)."""
        for layer, attr, src, src_attr in self._rebinds:
            value = getattr(src, src_attr)
            if getattr(layer, attr) is not value:
                setattr(layer, attr, value)
        for ref, owner, shape in self._views:
            setattr(ref.layer, ref.attr, getattr(owner.layer, owner.attr).view(shape))

    # --- parameters ---------------------------------------------------------------------------
    def learnable_params(self) -> list[LearnableParam]:
        """Every learnable blob once, in layer and blob order, with its multipliers."""
        out = []
        for ref in self._blob_refs:
            tensor = getattr(ref.layer, ref.attr)
            if ref.owner is None and isinstance(tensor, nn.Parameter):
                out.append(LearnableParam(f"{ref.layer.name}/{ref.index}", tensor,
                                          ref.lr_mult, ref.decay_mult))
        return out

    # --- looking around ---------------------------------------------------------------------
    def layer_by_name(self, name: str) -> Layer:
        """The layer called ``name``; of several, the last (Caffe's ``layer_by_name``)."""
        for layer in reversed(self.layers):
            if layer.name == name:
                return layer
        near = suggest(name, [layer.name for layer in self.layers])
        fix = f"; did you mean '{near}'?" if near else ""
        raise NetError(f"net '{self.name}' ({self.phase}) has no layer '{name}'{fix}")

    def set_input_arrays(self, data: Any, labels: Any) -> None:
        """pycaffe's Net.set_input_arrays: give the net's first layer, a MemoryData, N rows
        of data (N, C, H, W) and labels (N,) (see MemoryData.reset)."""
        first = self.layers[0] if self.layers else None
        if first is None or first.spec.type != "MemoryData":
            kind = f"a {first.spec.type}" if first is not None else "no layer"
            raise NetError(f"net '{self.name}' ({self.phase}): set_input_arrays feeds a "
                           f"MemoryData first layer, and the first layer is {kind}; put the "
                           "MemoryData layer first, or call reset() on it")
        cast(Any, first).reset(data, labels)

    def device_checks(self) -> list[DeviceCheck]:
        """Every condition the layers watch on the device (read by the solver's monitor)."""
        return [check for layer in self.layers for check in layer.device_checks]

    def source_states(self) -> dict[str, dict[str, Any]]:
        """Layer name -> read position of every data source that keeps its own (MemoryData,
        a DatasetLayer): what a solver state saves so that a resume reads on exactly."""
        states = {layer.name: layer.source_state() for layer in self.layers}
        return {name: state for name, state in states.items() if state is not None}

    def load_source_states(self, states: Mapping[str, Mapping[str, Any]]) -> None:
        """Give each source layer named in ``states`` its read position back."""
        for layer in self.layers:
            if layer.name in states:
                layer.load_source_state(states[layer.name])

    def bind_sources(self, seed: int, replica: int = 0, replicas: int = 1) -> None:
        """The run's data seed and this replica's share of the records, for the source layers
        that read by themselves (see :meth:`Layer.bind_source`)."""
        for layer in self.layers:
            layer.bind_source(seed, replica, replicas)

    def data_layers(self) -> list[Layer]:
        """The layers the data pipeline feeds (Data, ImageData, WindowData, HDF5Data), in
        order: it attaches a feed to each."""
        return [layer for layer in self.layers if getattr(layer, "fed", False)]

    @property
    def loss_weights(self) -> dict[str, float]:
        """Top name -> its non-zero loss weight."""
        return dict(self._loss_weights)

    def summary(self) -> list[SummaryRow]:
        """One row per layer: name, type, tops with their shapes, learnable values it owns."""
        owned: dict[int, int] = {}
        for ref in self._blob_refs:
            tensor = getattr(ref.layer, ref.attr)
            if ref.owner is None and isinstance(tensor, nn.Parameter):
                owned[id(ref.layer)] = owned.get(id(ref.layer), 0) + tensor.numel()
        return [SummaryRow(layer.name, layer.spec.type,
                           list(zip(layer.spec.top, layer.top_shapes, strict=True)),
                           owned.get(id(layer), 0)) for layer in self.layers]

    def extra_repr(self) -> str:
        return f"name={self.name!r}, phase={self.phase}, layers={len(self.layers)}"


def _loss_weight(layer: Layer, top: int) -> float:
    """Caffe: an explicit loss_weight, else 1 for a loss layer's first top, else 0."""
    if layer.spec.loss_weight:
        return float(layer.spec.loss_weight[top])
    return 1.0 if layer.is_loss and top == 0 else 0.0


def _reshaped_bottom(layer: Layer, bottoms: list[torch.Tensor]) -> str | None:
    """Why a forward failed, when a bottom's shape beyond the batch axis differs from the
    build shape (e.g. an input of another image size); None when they all match."""
    for k, (tensor, built) in enumerate(zip(bottoms, layer.bottom_shapes, strict=True)):
        got = tuple(tensor.shape)
        if len(got) != len(built) or got[1:] != built[1:]:
            return one_line(f"bottom '{layer.spec.bottom[k]}' has shape {list(got)} but the "
                            f"net was built for {list(built)}",
                            "only the batch size (axis 0) may differ: give inputs of the "
                            "declared shape", layer=(layer.name, layer.spec.type))
    return None


def _param_spec(ref: _Blob) -> ParamSpec | None:
    specs = ref.layer.spec.param
    return specs[ref.index] if ref.index < len(specs) else None


__all__ = ["Net", "NetOutput", "LearnableParam", "SummaryRow", "CopyResult", "default_options"]


# --- state_dict keys by layer name -----------------------------------------------------------
# nn.Module would key a blob by its place in the layer list (layers.3.weight); a Net keys it by
# its layer's name (conv1.weight), as a Caffe user names it, and loads either form. A name that
# several layers share keeps the positional key.
def _name_prefixes(net: Net, prefix: str) -> dict[str, str]:
    """'<prefix>layers.<i>.' -> '<prefix><name>.' for each layer whose name is unique."""
    counts: dict[str, int] = {}
    for layer in net.layers:
        counts[layer.name] = counts.get(layer.name, 0) + 1
    return {f"{prefix}layers.{i}.": f"{prefix}{layer.name}."
            for i, layer in enumerate(net.layers) if counts[layer.name] == 1}


def _renamed(state: dict, table: Mapping[str, str]) -> None:
    """Rename ``state``'s keys in place by their prefix in ``table``, keeping their order."""
    items = list(state.items())
    state.clear()
    for key, value in items:
        head = key[:key.rfind(".") + 1]
        state[table.get(head, head) + key[len(head):]] = value


def _keys_by_layer_name(net: Net, state: dict, prefix: str, _meta: Any) -> None:
    _renamed(state, _name_prefixes(net, prefix))


def _keys_by_position(net: Net, state: dict, prefix: str, *_args: Any) -> None:
    _renamed(state, {v: k for k, v in _name_prefixes(net, prefix).items()})



def _global_hooks() -> bool:
    """Whether any module hook is registered globally (then every layer goes through
    nn.Module's call; an attribute this PyTorch lacks counts as a hook)."""
    m = _nn_module
    return bool(getattr(m, "_global_forward_hooks", True)
                or getattr(m, "_global_forward_pre_hooks", True)
                or getattr(m, "_global_backward_hooks", True)
                or getattr(m, "_global_backward_pre_hooks", True))


def _hooked(layer: nn.Module) -> bool:
    """Whether ``layer`` has hooks of its own (nn.Module's call then runs them)."""
    return bool(layer._forward_hooks or layer._forward_pre_hooks or layer._backward_hooks
                or layer._backward_pre_hooks)
