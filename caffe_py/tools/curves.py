"""Training curves of several runs, as Caffe's plot_training_log.py draws them from logs.

A run is a metrics table (``<snapshot_prefix>_metrics.csv``), a snapshot prefix (its table), or
a training log, caffe-py's or Caffe's (glog-prefixed lines give the seconds; bare ones the
iterations alone). :func:`read_run` gives its series: name -> points (iteration, seconds or
None, value), named as the table's columns (``loss``: the smoothed training loss, ``lr``,
``train/<output>``, ``test0/<output>``...). :func:`plot` draws the series a list of names asks
for (a name matches every column ending in it: ``accuracy`` is ``test0/accuracy``) against
iterations or seconds, one panel per name, one line per run.
"""
from __future__ import annotations

import csv
import datetime
import io
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import CaffePyError
from ..fileio import atomic_write_bytes

Point = tuple[int, float | None, float]
Series = dict[str, list[Point]]

_ITERATION = re.compile(r"Iteration (\d+)")
_LOSS = re.compile(r"Iteration (\d+).*, loss = ([-+.\deEinfa]+)")
_RATE = re.compile(r"Iteration (\d+), lr = ([-+.\deE]+)")
_TESTING = re.compile(r"Iteration (\d+), Testing net \(#(\d+)\)")
_OUTPUT = re.compile(r"(Train|Test) net output #\d+: (\S+) = ([-+.\deEinfa]+)")
_STAMP = re.compile(r"^[IWEF](\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ")


class PlotError(CaffePyError):
    """A run that cannot be read, or nothing to draw."""


def read_run(path: str | Path) -> Series:
    """The series of one run (a metrics CSV, a snapshot prefix or a log file)."""
    path = Path(path)
    table = path if path.suffix == ".csv" else Path(f"{path}_metrics.csv")
    if table.is_file():
        return _read_table(table)
    if path.is_file():
        return _read_log(path)
    raise PlotError(f"{path}: no such metrics table, snapshot prefix or log; give "
                    "<snapshot_prefix>_metrics.csv, the prefix, or a training log")


def _read_table(path: Path) -> Series:
    series: Series = {}
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = csv.DictReader(f)
            if rows.fieldnames is None or "iteration" not in rows.fieldnames:
                raise PlotError(f"{path}: not a metrics table (no 'iteration' column)")
            for row in rows:
                _read_row(path, rows.line_num, row, series)
    except UnicodeDecodeError:
        raise PlotError(f"{path}: not UTF-8 text; give the "
                        "<snapshot_prefix>_metrics.csv a run wrote") from None
    except csv.Error as exc:
        raise PlotError(f"{path}: not a CSV table ({exc}); give the "
                        "<snapshot_prefix>_metrics.csv a run wrote") from None
    except OSError as exc:
        raise PlotError(f"{path}: cannot read ({(exc.strerror or str(exc)).lower()})") from None
    return series


def _read_row(path: Path, line: int, row: dict[str, str | None], series: Series) -> None:
    """One row's points; a cell that is not a number is an error naming its line and column."""
    def number(column: str, kind: type) -> Any:
        cell = row.get(column)
        try:
            return kind(cell)
        except (TypeError, ValueError):
            what = "an integer" if kind is int else "a number"
            raise PlotError(f"{path}:{line}: column '{column}' holds {cell!r}, not {what}; "
                            "the table is damaged or not a metrics table") from None

    it, sec = number("iteration", int), number("seconds", float)
    for name, cell in row.items():
        if name in ("iteration", "seconds", "phase") or not cell or name is None:
            continue
        if name == "lr" and row.get("phase") != "train":
            continue
        series.setdefault(name, []).append((it, sec, number(name, float)))


