"""Caffe's HDF5 snapshots (``snapshot_format: HDF5``): ``<prefix>_iter_<N>.caffemodel.h5`` and
``<prefix>_iter_<N>.solverstate.h5``, read and written with h5py.

Weights (Net::ToHDF5 / CopyTrainedLayersFromHDF5): a group ``data`` holding one group per
layer, named as the layer, with its blobs as float32 datasets ``0``, ``1``, ... in the blobs'
shapes (Caffe writes a group for every layer, empty for a layer without blobs).

Solver state (SnapshotSolverStateToHDF5): int32 datasets ``iter`` and ``current_step`` of one
element, a string ``learned_net`` (the weights file, as written), and a group ``history`` with
the history blobs as datasets ``0``, ``1``, ... Caffe reads exactly those names, so caffe-py's
extras (generator states, data positions: what exact resumption needs on top) go in one more
dataset, ``caffe_py_extras`` (the bytes of a ``torch.save``, loaded with
``weights_only=True``), which Caffe does not look at.
"""
from __future__ import annotations

import io
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import SolverError, WriteError, one_line_reason
from ..fileio import atomic_write_bytes, is_stream

HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"
EXTRAS = "caffe_py_extras"
INSTALL_FIX = "install it with `pip install h5py` (or `pip install caffe-py[hdf5]`)"


def is_hdf5(path: str | Path) -> bool:
    """Whether the file starts with HDF5's signature (Caffe asks H5Fis_hdf5, not the name)."""
    try:
        with open(path, "rb") as f:
            return f.read(8) == HDF5_MAGIC
    except OSError:
        return False


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise SolverError(f"HDF5 snapshots need the h5py package; {INSTALL_FIX}") from None
    return h5py


def _open(path: Path) -> Any:
    h5py = _h5py()
    if not path.is_file():
        raise SolverError(f"{path}: file not found; check the path")
    if not is_hdf5(path):
        raise SolverError(f"{path}: not an HDF5 file (no HDF5 signature); give a Caffe "
                          ".caffemodel.h5 / .solverstate.h5")
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise SolverError(f"{path}: not a readable HDF5 file ({str(exc).split('(')[0].strip()})"
                          "; give a Caffe .caffemodel.h5 / .solverstate.h5") from None


def save_weights(blobs_by_layer: Mapping[str, Sequence[torch.Tensor]], path: Path,
                 layers: Sequence[str] = ()) -> None:
    """Write a .caffemodel.h5: every layer of ``layers`` (in order, blobs or not) and of
    ``blobs_by_layer``, atomically."""
    h5py = _h5py()

    def write(h5: Any) -> None:
        data = h5.create_group("data")
        for name in dict.fromkeys([*layers, *blobs_by_layer]):
            group = data.create_group(name)
            for j, blob in enumerate(blobs_by_layer.get(name, ())):
                group.create_dataset(str(j), data=_numpy(blob))

    _atomic_h5(Path(path), write, h5py)


def load_weights(path: str | Path) -> dict[str, list[torch.Tensor]]:
    """Layer name -> blobs from a .caffemodel.h5 (layers without blobs left out)."""
    path = Path(path)
    h5py = _h5py()
    with _open(path) as h5:
        data = h5.get("data")
        if not isinstance(data, h5py.Group):
            raise SolverError(f"{path}: no 'data' group; not a Caffe HDF5 weights file "
                              "(.caffemodel.h5)")
        out = {}
        for name, group in _layer_groups(data, h5py):
            blobs = _numbered(group, f"{path}: layer '{name}'")
            if blobs:
                out[name] = blobs
    return out


