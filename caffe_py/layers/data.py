"""Layer family: data (Input, DummyData, Data, MemoryData; the file sources ImageData,
WindowData, HDF5Data and HDF5Output are in :mod:`.sources`).

None of these layers has bottoms. ``Input`` returns the tensors the net is given,
``DummyData`` makes tensors from fillers, ``Data`` returns the next batch of the feed the
data pipeline attached to it (``caffe_py.io.attach_feeds``; no layer reads a file in
``forward``), and ``MemoryData`` the next rows of arrays handed over from Python.
"""
from __future__ import annotations

import dataclasses
import logging
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from ..errors import DataError
from ..spec.layer_params.data import DataParameter, DummyDataParameter, TransformationParameter
from ..spec.layer_params.shared import FillerParameter
from ..spec.schema import is_set, location
from . import fillers
from .base import Layer, Shape
from .registry import register

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from ..io.db.caffe_rng import GlobalDraws
    from ..io.db.db import KeyValueDatabase
    from ..io.feed.feeds import Feed
    from ..io.reader.records import FeedSpec


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
            if 0 in shape:
                raise self.fail(f"top '{self.spec.top[i]}' has the shape {list(shape)}, with "
                                "nothing in it", "give every dimension >= 1")
            try:
                fillers.check(filler, shape)
            except fillers.FillerError as exc:
                raise self.fail(f"top '{self.spec.top[i]}': {exc.args[0]}", exc.args[1]) \
                    from None
            self.check_fits(f"top '{self.spec.top[i]}'", shape)   # before it is filled
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


def upgraded_transform(layer: Layer, block: Any, tp: TransformationParameter,
                       keys: tuple[str, ...] = _LEGACY_TRANSFORM) -> TransformationParameter:
    """transform_param with the deprecated fields of a data layer's own block (``keys``) moved
    in, as Caffe's UpgradeNetDataTransformation does (the spec itself is left as written)."""
    moved = {key: getattr(block, key) for key in keys if is_set(block, key)}
    both = [key for key in moved if is_set(tp, key)]
    if both:
        name = next(iter(layer.params))
        raise layer.fail(f"{both[0]} is set in both {name} and transform_param",
                         f"keep transform_param.{both[0]} only")
    return dataclasses.replace(tp, **moved) if moved else tp


class FedLayer(Layer):
    """A layer the data pipeline feeds: tops data (B, C, h, w) and, optionally, label (B,).

    Subclasses set ``record_shape`` and ``transform`` in setup and say what to read in
    ``feed_spec(seed, draws)``; :func:`caffe_py.io.attach_feeds` gives the layer its feed and
    ``forward`` returns the feed's next batch (docs/data_pipeline.md).
    """

    bottoms: ClassVar[tuple[int, int | None]] = (0, 0)
    tops: ClassVar[tuple[int, int | None]] = (1, 2)
    fed = True
    """Read through the data pipeline: Net.data_layers() lists it, attach_feeds feeds it."""
    _feed: Feed | None = None
    record_shape: tuple[int, int, int]
    """The records' (C, H, W), set by the subclass's setup."""

    def attach(self, feed: Feed) -> None:
        """Give the layer its feed (done by the data pipeline, never by user code)."""
        self._feed = feed

    @property
    def feed(self) -> Feed | None:
        """The feed ``forward`` reads (None until the data pipeline attaches one)."""
        return self._feed

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        # The feed's thread made the batch, or (a small batch of a database kept decoded,
        # after its first pass) the feed gathers it here: one numpy gather, a few torch calls.
        if self._feed is None:
            raise self.fail("has no data feed attached",
                            "start the data pipeline: caffe_py.io.attach_feeds(net, pool, "
                            "seed=...) and pool.start() before running the net")
        return self._feed.next()

    def forward(self) -> torch.Tensor | tuple[torch.Tensor, ...]:
        batch = self.next_batch()
        return batch if len(self.spec.top) == 2 else batch[0]

    def given_record_shape(self, source: str) -> tuple[int, int, int] | None:
        """The record shape (C, H, W) a net built without databases gives this layer (the
        net option ``record_shapes``, by layer or top name); None: read ``source``.

        Training builds without the option, so a missing database is an error there. With it,
        a layer it does not name reads its source when there is one, and otherwise fails
        saying what to give.
        """
        given = self.ctx.options.get("record_shapes")
        if given is None:
            return None
        for key in (self.name, *self.spec.top):
            if key in given:
                if len(given[key]) != 3:
                    raise self.fail(f"the record shape given for '{key}' has "
                                    f"{len(given[key])} sizes; its records are C,H,W",
                                    f"give e.g. --input-shape {shlex.quote(key + '=3,256,256')}")
                c, h, w = (int(d) for d in given[key])
                return c, h, w
        if Path(source).exists():
            return None
        top = self.spec.top[0]
        shape = shlex.quote(f"{top}=C,H,W")
        raise self.fail(f"database {source} does not exist, so its record shape is unknown",
                        f"give it, e.g. cpy net --input-shape {shape} (or create the database)")

    def cropped(self, tp: TransformationParameter,
                record_shape: tuple[int, int, int]) -> tuple[int, int, int]:
        """The transformed shape of records of ``record_shape`` (a crop larger than the
        records: one line)."""
        c, h, w = record_shape
        if tp.crop_size and tp.crop_size > min(h, w):
            raise self.fail(f"transform_param.crop_size {tp.crop_size} is larger than the "
                            f"records ({c} x {h} x {w})", "use a smaller crop_size")
        return (c, tp.crop_size, tp.crop_size) if tp.crop_size else record_shape

    def checked_transformer(self, tp: TransformationParameter,
                            record_shape: tuple[int, int, int]) -> Any:
        """A Transformer of ``tp`` for these records; a bad crop or mean names the layer."""
        from ..io.feed.transformer import Transformer

        try:
            return Transformer(tp, self.phase, record_shape, where="")
        except DataError as exc:
            raise self.fail(str(exc)) from None


