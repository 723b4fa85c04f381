"""The weights side of a Net: Caffe's CopyTrainedLayersFrom, ShareTrainedLayersWith and the
layer -> blobs table a weights file holds. Layers are matched by name, and of several layers
of one name Caffe reaches only the first; so does caffe-py."""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .errors import NetError
from .spec.schema import location

if TYPE_CHECKING:
    from .layers.base import Layer
    from .net import Net

log = logging.getLogger(__name__)


REAL_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
               torch.int32, torch.int16, torch.int8, torch.uint8)
"""The dtypes a weights file's blob may hold: it is copied into the net's float blobs
(complex values would lose their imaginary part; float8 and sparse tensors are no weights
caffe-py writes)."""


@dataclass
class CopyResult:
    """What :meth:`Net.copy_from` did: layers copied, and source layers the net lacks."""

    copied: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


class WeightsMixin:
    """Net's weights methods (the net's ``layers``, ``name``, ``phase``, ``_rebinds`` and
    ``_bind_shared`` come from :class:`~caffe_py.net.Net`)."""

    if TYPE_CHECKING:  # what Net provides
        layers: Sequence[Layer]
        _rebinds: list[tuple[Layer, str, Layer, str]]

        def _bind_shared(self) -> None: ...


    def layer_blobs(self) -> dict[str, list[torch.Tensor]]:
        """Layer name -> its blobs in Caffe order (what a weights file holds); none skipped.

        Of layers sharing a name, the first is the one listed (the one a weights file fills
        on loading, as Caffe's CopyTrainedLayersFrom does).
        """
        return {name: layer.blobs() for name, layer in self._first_by_name().items()
                if layer.blob_names}

    def copy_from(self, blobs_by_layer: Mapping[str, list[torch.Tensor]],
                  source: str | Path = "<weights>") -> CopyResult:
        """Caffe's CopyTrainedLayersFrom: copy by layer name into the first layer of that name
        (Caffe stops at the first match); layers the net lacks are skipped. Non-finite values
        are an error; so is a file that fills none of the net's learnable layers, and the
        learnable layers it leaves out (they keep their fillers' values) are named in a
        warning."""
        result = CopyResult()
        by_name = self._first_by_name()
        for name, values in blobs_by_layer.items():
            layer = by_name.get(name)
            if layer is None:
                result.ignored.append(name)
                continue
            targets = layer.blobs()
            if len(values) != len(targets):
                raise NetError(f"{source}: layer {self._ref(layer)} has {len(values)} blob(s) "
                               f"in the weights but {len(targets)} in the net; the weights are "
                               "for another net")
            for i, (value, target) in enumerate(zip(values, targets, strict=True)):
                value = torch.as_tensor(value)
                if not _same_shape(value.shape, target.shape):
                    raise NetError(f"{source}: layer {self._ref(layer)} blob {i}: shape "
                                   f"{list(value.shape)} in the weights, {list(target.shape)} in "
                                   "the net; the weights are for another net (or rename the "
                                   "layer to start it afresh)")
                if value.layout != torch.strided or value.dtype not in REAL_DTYPES:
                    kind = str(value.layout if value.layout != torch.strided else value.dtype)
                    raise NetError(f"{source}: layer {self._ref(layer)} blob {i} holds "
                                   f"{kind.removeprefix('torch.')} values, not real numbers; "
                                   "the file is damaged or not weights: use an earlier "
                                   "snapshot")
                if value.is_floating_point() and not bool(torch.isfinite(value).all()):
                    raise NetError(f"{source}: layer {self._ref(layer)} blob {i} holds NaN or "
                                   "infinite values; the file is damaged or was saved from a "
                                   "diverged run: use an earlier snapshot")
                converted = value.to(target.dtype)
                if converted.is_floating_point() and not bool(torch.isfinite(converted).all()):
                    raise NetError(f"{source}: layer {self._ref(layer)} blob {i} holds values "
                                   f"past {str(target.dtype).removeprefix('torch.')}'s range "
                                   f"(the largest magnitude is "
                                   f"{float(value.abs().max()):g}); the file is damaged or "
                                   "not this net's weights")
                with torch.no_grad():
                    target.copy_(converted.reshape(target.shape))
            result.copied.append(name)
        self._report_unfilled(result, by_name, len(blobs_by_layer), source)
        return result

    def _report_unfilled(self, result: CopyResult, by_name: Mapping[str, Layer], held: int,
                         source: str | Path) -> None:
        """None of the learnable layers filled: an error; some: one warning naming them."""
        learnable = [name for name, layer in by_name.items() if layer.blob_names]
        unfilled = [name for name in learnable if name not in set(result.copied)]
        if not unfilled:
            return
        if len(unfilled) == len(learnable):
            what = "holds no layers (an empty or foreign file)" if held == 0 else \
                f"holds {held} layer(s), none of them named as the net's " \
                f"({', '.join(result.ignored[:5])}{', ...' if held > 5 else ''})"
            raise NetError(f"{source}: {what}; none of the net's {len(learnable)} learnable "
                           "layers got weights: give the weights of this net")
        log.warning(f"{source}: {len(unfilled)} of the net's {len(learnable)} learnable layers "
                    f"are not in the file and keep their fillers' values: "
                    f"{', '.join(unfilled)}")

    def share_weights_with(self, other: Net, *,
                           fix: str = "layers of one name must match across phases"
                           ) -> list[str]:
        """Caffe's ShareTrainedLayersWith: use ``other``'s blob tensors for same-named layers.

        Each layer of ``other`` is matched with the first layer of this net of its name (a later
        one of a repeated name wins, as in Caffe). Returns the names of the layers that now
        share. A layer of this net that ``other`` lacks keeps its own blobs, as in Caffe. A
        layer whose blobs differ is a NetError ending in ``fix``.
        """
        first = self._first_by_name()
        pairs: dict[str, tuple[Layer, Layer]] = {}
        for src in other.layers:
            layer = first.get(src.name)
            if layer is None:
                continue
            if len(src.blob_names) != len(layer.blob_names):
                raise NetError(f"layer {self._ref(layer)} has {len(layer.blob_names)} blob(s) "
                               f"here but {len(src.blob_names)} in net '{other.name}' "
                               f"({other.phase}); {fix}")
            for i, (attr, src_attr) in enumerate(zip(layer.blob_names, src.blob_names,
                                                     strict=True)):
                a, b = getattr(layer, attr), getattr(src, src_attr)
                if a.shape != b.shape:
                    raise NetError(f"layer {self._ref(layer)} blob {i}: shape {list(a.shape)} "
                                   f"here but {list(b.shape)} in net '{other.name}' "
                                   f"({other.phase}); {fix}")
            if layer.blob_names:
                pairs[src.name] = (layer, src)
        for layer, src in pairs.values():
            for attr, src_attr in zip(layer.blob_names, src.blob_names, strict=True):
                self._rebinds.append((layer, attr, src, src_attr))
        self._bind_shared()
        return list(pairs)

    def unshare(self) -> None:
        """Undo :meth:`share_weights_with`: every blob it shared becomes a copy of its present
        values, this net's own (blobs shared with one another inside this net stay shared:
        one copy each). Caffe's TEST nets keep their own weights until a test pass shares
        them (pycaffe scripts can see the difference)."""
        copies: dict[int, torch.Tensor] = {}
        for layer, attr, src, src_attr in self._rebinds:
            value = getattr(src, src_attr)
            own = copies.get(id(value))
            if own is None:
                own = value.detach().clone()
                if isinstance(value, torch.nn.Parameter):
                    own = torch.nn.Parameter(own, requires_grad=value.requires_grad)
                copies[id(value)] = own
            setattr(layer, attr, own)
        self._rebinds.clear()

    def _first_by_name(self) -> dict[str, Layer]:
        """Layer name -> the first layer of that name (the one weights reach, as in Caffe)."""
        first: dict[str, Layer] = {}
        for layer in self.layers:
            first.setdefault(layer.name, layer)
        return first

    def _ref(self, layer: Layer) -> str:
        """'name', or 'name' with its line (else its index) when another layer has the name."""
        if sum(other.name == layer.name for other in self.layers) == 1:
            return f"'{layer.name}'"
        loc = location(layer.spec)
        where = f"line {loc.line}" if loc is not None else \
            f"layer #{list(self.layers).index(layer)} of the net"
        return f"'{layer.name}' ({layer.spec.type}, {where})"


def _same_shape(source: torch.Size, target: torch.Size) -> bool:
    """Equal shapes, or Caffe's legacy 4-axis form with leading 1s (e.g. 1 x 1 x N x M)."""
    if source == target:
        return True
    strip = lambda s: list(s)[next((i for i, d in enumerate(s) if d != 1), len(s)):]
    return math.prod(source) == math.prod(target) and strip(source) == strip(target)


__all__ = ["CopyResult", "WeightsMixin"]
