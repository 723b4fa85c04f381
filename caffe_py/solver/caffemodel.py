"""Caffe's own snapshot files: ``.caffemodel`` (a NetParameter with blobs) and ``.solverstate``
(a SolverState), read and written with the protobuf wire format by hand (no protobuf needed).

caffe.proto, the fields used here::

    message NetParameter   { optional string name = 1; repeated LayerParameter layer = 100;
                             repeated V1LayerParameter layers = 2; }      // legacy nets
    message LayerParameter { optional string name = 1; optional string type = 2;
                             repeated BlobProto blobs = 7; }
    message V1LayerParameter { optional string name = 4; repeated BlobProto blobs = 6; }
    message SolverState    { optional int32 iter = 1; optional string learned_net = 2;
                             repeated BlobProto history = 3; optional int32 current_step = 4; }

So ``--weights`` takes a .caffemodel trained by Caffe (layers copied by name), and with
``snapshot_format: caffemodel`` caffe-py writes files Caffe itself can load. What exact
resumption needs beyond Caffe's SolverState (generator states, data positions) goes in field
1000, which Caffe's parser keeps as an unknown field: a ``torch.save`` blob loaded with
``weights_only=True``.
"""
from __future__ import annotations

import io
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import DataError, SolverError, one_line_reason
from ..io.formats.blobproto import blob_from_array, encode_blob
from ..io.formats.wire import LEN, VARINT, WireError, WireStream, as_int32, len_field, varint
from ..io.formats.wire import tag as wire_tag

EXTRAS_FIELD = 1000


def encode_net(name: str, layers: Mapping[str, Sequence[torch.Tensor]],
               types: Mapping[str, str] | None = None) -> bytes:
    """A NetParameter holding each layer's name, type and blobs (what Caffe copies from)."""
    parts = [len_field(1, name.encode())] if name else []
    for layer, blobs in layers.items():
        body = [len_field(1, layer.encode())]
        if types and types.get(layer):
            body.append(len_field(2, types[layer].encode()))
        body += [len_field(7, encode_blob(blob_from_array(_numpy(b)))) for b in blobs]
        parts.append(len_field(100, b"".join(body)))
    return b"".join(parts)


def read_net(path: str | Path) -> dict[str, list[torch.Tensor]]:
    """Layer name -> blobs of a .caffemodel file, read straight into the blobs' arrays."""
    path = Path(path)
    try:
        with open(path, "rb", buffering=0) as f:
            return _parse_net(WireStream(f, path.stat().st_size), str(path))
    except FileNotFoundError:
        raise SolverError(f"{path}: file not found; check the path") from None


def decode_net(buf: bytes, source: str) -> dict[str, list[torch.Tensor]]:
    """Layer name -> blobs from a .caffemodel's bytes (V2 ``layer`` or legacy V1 ``layers``)."""
    return _parse_net(WireStream(io.BytesIO(buf), len(buf)), source)


def _parse_net(stream: WireStream, source: str) -> dict[str, list[torch.Tensor]]:
    out: dict[str, list[torch.Tensor]] = {}
    try:
        while not stream.at(stream.size):
            number, wire = stream.key()
            if number in (100, 2) and wire == LEN:
                end = stream.length_end(number)
                name_field, blob_field = (1, 7) if number == 100 else (4, 6)
                name, blobs = _read_layer(stream, end, name_field, blob_field)
                if blobs:
                    out[name] = blobs
            else:
                stream.skip_field(number, wire)
    except (WireError, DataError, ValueError) as exc:
        raise SolverError(f"{source}: not a Caffe NetParameter (.caffemodel) ({exc})") from None
    return out


def _read_layer(stream: WireStream, end: int, name_field: int,
                blob_field: int) -> tuple[str, list[torch.Tensor]]:
    name, blobs = "", []
    while not stream.at(end):
        number, wire = stream.key()
        if wire == LEN and number == name_field:
            name = stream.read(stream.length_end(number) - stream.pos).decode(
                "utf-8", errors="replace")
        elif wire == LEN and number == blob_field:
            blobs.append(torch.from_numpy(stream.blob(stream.length_end(number), _empty)))
        else:
            stream.skip_field(number, wire)
    return name, blobs


def encode_state(state: Mapping[str, Any]) -> bytes:
    """A SolverState (iter, learned_net, history, current_step) plus caffe-py's extras."""
    parts = [wire_tag(1, VARINT) + varint(int(state["iter"])),
             len_field(2, str(state.get("learned_net", "")).encode())]
    parts += [len_field(3, encode_blob(blob_from_array(_numpy(h)))) for h in state["history"]]
    parts.append(wire_tag(4, VARINT) + varint(int(state["current_step"])))
    extras = {k: v for k, v in state.items()
              if k not in ("iter", "learned_net", "history", "current_step")}
    buffer = io.BytesIO()
    torch.save(extras, buffer)
    parts.append(len_field(EXTRAS_FIELD, buffer.getvalue()))
    return b"".join(parts)


def read_state(path: str | Path) -> dict[str, Any]:
    """A .solverstate file (Caffe's or caffe-py's), read straight into the history arrays."""
    path = Path(path)
    try:
        with open(path, "rb", buffering=0) as f:
            return _parse_state(WireStream(f, path.stat().st_size), str(path))
    except FileNotFoundError:
        raise SolverError(f"{path}: file not found; check the path") from None


def decode_state(buf: bytes, source: str) -> dict[str, Any]:
    """A SolverState written by Caffe or by caffe-py (then with its extras)."""
    return _parse_state(WireStream(io.BytesIO(buf), len(buf)), source)


def _parse_state(stream: WireStream, source: str) -> dict[str, Any]:
    state: dict[str, Any] = {"iter": 0, "current_step": 0, "learned_net": "", "history": []}
    try:
        while not stream.at(stream.size):
            number, wire = stream.key()
            if number in (1, 4) and wire == VARINT:
                state["iter" if number == 1 else "current_step"] = as_int32(stream.varint())
            elif number == 3 and wire == LEN:
                state["history"].append(torch.from_numpy(stream.blob(stream.length_end(3),
                                                                     _empty)))
            elif number in (2, EXTRAS_FIELD) and wire == LEN:
                payload = stream.read(stream.length_end(number) - stream.pos)
                if number == 2:
                    state["learned_net"] = payload.decode("utf-8", errors="replace")
                else:
                    state.update(_load_extras(payload))
            else:
                stream.skip_field(number, wire)
    except (WireError, DataError, ValueError) as exc:
        raise SolverError(f"{source}: not a Caffe SolverState (.solverstate) ({exc})") from None
    # Caffe stores learned_net as the path it wrote; the file is looked up next to the state.
    state["learned_net"] = Path(state["learned_net"]).name
    return state


def _empty(n: int, dtype: type) -> np.ndarray:
    """An uninitialized array from torch's allocator: numpy asks the kernel for huge pages
    (madvise), and the compaction that can take makes a big read's page faults slow and
    erratic; torch's memory faults in steadily."""
    return torch.empty(n, dtype=torch.float32 if dtype is np.float32 else torch.float64).numpy()


def _load_extras(payload: bytes) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            extras = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 (an unpickling refusal: nothing in it ran)
        raise ValueError("field 1000, caffe-py's extras, does not load safely: "
                         f"{one_line_reason(exc, 100)}") from None
    if not isinstance(extras, dict):
        raise ValueError("field 1000 is not caffe-py's extras table")
    return extras


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()
