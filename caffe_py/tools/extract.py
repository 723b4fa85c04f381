"""Caffe's ``extract_features``: the values of named blobs of a trained net, image by image,
into databases of Datum records (``float_data``, keys ``%010d``), as tools/extract_features.cpp
writes them.

The net is built for TEST from its spec (YAML or prototxt), the weights copied in by layer
name; each of ``batches`` forward passes reads the next batch from the net's data layers, and
every image's values of each blob go into that blob's database: channels, height and width
are the blob's axes 1-3 (1 where it has fewer, as Caffe's legacy shape), float_data the image's
values in order. A blob's value is the one the net holds after the whole pass (an in-place
layer after it included), as Caffe's blob is.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import DataError
from ..io.db.db import open_writer
from ..io.formats.datum import Datum, encode_datum

log = logging.getLogger(__name__)


@dataclass
class Extracted:
    """One blob's database: its path and how many images it holds."""

    blob: str
    path: Path
    images: int


def extract_features(weights: str | Path, spec: str | Path, blobs: Sequence[str],
                     dbs: Sequence[str | Path], batches: int, backend: str = "lmdb", *,
                     device: str | torch.device = "cpu") -> list[Extracted]:
    """Write the values of ``blobs`` over ``batches`` forward passes of the TEST net of
    ``spec`` (with ``weights``) into the databases ``dbs`` (one per blob, ``backend``)."""
    from ..api import load_net
    from ..solver.evaluate import fed

    if len(blobs) != len(dbs):
        raise DataError(f"{len(blobs)} blob name(s) and {len(dbs)} database(s): the number of "
                        "blob names and dataset names must be equal; give one database per blob")
    if batches < 1:
        raise DataError(f"num_mini_batches is {batches}; give a number >= 1")
    seen: dict[str, str] = {}
    for blob, db in zip(blobs, dbs, strict=True):
        key = os.path.realpath(db)
        if key in seen:
            raise DataError(f"database {db} is named for blobs {seen[key]} and {blob}; give "
                            "each blob a database of its own")
        seen[key] = blob
    net = load_net(spec, weights, device=device)
    unknown = [b for b in blobs if b not in net.blobs]
    if unknown:
        raise DataError(f"Unknown feature blob name {unknown[0]} in the network {spec}; its "
                        f"blobs: {', '.join(net.blobs)}")
    values: dict[str, torch.Tensor] = {}
    hooks = [_last_writer(net, name).register_forward_hook(_keep(values, name, _top_index(
        _last_writer(net, name), name))) for name in blobs]
    writers: list[Any] = []
    try:
        for db in dbs:
            log.info(f"Opening dataset {db}")
            writers.append(open_writer(db, backend))
        log.info("Extracting Features")
        counts = [0] * len(blobs)
        with fed(net), torch.no_grad():
            for _ in range(batches):
                net()
                for i, name in enumerate(blobs):
                    counts[i] = _write_blob(writers[i], values[name], counts[i], name)
        done = []
        for i, (name, writer) in enumerate(zip(blobs, writers, strict=True)):
            summary = writer.finish()
            log.info(f"Extracted features of {counts[i]} query images for feature blob {name}")
            done.append(Extracted(name, Path(summary.path), counts[i]))
        writers = []
        log.info("Successfully extracted the features!")
        return done
    finally:
        for writer in writers:
            writer.abandon()
        for hook in hooks:
            hook.remove()


def _last_writer(net: Any, name: str) -> torch.nn.Module:
    """The last layer whose tops include ``name`` (after it the blob holds its final value)."""
    return [layer for layer in net.layers if name in layer.spec.top][-1]


def _top_index(layer: Any, name: str) -> int:
    return list(layer.spec.top).index(name)


def _keep(values: dict[str, torch.Tensor], name: str, index: int) -> Any:
    def hook(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        top = output[index] if isinstance(output, (tuple, list)) else output
        values[name] = top.detach()
    return hook


def _write_blob(writer: Any, blob: torch.Tensor, count: int, name: str) -> int:
    """One Datum per image of ``blob`` (N, ...) with keys from ``count`` on; the new count."""
    shape = list(blob.shape) + [1] * max(0, 4 - blob.dim())
    channels, height, width = (int(d) for d in shape[1:4])
    rows = blob.float().reshape(blob.shape[0], -1).cpu().tolist()
    for row in rows:
        datum = Datum(channels=channels, height=height, width=width, float_data=row)
        writer.put(f"{count:010d}".encode(), encode_datum(datum))
        count += 1
        if count % 1000 == 0:
            log.info(f"Extracted features of {count} query images for feature blob {name}")
    return count
