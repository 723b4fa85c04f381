"""Helpers the suite's modules share (importable as ``support``: tests/ is on the path)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from caffe_py.commands.output import GLOG_PREFIX
from caffe_py.io.db import open_writer
from caffe_py.io.formats.datum import Datum, datum_from_array, encode_datum

ROOT = Path(__file__).resolve().parent.parent


def data_net(layer):
    """A stand-in for a Net whose one Data layer is ``layer`` (what attach_feeds reads)."""
    return type("Net", (), {"data_layers": lambda self: [layer]})()


def lockstep_batches(pool, layers, steps: int, *, device="cpu", state=None):
    """Each Data layer's feed attached to ``pool`` (replica i, seed 3), ``state`` loaded, the
    pool started, then ``steps`` rounds of one batch from every layer, on the host:
    (feeds, batches)."""
    from caffe_py.io import attach_feeds

    feeds = [attach_feeds(data_net(layer), pool, replica=i, device=device, seed=3)[0]
             for i, layer in enumerate(layers)]
    if state is not None:
        pool.load_state_dict(state)
    pool.start()
    return feeds, [[tuple(t.cpu() for t in layer()) for layer in layers] for _ in range(steps)]


def load_script(path: str | Path):
    """A script of the repository (``path`` relative to its root, or absolute) as a fresh
    module, registered under its file's stem first: a script's dataclasses resolve their
    annotations through sys.modules, and one script may import another."""
    path = ROOT / path
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (:func:`load_script`)."""
    return load_script(f"benchmarks/{name}.py")


def write_db(path: str | Path, values: Iterable[Datum | bytes], *,
             keys: Sequence[bytes] | None = None, key: bytes = b"%08d",
             backend: str = "lmdb") -> str:
    """A database (``backend`` lmdb or leveldb) of ``values``: a Datum is stored encoded, bytes
    as given (corrupt or hand-made records). Record i's key is ``keys[i]``, else ``key % i``.
    Returns the path as a string, as specs name it."""
    with open_writer(path, backend) as writer:
        for i, value in enumerate(values):
            data = encode_datum(value) if isinstance(value, Datum) else value
            writer.put(keys[i] if keys is not None else key % i, data)
    return str(path)


def write_records(path: str | Path, records: Iterable[tuple[np.ndarray, int]],
                  replace: Mapping[int, bytes] | None = None) -> str:
    """An LMDB of Datum records as Caffe's converters write them: record i is (array (C, H, W),
    label), key ``%08d``; ``replace`` stores other bytes at some indices (corrupt records).
    Returns the path as a string, as specs name it."""
    return write_db(path, ((replace or {}).get(i, datum_from_array(array, label))
                           for i, (array, label) in enumerate(records)))


def count_cursor_reads(monkeypatch) -> list[int]:
    """From now on, the records each LMDB cursor read returns, appended to the list returned
    (how many records the readers read)."""
    from caffe_py.io.db.lmdb_store import LmdbCursor

    read: list[int] = []
    cursor_read = LmdbCursor.read

    def counted(self, count):
        keys, values = cursor_read(self, count)
        read.append(len(keys))
        return keys, values

    monkeypatch.setattr(LmdbCursor, "read", counted)
    return read


def cli_process(workdir: Path, *args: str) -> subprocess.Popen:
    """``python cli.py ARGS`` in ``workdir``, unbuffered, its output on pipes (text)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, str(ROOT / "cli.py"), *args], cwd=workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for(proc: subprocess.Popen, needle: str, seen: list[str], timeout: float = 60) -> str:
    """Read ``proc``'s log lines (stderr, without glog's prefix) into ``seen`` until one holds
    ``needle`` (returned); the process is killed and the test fails when it ends or
    ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        line = bare(line.rstrip("\n"))
        seen.append(line)
        if needle in line:
            return line
    proc.kill()
    raise AssertionError(f"never saw {needle!r}; got {seen[-5:]}")


def bare(line: str) -> str:
    """A log line without glog's prefix (a pipe's lines carry it)."""
    return GLOG_PREFIX.sub("", line)


def bare_lines(text: str) -> list[str]:
    return [bare(line) for line in text.splitlines()]


RUN_FILES = ("_metrics.csv", "_solver.yaml", "_net.yaml")


