"""Snapshot files: weights (``<prefix>_iter_<N>.pt``) and solver state
(``<prefix>_iter_<N>.solverstate.pt``), written atomically and loaded safely.

A weights file maps layer name -> its blobs in Caffe order, so weights copy by layer name as a
.caffemodel does. A solver state holds what Caffe's SolverState holds (iteration, current_step,
history blobs, the weights file it goes with) plus what exact resumption needs on top: the
random generators (torch CPU/CUDA, each layer's own) and the data readers' positions.

Both are ``torch.save`` dictionaries of tensors and plain values, loaded with
``torch.load(weights_only=True)``, which builds no Python objects but those: nothing in a
snapshot can execute code. Each is written to a temporary file in the target directory, flushed
and fsynced, then renamed over the target (``os.replace``), so a crash mid-write leaves either
the old file or none, never a truncated one that loads.
"""
from __future__ import annotations

import itertools
import math
import struct
import tempfile
import warnings
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from ..errors import SolverError, one_line_reason
from ..fileio import atomic_write, atomic_write_bytes, blocking_file, exists, is_file
from ..spec.schema import INT64_MAX, INT64_MIN
from . import caffemodel, hdf5_snapshot

FORMAT_VERSION = 1
WEIGHTS_KIND, STATE_KIND = "weights", "solverstate"
STATE_SUFFIX = ".solverstate"


def snapshot_paths(prefix: str, iteration: int, fmt: str = "pt") -> tuple[Path, Path]:
    """(weights, solver state) paths for ``iteration``: no zero padding, as Caffe.

    ``pt``: ``.pt`` and ``.solverstate.pt``; ``caffemodel``: Caffe's ``.caffemodel`` and
    ``.solverstate``; ``HDF5``: Caffe's ``.caffemodel.h5`` and ``.solverstate.h5``."""
    stem = f"{prefix}_iter_{iteration}"
    if fmt == "caffemodel":
        return Path(f"{stem}.caffemodel"), Path(f"{stem}{STATE_SUFFIX}")
    if fmt == "HDF5":
        return Path(f"{stem}.caffemodel.h5"), Path(f"{stem}{STATE_SUFFIX}.h5")
    return Path(f"{stem}.{fmt}"), Path(f"{stem}{STATE_SUFFIX}.{fmt}")


WEIGHTS_SUFFIXES = {".pt": "pt", ".caffemodel": "caffemodel", ".caffemodel.h5": "HDF5"}
STATE_SUFFIXES = {".solverstate.pt": "pt", ".solverstate": "caffemodel",
                  ".solverstate.h5": "HDF5"}
"""The snapshot files of one iteration in each snapshot_format (solver_spec's names)."""


def not_found(path: str | Path) -> SolverError:
    """A snapshot file that is not there; when the same snapshot exists in another format
    (``-weights x.caffemodel`` where the run wrote ``x.pt``), the error names that file."""
    path = Path(path)
    table = STATE_SUFFIXES if is_state_path(path) else WEIGHTS_SUFFIXES
    name = path.name
    given = max((suffix for suffix in table if name.endswith(suffix)), key=len, default="")
    stem = name[:len(name) - len(given)] if given else name
    for suffix, fmt in table.items():
        sibling = path.with_name(stem + suffix)
        if suffix != given and is_file(sibling):
            wanted = f", or train with snapshot_format: {table[given]} for {given} files" \
                if given else ""
            return SolverError(f"{path}: file not found; that snapshot is {sibling} "
                               f"(snapshot_format: {fmt}): give that file{wanted}")
    return SolverError(f"{path}: file not found; check the path")


def require_regular(path: Path, what: str) -> None:
    """A file that exists but is a directory, a device or a pipe (``--weights /dev/null``) is
    named as such, not as a missing file."""
    if not is_file(path):
        kind = "a directory" if path.is_dir() else "a device or a pipe"
        raise SolverError(f"{path}: is {kind}, not a file; give {what} written by cpy train "
                          "(or Caffe)")


def is_state_path(path: str | Path) -> bool:
    """Whether the file name says solver state (``*.solverstate`` or ``*.solverstate.<ext>``)."""
    name = Path(path).name
    return name.endswith(STATE_SUFFIX) or f"{STATE_SUFFIX}." in name


