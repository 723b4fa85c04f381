"""The run's numbers as a table: ``<snapshot_prefix>_metrics.csv`` beside the snapshots.

One row per display (phase ``train``: the smoothed loss and every TRAIN net output) and one per
test pass of each TEST net (phase ``test0``, ``test1``...: its mean outputs); every row has the
iteration, the seconds since the run started and the learning rate. The columns are fixed when
the run starts, from the nets' output blobs: ``train/<name>`` and ``test<k>/<name>``, one per
value (``<name>[i]`` for an output of several values, e.g. per-class accuracies); a row leaves
the other phases' columns empty. The last row of a run is its final iteration's (the loss
Caffe prints after the last update). A resumed run appends to the file when its columns are
the same, and starts it afresh otherwise; its ``seconds`` go on from the time the solver state
records (or, for a state without it, from the table's last row at or before its iteration).
"""
from __future__ import annotations

import csv
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..errors import CaffePyError
from ..fileio import write_error

if TYPE_CHECKING:
    from ..net import Net

FIXED = ["iteration", "seconds", "phase", "lr", "loss"]


def output_columns(net: Net, phase: str) -> list[str]:
    """``phase/<name>`` (or ``phase/<name>[i]``) per value of each of ``net``'s outputs."""
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in net.layers:
        for top, shape in zip(layer.spec.top, layer.top_shapes, strict=True):
            # a DetectionEvaluate top is reported as its mAP (detection_eval.py): one value
            shapes[top] = () if layer.spec.type == "DetectionEvaluate" else tuple(shape)
    columns = []
    for name in sorted(net.output_names):  # Caffe numbers outputs by name
        count = math.prod(shapes.get(name, ()))
        columns += [f"{phase}/{name}"] if count == 1 else \
            [f"{phase}/{name}[{i}]" for i in range(count)]
    return columns


class MetricsFile:
    """Rows into the CSV file (flushed each, so a killed run keeps what it wrote)."""

    def __init__(self, path: str | Path, columns: Sequence[str], *, resume: bool,
                 tensorboard: str | Path | None = None, seconds: float = 0.0):
        self.path, self.columns = Path(path), list(columns)
        self.start = time.perf_counter() - seconds
        """When the run would have started, trained without a break (``seconds``: the time
        trained before a resume)."""
        self.board = _board(tensorboard) if tensorboard else None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            append = resume and self._same_columns()
            self.file = self.path.open("a" if append else "w", newline="", encoding="utf-8")
        except OSError as exc:
            raise write_error(self.path, exc) from None
        self.writer = csv.writer(self.file)
        if not append:
            self._write(self.columns)

    def _same_columns(self) -> bool:
        try:
            with self.path.open(newline="", encoding="utf-8") as f:
                return next(csv.reader(f), None) == self.columns
        except OSError:
            return False

    def row(self, iteration: int, phase: str, lr: float, loss: float | None,
            values: Mapping[str, torch.Tensor]) -> None:
        """One row: ``values`` maps output names to their values (flattened in order)."""
        cells: dict[str, Any] = {"iteration": iteration, "seconds": f"{self.seconds():.3f}",
                                 "phase": phase, "lr": f"{lr:g}",
                                 "loss": "" if loss is None else f"{loss:g}"}
        for name, value in values.items():
            flat = value.detach().float().reshape(-1).tolist()
            if len(flat) == 1:
                cells[f"{phase}/{name}"] = f"{flat[0]:g}"
            else:
                cells.update({f"{phase}/{name}[{i}]": f"{v:g}" for i, v in enumerate(flat)})
        self._write([cells.get(c, "") for c in self.columns])
        if self.board is not None:
            for column, cell in cells.items():
                if column not in ("iteration", "seconds", "phase") and cell != "":
                    self.board.add_scalar(column, float(cell), iteration)
            self.board.flush()

    def seconds(self) -> float:
        """Seconds since the run started (resumes included)."""
        return time.perf_counter() - self.start

    def _write(self, cells: Sequence[Any]) -> None:
        try:
            self.writer.writerow(cells)
            self.file.flush()
        except OSError as exc:
            raise write_error(self.path, exc) from None

    def close(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass
        if self.board is not None:
            self.board.close()


def _board(directory: str | Path) -> Any:
    """A TensorBoard event writer into ``directory``."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise CaffePyError("--tensorboard needs the tensorboard package: pip install "
                           "'caffe-py[tensorboard]'") from None
    try:
        return SummaryWriter(str(directory))
    except OSError as exc:
        raise write_error(Path(directory), exc) from None


def metrics_path(snapshot_prefix: str) -> Path:
    return Path(f"{snapshot_prefix}_metrics.csv")



def seconds_at(path: str | Path, iteration: int) -> float:
    """The ``seconds`` of the table's last row at or before ``iteration`` (0.0: none)."""
    found = 0.0
    try:
        with Path(path).open(newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                try:
                    if int(row["iteration"]) <= iteration:
                        found = float(row["seconds"])
                except (KeyError, TypeError, ValueError):
                    continue
    except OSError:
        return 0.0
    return found