def snapshot_names(directory: Path, start: str = "") -> list[str]:
    """The snapshot files in ``directory`` (names starting with ``start``), sorted; the
    metrics table and the resolved specs a run also writes there are left out."""
    return sorted(p.name for p in Path(directory).iterdir()
                  if p.name.startswith(start) and not p.name.endswith(RUN_FILES))


# the tiny nets of the command-line tests: a data layer, an InnerProduct of 3 outputs and a
# SoftmaxWithLoss, with extra layers after them
DUMMY_DATA = """\
  - name: data
    type: DummyData
    top: [data, label]
    dummy_data_param:
      shape: [{dim: [4, 6]}, {dim: [4]}]
      data_filler: [{type: gaussian}, {type: uniform, min: 0, max: 2.99}]
"""
IP_AND_LOSS = """\
  - name: ip
    type: InnerProduct
    bottom: data
    top: ip
    inner_product_param: {num_output: 3, weight_filler: {type: xavier}}
  - name: loss
    type: SoftmaxWithLoss
    bottom: [ip, label]
    top: loss
"""


def tiny_net(data: str = DUMMY_DATA, extra: str = "") -> str:
    """The YAML of a tiny net: ``data`` (a layer list entry), then IP_AND_LOSS, then ``extra``."""
    return "name: tiny\nlayer:\n" + data + IP_AND_LOSS + extra


# ... with a TEST accuracy, and its solver (display 5, a test every 10)
TINY_NET = tiny_net(extra="""\
  - name: acc
    type: Accuracy
    bottom: [ip, label]
    top: acc
    include: {phase: TEST}
""")
CONV_BIAS_NET = """
name: conv
layer:
  - {name: data, type: Input, top: data, input_param: {shape: {dim: [4, 3, 9, 9]}}}
  - {name: conv1, type: Convolution, bottom: data, top: conv1,
     convolution_param: {num_output: 5, kernel_size: 3, weight_filler: {type: gaussian, std: 0.1},
                         bias_filler: {type: gaussian, std: 0.5}}}
  - {name: up, type: Deconvolution, bottom: conv1, top: up,
     convolution_param: {num_output: 2, kernel_size: 2, stride: 2,
                         weight_filler: {type: gaussian, std: 0.1},
                         bias_filler: {type: gaussian, std: 0.5}}}
"""
"""A Convolution and a Deconvolution with biases (tests of the bias gradient's kernel)."""

TINY_SOLVER = """\
net: net.yaml
base_lr: 0.05
max_iter: 20
display: 5
test_iter: 2
test_interval: 10
snapshot_after_train: false
snapshot_prefix: snaps/tiny
random_seed: 3
"""


def error_line(stderr: str) -> str:
    """The one-line error that ends a failed command's stderr (where Caffe's log lines come
    before it): exactly one ``Error: ...`` line, last, and no traceback."""
    lines = stderr.strip().splitlines()
    assert lines and lines[-1].startswith("Error: "), stderr[-2000:]
    assert sum(line.startswith("Error: ") for line in lines) == 1, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    return lines[-1]


def log_lines(stderr: str) -> list[str]:
    """A command's log lines (stderr), without glog's prefix and without a final error line."""
    return [bare(line) for line in stderr.splitlines() if not line.startswith("Error: ")]


TREE_CACHES = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis"}
"""Tool caches inside the checkout (hypothesis keeps its example database in .hypothesis)."""


def tree_state(root: Path) -> dict[str, tuple[int, int]] | None:
    """Every file of the checkout at ``root`` that git reports changed, untracked or ignored
    (caches aside), with its size and modification time (-1, -1: deleted); None when ``root``
    is not a git checkout (a test run from an unpacked sdist)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain=v1", "-z", "--no-renames",
                              "--ignored", "--untracked-files=all"], cwd=root,
                             capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    state = {}
    for entry in out.decode(errors="surrogateescape").split("\0"):
        path = entry[3:]
        if not path or TREE_CACHES.intersection(Path(path).parts):
            continue
        try:
            stat = (root / path).stat()
        except FileNotFoundError:
            state[path] = (-1, -1)
        else:
            state[path] = (stat.st_size, stat.st_mtime_ns)
    return state


def tree_changes(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
                 ) -> list[str]:
    """The paths written, made or deleted between two :func:`tree_state` looks."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
