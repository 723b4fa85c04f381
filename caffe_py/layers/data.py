"""Layer family: data (Input, DummyData, Data).

None of these layers has bottoms. ``Input`` returns the tensors the net is given,
``DummyData`` makes tensors from fillers, and ``Data`` returns the next batch of the feed the
data pipeline attached to it (``caffe_py.io.attach_feeds``); no layer reads a file in
``forward``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import DataError
from ..spec.layer_params.data import DataParameter, DummyDataParameter, TransformationParameter
from ..spec.layer_params.shared import FillerParameter
from ..spec.schema import is_set
from . import fillers
from .base import Layer, Shape
from .registry import register

if TYPE_CHECKING:
    from ..io.feeds import Feed


# --- Input ----------------------------------------------------------------------------------
@register("Input")
class Input(Layer):
    """The net's inputs: ``forward`` returns the tensors last given to :meth:`provide`.

    The shapes in ``input_param`` are the build shapes (what shape inference sees); the
    tensors provided later may have another batch size but must have as many axes.
    """

    bottoms = (0, 0)
    tops = (1, None)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        shapes = self.param().shape
        n = len(self.spec.top)
        if len(shapes) not in (1, n):
            raise self.fail(f"input_param.shape has {len(shapes)} entries for {n} tops",
                            "give one shape for every top, or one per top")
        self._provided: tuple[torch.Tensor, ...] | None = None
        return [tuple(s.dim) for s in (shapes * n if len(shapes) == 1 else shapes)]

    def provide(self, *tensors: torch.Tensor) -> None:
        """Set the tensors the next ``forward`` returns, one per top in order."""
        if len(tensors) != len(self.spec.top):
            raise self.fail(f"was given {len(tensors)} tensors for {len(self.spec.top)} tops "
                            f"({', '.join(self.spec.top)})", "pass one tensor per top")
        for top, want, got in zip(self.spec.top, self.top_shapes, tensors, strict=True):
            if not isinstance(got, torch.Tensor) or got.dim() != len(want):
                shape = list(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
                raise self.fail(f"input '{top}' has shape {shape}; expected {len(want)} axes "
                                f"like {list(want)}", "reshape the input to the declared axes")
        self._provided = tuple(tensors)

    def provide_named(self, inputs: Mapping[str, torch.Tensor]) -> None:
        """Set the inputs from a mapping top name -> tensor (the net's ``inputs`` argument)."""
        missing = [t for t in self.spec.top if t not in inputs]
        if missing:
            raise self.fail(f"no tensor given for input(s) {', '.join(missing)}",
                            "pass them in the net's inputs, keyed by top name")
        self.provide(*(inputs[t] for t in self.spec.top))

    def forward(self) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if self._provided is None:
            raise self.fail("has no input tensors", "pass the net its inputs by top name")
        return self._provided[0] if len(self._provided) == 1 else self._provided


# --- DummyData ------------------------------------------------------------------------------
@register("DummyData")
class DummyData(Layer):
    """Tops filled by ``data_filler``: constant fillers once at build, others every forward.

    As in Caffe, a constant top is the same tensor on every forward (it is never written by a
    later layer: layers compute out of place unless they keep autograd correct).
    """

    bottoms = (0, 0)
    tops = (1, None)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        n = len(self.spec.top)
        shapes = self._shapes(p, n)
        if len(p.data_filler) not in (0, 1, n):
            raise self.fail(f"dummy_data_param.data_filler has {len(p.data_filler)} entries "
                            f"for {n} tops", "give none, one, or one per top")
        given = p.data_filler or [FillerParameter()]
        self._fillers = [given[0] if len(given) == 1 else given[i] for i in range(n)]
        self._refill = [f.type != "constant" for f in self._fillers]
        # Tops are filled on the layer's device by a generator there (no host work per
        # forward; a CUDA graph replays it), seeded from the net's seed as before.
        gen = torch.Generator(device=self.ctx.device)
        if any(self._refill):
            gen.manual_seed(int(torch.randint(2**62, (1,), generator=self.ctx.generator)))
        self._gen = gen if any(self._refill) else None   # only a refilling layer draws
        for i, (shape, filler) in enumerate(zip(shapes, self._fillers, strict=True)):
            if not self._refill[i]:
                self.register_buffer(f"_top{i}", fillers.fill(filler, shape, gen),
                                     persistent=False)
        return shapes

    def _shapes(self, p: DummyDataParameter, n: int) -> list[Shape]:
        legacy = {"num": p.num, "channels": p.channels, "height": p.height, "width": p.width}
        if any(legacy.values()):
            for key, values in legacy.items():
                if len(values) not in (1, n):
                    raise self.fail(f"dummy_data_param.{key} has {len(values)} entries for "
                                    f"{n} tops", "give one for every top, or one per top")
            pick = {k: (v * n if len(v) == 1 else v) for k, v in legacy.items()}
            return [(pick["num"][i], pick["channels"][i], pick["height"][i], pick["width"][i])
                    for i in range(n)]
        if len(p.shape) not in (1, n):
            raise self.fail(f"dummy_data_param.shape has {len(p.shape)} entries for {n} tops",
                            "give one shape for every top, or one per top")
        return [tuple(s.dim) for s in (p.shape * n if len(p.shape) == 1 else p.shape)]

    def forward(self) -> torch.Tensor | tuple[torch.Tensor, ...]:
        # Caffe refills a non-constant top every forward (here a new tensor, so a top kept
        # from an earlier forward keeps its values).
        out = []
        for i, shape in enumerate(self.top_shapes):
            if self._gen is not None and self._refill[i]:
                out.append(fillers.fill_(self._fillers[i], torch.empty(shape,
                                                                        device=self.ctx.device),
                                         self._gen))
            else:
                out.append(getattr(self, f"_top{i}"))
        return out[0] if len(out) == 1 else tuple(out)


# --- Data -----------------------------------------------------------------------------------
_LEGACY_TRANSFORM = ("mean_file", "scale", "crop_size", "mirror")


@register("Data")
class Data(Layer):
    """Batches from an LMDB of Datum records: tops data (B, C, h, w) and, optionally, label (B,).

    Building opens the database and reads its first record for the shapes (C, H, W, then the
    crop). ``self.transform`` is the effective transform_param (deprecated data_param fields
    moved in). ``forward`` returns the next batch of the feed that
    :func:`caffe_py.io.attach_feeds` gave the layer (docs/data_pipeline.md).
    """

    bottoms = (0, 0)
    tops = (1, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        from ..io.transformer import Transformer, force_color

        dp, tp = self.param("data_param"), self.param("transform_param")
        tp = self.transform = self._upgraded_transform(dp, tp)
        self.color = True if dp.force_encoded_color else force_color(tp)
        self._feed: Feed | None = None
        self._label_top = len(self.spec.top) == 2
        given = self._given_record_shape(dp)
        if given is None:
            self._read_first_record(dp)
            try:
                out_shape = Transformer(tp, self.phase, self.record_shape, where="").out_shape
            except DataError as exc:
                raise self.fail(str(exc)) from None
        else:  # built without its database (`cpy net`): the crop alone decides H and W
            self.record_shape, self.record_dtype = given, np.dtype(np.uint8)
            self.record_encoded = False
            c, h, w = given
            if tp.crop_size and tp.crop_size > min(h, w):
                raise self.fail(f"transform_param.crop_size {tp.crop_size} is larger than the "
                                f"records ({c} x {h} x {w})", "use a smaller crop_size")
            out_shape = (c, tp.crop_size, tp.crop_size) if tp.crop_size else given
        shapes: list[Shape] = [(dp.batch_size, *out_shape)]
        return shapes + [(dp.batch_size,)] if len(self.spec.top) == 2 else shapes

    def _read_first_record(self, dp: DataParameter) -> None:
        """The record shape and dtype, from the database's first record."""
        from ..io.datum import datum_to_array, decode_record, format_key
        from ..io.lmdb_store import open_db

        with open_db(dp.source) as db:  # missing: a DataError naming the path and the fix
            key, value = db.first()
        datum = decode_record(value, source=dp.source, key=key)
        try:
            first = datum_to_array(datum, color=self.color)
        except DataError as exc:
            raise DataError(f"{dp.source}: record {format_key(key)}: {exc}") from None
        channels, height, width = (int(d) for d in first.shape)
        self.record_shape = (channels, height, width)
        self.record_dtype = first.dtype
        self.record_encoded = bool(datum.encoded)  # image files: decoded in parallel

    def _given_record_shape(self, dp: DataParameter) -> tuple[int, int, int] | None:
        """The record shape (C, H, W) a net built without databases gives this layer (the
        net option ``record_shapes``, by layer or top name); None: read the database.

        Training builds without the option, so a missing database is an error there. With it,
        a layer it does not name reads its database when there is one, and otherwise fails
        saying what to give.
        """
        given = self.ctx.options.get("record_shapes")
        if given is None:
            return None
        for key in (self.name, *self.spec.top):
            if key in given:
                return tuple(int(d) for d in given[key])
        if Path(dp.source).exists():
            return None
        top = self.spec.top[0]
        raise self.fail(f"database {dp.source} does not exist, so its record shape is unknown",
                        f"give it, e.g. cpy net --input-shape {top}=C,H,W (or create the "
                        "database)")

    def _upgraded_transform(self, dp: DataParameter,
                            tp: TransformationParameter) -> TransformationParameter:
        """transform_param with the deprecated data_param fields moved in, as Caffe's
        UpgradeNetDataTransformation does (the spec itself is left as written)."""
        moved = {key: getattr(dp, key) for key in _LEGACY_TRANSFORM if is_set(dp, key)}
        both = [key for key in moved if is_set(tp, key)]
        if both:
            raise self.fail(f"{both[0]} is set in both data_param and transform_param",
                            f"keep transform_param.{both[0]} only")
        return dataclasses.replace(tp, **moved) if moved else tp

    def attach(self, feed: Feed) -> None:
        """Give the layer its feed (done by the data pipeline, never by user code)."""
        self._feed = feed

    @property
    def feed(self) -> Feed | None:
        """The feed ``forward`` reads (None until the data pipeline attaches one)."""
        return self._feed

    def forward(self) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        # The feed's thread made the batch, or (a small batch of a database kept decoded,
        # after its first pass) the feed gathers it here: one numpy gather, a few torch calls.
        if self._feed is None:
            raise self.fail("has no data feed attached",
                            "start the data pipeline: caffe_py.io.attach_feeds(net, pool, "
                            "seed=...) and pool.start() before running the net")
        batch = self._feed.next()
        return batch if self._label_top else batch[0]