def _read_log(path: Path) -> Series:
    """Caffe's (or caffe-py's) training log, read as parse_log.py reads it."""
    series: Series = {}
    start = None
    phase, iteration = "train", 0
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            when = _seconds(line)
            if start is None and "] Solving " in line:
                start = when
            sec = when - start if when is not None and start is not None else None
            if m := _TESTING.search(line):
                phase, iteration = f"test{m.group(2)}", int(m.group(1))
            elif m := _RATE.search(line):
                series.setdefault("lr", []).append((int(m.group(1)), sec, float(m.group(2))))
            elif m := _LOSS.search(line):
                phase, iteration = "train", int(m.group(1))
                series.setdefault("loss", []).append((iteration, sec, float(m.group(2))))
            elif m := _OUTPUT.search(line):
                where = "train" if m.group(1) == "Train" else phase
                series.setdefault(f"{where}/{m.group(2)}", []).append(
                    (iteration, sec, float(m.group(3))))
        except ValueError:  # a number or a time stamp that does not read
            raise PlotError(f"{path}:{number}: the numbers of this line do not read "
                            f"({line.strip()[:60]!r}); the log is damaged") from None
    if not series:
        raise PlotError(f"{path}: no training lines found (not a Caffe or caffe-py log)")
    return series


def _seconds(line: str) -> float | None:
    m = _STAMP.match(line)
    if m is None:
        return None
    month, day, hour, minute, second, micro = (int(g) for g in m.groups())
    stamp = datetime.datetime(2000, month, day, hour, minute, second, micro)
    return stamp.timestamp()


def pick(series: Series, names: Sequence[str]) -> dict[str, list[Point]]:
    """The series ``names`` ask for: each name matches columns equal to or ending in it."""
    out = {}
    for name in names:
        for column in series:
            if column == name or column.endswith(f"/{name}"):
                out[column] = series[column]
    return out


def plot(runs: Sequence[str | Path], out: str | Path, *, x: str = "iterations",
         names: Sequence[str] = ("loss", "accuracy", "lr")) -> dict[str, dict[str, list]]:
    """Draw ``names`` of every run into the image ``out`` (png, svg or pdf); returns what was
    drawn: column -> run -> [(x, value)]."""
    kind = Path(out).suffix.lower().lstrip(".")
    if kind not in PLOT_FORMATS:
        raise PlotError(f"{out}: cpy plot writes {', '.join(PLOT_FORMATS)} images, chosen by the "
                        "file's extension; name the file with one of them (e.g. curves.png)")
    picked = [(run, pick(read_run(run), names)) for run in runs]  # bad inputs first
    try:
        import matplotlib
    except ImportError:
        raise PlotError("cpy plot needs matplotlib: pip install 'caffe-py[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn: dict[str, dict[str, list]] = {}
    for run, series in picked:
        for column, points in series.items():
            xs = [(p[0] if x == "iterations" else p[1], p[2]) for p in points]
            if x == "seconds" and any(v[0] is None for v in xs):
                raise PlotError(f"{run}: its lines carry no time; plot it with --x iterations")
            drawn.setdefault(column, {})[str(run)] = xs
    if not drawn:
        raise PlotError(f"none of {', '.join(names)} is in the runs; give --y with their "
                        "columns (e.g. loss,test0/accuracy,lr)")
    fig, axes = plt.subplots(len(drawn), 1, figsize=(8, 3 * len(drawn)), squeeze=False)
    for ax, (column, by_run) in zip(axes[:, 0], sorted(drawn.items()), strict=True):
        for run, xy in by_run.items():
            ax.plot([p[0] for p in xy], [p[1] for p in xy], label=Path(run).name)
        ax.set_ylabel(column)
        ax.legend(fontsize="small")
    axes[-1, 0].set_xlabel(x)
    fig.tight_layout()
    image = io.BytesIO()
    try:
        fig.savefig(image, format=kind)
    finally:
        plt.close(fig)
    atomic_write_bytes(out, image.getvalue())   # as every file: atomic, a full disk one line
    return drawn


PLOT_FORMATS = ("png", "svg", "pdf")
"""The image kinds ``cpy plot`` writes, by the output's extension."""