def check_writable(prefix: str) -> None:
    """Fail before training when snapshots cannot be written (Caffe's
    CheckSnapshotWritePermissions); the directory is created when missing."""
    directory = Path(prefix).parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write_test_", suffix=".tmp"):
            pass
    except OSError as exc:
        blocking = blocking_file(Path(prefix))
        reason = f"{blocking} is a file, not a directory" if blocking is not None else \
            exc.strerror or str(exc)
        raise SolverError(f"cannot write snapshots to '{directory}' (snapshot_prefix {prefix}): "
                          f"{reason}; make the directory writable or change "
                          "snapshot_prefix") from None


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temp file in the same directory, fsync, then rename over ``path``."""
    atomic_write(path, lambda f: torch.save(obj, f))


def save_weights(blobs_by_layer: Mapping[str, list[torch.Tensor]], path: Path,
                 types: Mapping[str, str] | None = None, net_name: str = "") -> None:
    """Write layer name -> blobs: a Caffe NetParameter for ``.caffemodel``, Caffe's HDF5 layout
    for ``.h5``, else torch.save."""
    path = Path(path)
    if path.suffix == ".h5":
        hdf5_snapshot.save_weights(blobs_by_layer, path, list(types or {}))
        return
    if path.suffix == ".caffemodel":
        payload = caffemodel.encode_net(net_name, blobs_by_layer, types)
        atomic_write_bytes(path, payload)
        return
    layers = {name: [b.detach().to("cpu", copy=True) for b in blobs]
              for name, blobs in blobs_by_layer.items()}
    atomic_save({"caffe_py": WEIGHTS_KIND, "version": FORMAT_VERSION, "layers": layers}, path)


def load_weights(path: str | Path) -> dict[str, list[torch.Tensor]]:
    """Layer name -> blobs from a weights file; a solver state or a foreign file is an error."""
    path = Path(path)
    if is_state_path(path):
        raise SolverError(f"{path} is a solver state, not weights; pass it to --snapshot to "
                          "resume training, or give the matching weights file to --weights")
    if not exists(path):
        raise not_found(path)
    require_regular(path, "weights")
    if hdf5_snapshot.is_hdf5(path) or path.suffix == ".h5":  # by content, as H5Fis_hdf5
        return hdf5_snapshot.load_weights(path)
    if path.suffix == ".caffemodel":
        return caffemodel.read_net(path)
    data = _load(path, WEIGHTS_KIND)
    layers = data.get("layers")
    if not isinstance(layers, dict) or not all(
            isinstance(v, list) and all(isinstance(t, torch.Tensor) for t in v)
            for v in layers.values()):
        raise SolverError(f"{path}: the weights file is damaged (no layer -> blobs table)")
    return layers


def save_state(state: dict[str, Any], path: Path) -> None:
    """A Caffe SolverState (plus extras) for ``*.solverstate``, Caffe's HDF5 layout for
    ``*.solverstate.h5``, else torch.save."""
    path = Path(path)
    if path.name.endswith(f"{STATE_SUFFIX}.h5"):
        hdf5_snapshot.save_state(state, path)
        return
    if path.name.endswith(STATE_SUFFIX):
        payload = caffemodel.encode_state(state)
        atomic_write_bytes(path, payload)
        return
    atomic_save({"caffe_py": STATE_KIND, "version": FORMAT_VERSION, **state}, path)


def load_state(path: str | Path) -> dict[str, Any]:
    """A solver state; a weights file or a foreign file is an error."""
    path = Path(path)
    if not is_state_path(path) and exists(path):
        raise SolverError(f"{path} is not a solver state (its name has no '.solverstate'); "
                          "pass weights to --weights, or give the <prefix>_iter_<N>.solverstate"
                          ".pt file to --snapshot")
    if not exists(path):
        raise not_found(path)
    require_regular(path, "a solver state")
    if hdf5_snapshot.is_hdf5(path) or path.suffix == ".h5":
        state = hdf5_snapshot.load_state(path)
        state.setdefault("type", None)
    elif path.name.endswith(STATE_SUFFIX):
        state = caffemodel.read_state(path)
        state.setdefault("type", None)
    else:
        state = _load(path, STATE_KIND)
    for key in ("iter", "current_step"):
        value = state.get(key)
        if type(value) is not int or not 0 <= value <= INT64_MAX:   # bool is an int too
            raise SolverError(f"{path}: the solver state is damaged ('{key}' is "
                              f"{'missing' if value is None else repr(value)}, not an "
                              "iteration count); resume from another state")
    if not isinstance(state.get("history"), list):
        raise SolverError(f"{path}: the solver state is damaged ('history' is missing); "
                          "resume from another state")
    seed, seconds = state.get("random_seed"), state.get("seconds")
    if seed is not None and (type(seed) is not int or not INT64_MIN <= seed <= INT64_MAX):
        raise SolverError(f"{path}: the solver state is damaged ('random_seed' is {seed!r}, "
                          "not a 64-bit integer); resume from another state")
    if seconds is not None and (not isinstance(seconds, (int, float))
                                or not math.isfinite(seconds) or seconds < 0):
        raise SolverError(f"{path}: the solver state is damaged ('seconds' is {seconds!r}, "
                          "not a time); resume from another state")
    paired = state.get(PAIRED)
    if paired is not None and not (isinstance(paired, dict) and all(
            type(paired.get(k)) is int for k in ("size", "crc32"))):
        raise SolverError(f"{path}: the solver state is damaged ('{PAIRED}' is {paired!r}, not "
                          "a size and a CRC); resume from another state")
    return state


def state_seed(path: str | Path) -> int | None:
    """The run's seed a solver state was trained with (None: the state does not say, e.g.
    one of Caffe's)."""
    seed = load_state(path).get("random_seed")
    return seed if isinstance(seed, int) and seed >= 0 else None