@register("Data")
class Data(FedLayer):
    """Batches from an LMDB or LevelDB of Datum records: tops data (B, C, h, w) and,
    optionally, label (B,).

    Building opens the database and reads its first record for the shapes (C, H, W, then the
    crop). ``self.transform`` is the effective transform_param (deprecated data_param fields
    moved in). ``forward`` returns the next batch of the feed that
    :func:`caffe_py.io.attach_feeds` gave the layer (docs/data_pipeline.md).
    """

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        from ..io.feed.transformer import force_color

        dp, tp = self.param("data_param"), self.param("transform_param")
        tp = self.transform = upgraded_transform(self, dp, tp)
        self.color = True if dp.force_encoded_color else force_color(tp)
        given = self.given_record_shape(dp.source)
        if given is None:
            self._read_first_record(dp)
            out_shape = self.checked_transformer(tp, self.record_shape).out_shape
        else:  # built without its database (`cpy net`): the crop alone decides H and W
            self.record_shape, self.record_dtype = given, np.dtype(np.uint8)
            self.record_encoded = False
            out_shape = self.cropped(tp, given)
        shapes: list[Shape] = [(dp.batch_size, *out_shape)]
        return shapes + [(dp.batch_size,)] if len(self.spec.top) == 2 else shapes

    def _read_first_record(self, dp: DataParameter) -> None:
        """The record shape and dtype (and whether records are image files), from the
        database's first record."""
        from ..io.formats.datum import datum_to_array, decode_record, format_key

        with self.open_database() as db:  # missing: a DataError naming the path and the fix
            key, value = db.first()
        datum = decode_record(value, source=dp.source, key=key)
        try:
            first = datum_to_array(datum, color=self.color)
        except DataError as exc:
            raise DataError(f"{dp.source}: record {format_key(key)}: {exc}; convert the data "
                            "again (the records must hold the images)") from None
        channels, height, width = (int(d) for d in first.shape)
        if channels * height * width == 0:
            raise DataError(f"{dp.source}: record {format_key(key)} holds no data ({channels} x "
                            f"{height} x {width}); convert the data again (the records must "
                            "hold the images)")
        self.record_shape = (channels, height, width)
        self.record_dtype = first.dtype
        self.record_encoded = bool(datum.encoded)  # image files: decoded in parallel

    def open_database(self) -> KeyValueDatabase:
        """data_param.source opened as data_param.backend says (the other kind: one line)."""
        from ..io.db.db import open_db

        dp = self.param("data_param")
        return open_db(dp.source, dp.backend,
                       switch=lambda found: f"set data_param.backend: {found.upper()}",
                       create_lock=not self.ctx.options.get("inspect"))

    def feed_spec(self, seed: int, draws: GlobalDraws) -> FeedSpec:
        """What the data pipeline reads for this layer (see caffe_py.io.feed.feeds); takes the
        draws Caffe's setup of this layer takes (none it uses: its crops and mirrors are drawn
        per record position, see caffe_py.io.feed.transformer)."""
        from ..io.db.caffe_rng import needs_rand
        from ..io.reader.records import FeedSpec

        dp = self.param("data_param")
        draws.prefetching_layer(needs_rand(self.transform.mirror, self.transform.crop_size,
                                           self.phase), 0)
        return FeedSpec(dp.source, dp.batch_size, dp.prefetch, self.record_shape,
                        self.record_dtype, self.transform, self.color, dp.rand_skip,
                        opener=self.open_database, encoded=self.record_encoded)