def _layer_groups(data: Any, h5py: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(layer name, group) of every layer group under ``data``: a name with '/' (GoogLeNet's
    'inception_3a/1x1') is a path of nested groups in HDF5."""
    found = []
    for name, item in data.items():
        if not isinstance(item, h5py.Group):
            continue
        if any(isinstance(child, h5py.Group) for child in item.values()):
            found += _layer_groups(item, h5py, f"{prefix}{name}/")
        else:
            found.append((f"{prefix}{name}", item))
    return found


def save_state(state: Mapping[str, Any], path: Path) -> None:
    """Write a .solverstate.h5 (Caffe's fields plus caffe-py's extras), atomically."""
    h5py = _h5py()
    learned = str(state.get("learned_net", "")).encode()
    extras = {k: v for k, v in state.items()
              if k not in ("iter", "learned_net", "history", "current_step")}
    buffer = io.BytesIO()
    torch.save(extras, buffer)

    def write(h5: Any) -> None:
        h5.create_dataset("iter", data=np.array([int(state["iter"])], np.int32))
        h5.create_dataset("learned_net", data=np.array(learned + b"\0",
                                                       dtype=f"S{len(learned) + 1}"))
        h5.create_dataset("current_step", data=np.array([int(state["current_step"])],
                                                        np.int32))
        history = h5.create_group("history")
        for i, blob in enumerate(state["history"]):
            history.create_dataset(str(i), data=_numpy(blob))
        h5.create_dataset(EXTRAS, data=np.frombuffer(buffer.getvalue(), np.uint8))

    _atomic_h5(Path(path), write, h5py)


def load_state(path: str | Path) -> dict[str, Any]:
    """A solver state written by Caffe (SnapshotSolverStateToHDF5) or by caffe-py."""
    path = Path(path)
    h5py = _h5py()
    with _open(path) as h5:
        try:
            state: dict[str, Any] = {"iter": int(np.asarray(h5["iter"]).reshape(-1)[0]),
                                     "current_step": int(np.asarray(h5["current_step"])
                                                         .reshape(-1)[0])}
        except (KeyError, IndexError, TypeError, ValueError):
            raise SolverError(f"{path}: no 'iter' and 'current_step'; not a Caffe HDF5 solver "
                              "state (.solverstate.h5)") from None
        learned = h5.get("learned_net")
        raw = learned[()] if isinstance(learned, h5py.Dataset) else b""
        raw = raw.tobytes() if isinstance(raw, np.ndarray) else raw
        name = raw.split(b"\0", 1)[0].decode("utf-8", errors="replace") \
            if isinstance(raw, bytes) else str(raw)
        state["learned_net"] = Path(name).name  # looked up next to the state file
        history = h5.get("history")
        state["history"] = _numbered(history, f"{path}: history") \
            if isinstance(history, h5py.Group) else []
        if EXTRAS in h5:
            state.update(_extras(np.asarray(h5[EXTRAS], np.uint8).tobytes(), path))
    return state


def _atomic_h5(path: Path, fill: Any, h5py: Any) -> None:
    """Write an HDF5 file atomically: made in memory, then written as every other file is
    (:func:`~caffe_py.fileio.atomic_write_bytes`: a temporary beside ``path``, fsynced, renamed;
    the mode a plain open gives; a full disk is the one-line error, the previous file intact).
    Written by HDF5 itself into the temporary, a full disk was a traceback from HDF5, or a
    segfault inside it, and the file's mode was 0600."""
    if is_stream(path):
        raise WriteError(str(path), f"cannot write {path}: an HDF5 snapshot needs a regular "
                         "file, not a device or a pipe; write it elsewhere")
    buffer = io.BytesIO()
    with h5py.File(buffer, "w") as h5:
        fill(h5)
    atomic_write_bytes(path, buffer.getvalue())


def _numbered(group: Any, where: str) -> list[torch.Tensor]:
    """Datasets '0', '1', ... of a group as float32 tensors, in number order."""
    names = sorted(group.keys(), key=lambda k: int(k) if k.isdigit() else -1)
    if any(not n.isdigit() for n in names) or [int(n) for n in names] != list(range(len(names))):
        raise SolverError(f"{where} holds {', '.join(names)}; Caffe numbers blobs 0, 1, ...")
    return [_float_blob(group, n, where) for n in names]


def _float_blob(group: Any, name: str, where: str) -> torch.Tensor:
    """Dataset ``name`` of ``group`` as a float32 tensor; a dataset of strings, complex or
    compound values, or a link to nothing, is a one-line error."""
    try:
        dataset = group[name]
        if dataset.dtype.kind not in "fiu":
            raise TypeError(f"its values are {dataset.dtype}")
        return torch.from_numpy(np.asarray(dataset, dtype=np.float32))
    except (KeyError, OSError, TypeError, ValueError, AttributeError) as exc:
        raise SolverError(f"{where} blob {name} is not an array of numbers "
                          f"({one_line_reason(exc)}); the file is damaged: use another "
                          "copy") from None


def _extras(payload: bytes, path: Path) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            extras = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 (any failure means the dataset is not ours)
        raise SolverError(f"{path}: its '{EXTRAS}' dataset does not load ({type(exc).__name__})"
                          "; resume from an unchanged solver state") from None
    if not isinstance(extras, dict):
        raise SolverError(f"{path}: its '{EXTRAS}' dataset is not caffe-py's extras table")
    return extras


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu", torch.float32).numpy()