def iteration_of(state_path: str | Path) -> int | str:
    """N of a ``<prefix>_iter_<N>.solverstate...`` file name (the name itself otherwise)."""
    name = Path(state_path).name
    digits = name.split("_iter_")[-1].split(".")[0]
    return int(digits) if "_iter_" in name and digits.isdigit() else name.split(".")[0]


def weights_path_of(state: Mapping[str, Any], state_path: str | Path) -> Path:
    """The weights file a state goes with (saved by name, found next to the state file)."""
    return Path(state_path).parent / str(state.get("learned_net", ""))


PAIRED = "learned_net_file"
"""The solver state's record of the weights file written with it: its size and CRC-32."""


def fingerprint(path: str | Path) -> dict[str, int]:
    """``{"size": bytes, "crc32": CRC-32}`` of a file, read once."""
    crc, size = 0, 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc, size = zlib.crc32(chunk, crc), size + len(chunk)
    return {"size": size, "crc32": crc}


def paired_weights(state: Mapping[str, Any], state_path: str | Path) -> Path:
    """The weights file of a solver state, checked to be the one written with it (a state
    caffe-py wrote records its size and CRC; Caffe's states do not, and are taken as they
    are): a weights file of another run under the same name (one that started over with
    --overwrite, say) is refused rather than resumed with this state's history and iteration."""
    weights = weights_path_of(state, state_path)
    if not weights.is_file():
        raise SolverError(f"{state_path}: its weights file {weights} is missing; keep the "
                          "<prefix>_iter_<N> weights next to the solver state")
    saved = state.get(PAIRED)
    if not isinstance(saved, dict):
        return weights
    try:
        found = fingerprint(weights)
    except OSError as exc:
        raise SolverError(f"{weights}: cannot read ({(exc.strerror or str(exc)).lower()}); "
                          "check the file") from None
    if found != {"size": saved.get("size"), "crc32": saved.get("crc32")}:
        raise SolverError(
            f"{state_path}: its weights file {weights.name} is not the one written with it "
            f"({found['size']:,} bytes, CRC {found['crc32']:08x}; the state was saved with "
            f"{saved.get('size', 0):,} bytes, CRC {saved.get('crc32', 0):08x}): another run "
            "wrote that name since (one started over with --overwrite, say); resume from "
            "another state, or start a new run from those weights with --weights")
    return weights


def verify_checksums(path: Path) -> None:
    """Check a ``torch.save`` file's zip directory, then every record against the CRC-32 that
    directory holds (``torch.load`` itself does neither): a flipped byte or a torn file is a
    one-line error instead of weights that load with wrong values.

    torch.save writes each record once, uncompressed, one after the other. A directory that
    says otherwise (a compressed record, a name twice, records that overlap or reach past the
    end of the file) is refused before any record is read: such a file could make the check
    inflate gigabytes that ``torch.load`` never reads. The records are then read once each,
    so the check costs one pass over the file."""
    if not zipfile.is_zipfile(path):
        return  # not torch.save's zip: the safe loader says what it is
    fix = "the file is damaged; use an earlier snapshot, or copy it again"
    try:
        with zipfile.ZipFile(path) as archive, path.open("rb") as raw:
            spans = _record_spans(archive.infolist(), raw, path.stat().st_size)
            bad = next((info.filename for info, start in spans
                        if _crc_of(raw, start, info.compress_size) != info.CRC), None)
    except _NotTorchZip as exc:
        raise SolverError(f"{path}: its zip directory is not torch.save's ({exc}); the file "
                          "is damaged or was not written by caffe-py: use an earlier snapshot, "
                          "or give a file written by cpy train") from None
    except (zipfile.BadZipFile, EOFError, OSError, RuntimeError, struct.error) as exc:
        raise SolverError(f"{path}: {one_line_reason(exc)}; {fix}") from None
    if bad is not None:
        raise SolverError(f"{path}: checksum mismatch in its record '{bad}'; {fix}")