# --- MemoryData -----------------------------------------------------------------------------
@register("MemoryData")
class MemoryData(Layer):
    """Batches of arrays handed over from Python: tops data (B, C, H, W) and label (B,), both
    float32, as Caffe's MemoryDataLayer.

    :meth:`reset` (pycaffe's ``set_input_arrays``) takes N rows (N a multiple of batch_size);
    each ``forward`` returns the next B of them, wrapping to the first after the last. As
    Caffe's ``Reset``, the arrays are not transformed. In a run of several replicas, replica
    ``i`` of ``R`` takes rows i, i+R, ... (:meth:`bind_source`); the position is saved in the
    solver state (:meth:`source_state`).
    """

    bottoms = (0, 0)
    tops = (2, 2)
    capturable = False  # which rows a forward returns changes on the host every time

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p = self.param()
        if location(self.param("transform_param")) is not None:  # the block is written
            log.warning(f"layer '{self.name}' (MemoryData) does not transform its arrays "
                        "(as Caffe's Reset); transform_param is ignored")
        self.row_shape = (p.channels, p.height, p.width)
        self._data: torch.Tensor | None = None
        self._labels: torch.Tensor | None = None
        self.position = 0
        """The rows this replica has read since the arrays were given (its next row: row
        ``position * replicas + replica``, modulo N)."""
        self.replica, self.replicas = 0, 1
        return [(p.batch_size, *self.row_shape), (p.batch_size,)]

    def reset(self, data: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor) -> None:
        """Feed N rows: data (N, C, H, W), labels (N,) or (N, 1, 1, 1); N a multiple of
        batch_size. The next forward returns rows 0 .. B-1."""
        batch = self.param().batch_size
        data_t = torch.as_tensor(np.asarray(data) if not isinstance(data, torch.Tensor)
                                 else data, dtype=torch.float32)
        label_t = torch.as_tensor(np.asarray(labels) if not isinstance(labels, torch.Tensor)
                                  else labels, dtype=torch.float32)
        n = data_t.shape[0] if data_t.dim() else 0
        if tuple(data_t.shape[1:]) != self.row_shape or data_t.dim() != 4:
            raise self.fail(f"was given data of shape {list(data_t.shape)}; rows must be "
                            f"{list(self.row_shape)} (memory_data_param channels, height, "
                            "width)", "pass an (N, C, H, W) array")
        if label_t.numel() != n or label_t.dim() not in (1, 4):
            raise self.fail(f"was given {label_t.numel()} labels of shape "
                            f"{list(label_t.shape)} for {n} rows",
                            "pass one label per row, shape (N,) or (N, 1, 1, 1)")
        if n == 0 or n % batch:
            raise self.fail(f"was given {n} rows, not a multiple of batch_size {batch}",
                            f"pass a multiple of {batch} rows")
        device = self.ctx.device
        self._data = data_t.to(device, copy=True)
        self._labels = label_t.reshape(n).to(device, copy=True)
        self.position = 0

    set_input_arrays = reset  # pycaffe's name

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._data is None or self._labels is None:
            raise self.fail("has no arrays", "call reset(data, labels) (or the net's "
                                             "set_input_arrays) before running the net")
        batch, n = self.param().batch_size, self._data.shape[0]
        first = self.position
        self.position = (self.position + batch) % n if self.replicas == 1 else \
            self.position + batch
        if self.replicas == 1:
            rows = slice(first, first + batch)
            return self._data[rows], self._labels[rows]
        index = ((first + torch.arange(batch)) * self.replicas + self.replica) % n
        index = index.to(self._data.device)
        return self._data[index], self._labels[index]

    def source_state(self) -> dict[str, Any]:
        return {"position": int(self.position)}

    def load_source_state(self, state: Mapping[str, Any]) -> None:
        self.position = int(state.get("position", 0))

    def bind_source(self, seed: int, replica: int = 0, replicas: int = 1) -> None:
        self.replica, self.replicas = replica, replicas