class _NotTorchZip(Exception):
    """A zip directory torch.save would not have written."""


_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # signature ... name length, extra length
_CHUNK = 1 << 20


def _record_spans(infos: list[zipfile.ZipInfo], raw: BinaryIO,
                  size: int) -> list[tuple[zipfile.ZipInfo, int]]:
    """(entry, offset of its data) per record, after the checks of :func:`verify_checksums`."""
    names: set[str] = set()
    spans = []
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED:
            raise _NotTorchZip(f"record '{info.filename}' is compressed")
        if info.filename in names:
            raise _NotTorchZip(f"record '{info.filename}' is named twice")
        names.add(info.filename)
        if info.file_size != info.compress_size or \
                info.header_offset + _LOCAL_HEADER.size + info.compress_size > size:
            raise _NotTorchZip(f"record '{info.filename}' claims {info.file_size:,} bytes "
                               f"at offset {info.header_offset:,} of a {size:,}-byte file")
        raw.seek(info.header_offset)
        header = raw.read(_LOCAL_HEADER.size)
        if len(header) != _LOCAL_HEADER.size or header[:4] != b"PK\x03\x04":
            raise _NotTorchZip(f"record '{info.filename}' has no local header")
        fields = _LOCAL_HEADER.unpack(header)
        start = info.header_offset + _LOCAL_HEADER.size + fields[-2] + fields[-1]
        if start + info.compress_size > size:
            raise _NotTorchZip(f"record '{info.filename}' reaches past the end of the file")
        spans.append((info, start))
    ordered = sorted(spans, key=lambda span: span[0].header_offset)
    for (info, start), (after, _) in itertools.pairwise(ordered):
        if start + info.compress_size > after.header_offset:
            raise _NotTorchZip(f"records '{info.filename}' and '{after.filename}' overlap")
    return spans


def _crc_of(raw: BinaryIO, start: int, length: int) -> int:
    raw.seek(start)
    crc = 0
    while length > 0:
        chunk = raw.read(min(length, _CHUNK))
        if not chunk:
            raise EOFError("the file ends inside a record")
        crc = zlib.crc32(chunk, crc)
        length -= len(chunk)
    return crc


def _load(path: Path, want: str) -> dict[str, Any]:
    if not is_file(path):
        raise not_found(path)
    verify_checksums(path)
    try:
        with warnings.catch_warnings():  # a foreign pickle's protocol warning is noise here
            warnings.simplefilter("ignore")
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 (any unpickling failure means "not ours")
        raise SolverError(f"{path}: not a caffe-py snapshot that loads safely "
                          f"({one_line_reason(exc)}); give a "
                          "file written by cpy train") from None
    kind = data.get("caffe_py") if isinstance(data, dict) else None
    if kind != want:
        what = {WEIGHTS_KIND: "weights", STATE_KIND: "a solver state"}.get(str(kind),
                                                                           "not caffe-py's")
        flag = "--weights" if want == WEIGHTS_KIND else "--snapshot"
        raise SolverError(f"{path}: holds {what}, which {flag} does not take; pass weights to "
                          "--weights and <prefix>_iter_<N>.solverstate.pt to --snapshot")
    if data.get("version") != FORMAT_VERSION:
        raise SolverError(f"{path}: snapshot format version {data.get('version')!r} is not "
                          f"{FORMAT_VERSION}; write it again with this caffe-py")
    return data


def states_of(prefix: str) -> list[tuple[int, Path]]:
    """The solver states written for ``prefix`` (any format), newest first: (iteration, path)."""
    found = []
    directory, stem = Path(prefix).parent, Path(prefix).name
    if not directory.is_dir():
        return []
    for path in directory.glob(f"{stem}_iter_*{STATE_SUFFIX}*"):
        digits = path.name[len(stem) + len("_iter_"):].split(".")[0]
        if digits.isdigit() and not path.name.endswith(".tmp"):
            found.append((int(digits), path))
    return sorted(found, reverse=True)


def latest_state(prefix: str) -> tuple[Path, list[str]]:
    """The newest solver state of ``prefix`` that loads whole (its checksums and its weights
    file included), and one line per newer state skipped and why."""
    skipped = []
    for _, path in states_of(prefix):
        try:
            load_weights(paired_weights(load_state(path), path))
        except SolverError as exc:
            skipped.append(f"Skipping {path}: {exc}")
            continue
        return path, skipped
    raise SolverError(f"--snapshot latest: no solver state of snapshot_prefix {prefix} loads "
                      f"({len(skipped)} found); start without --snapshot")
