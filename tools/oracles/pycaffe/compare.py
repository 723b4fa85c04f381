"""Compare two runs of an example (BVLC's pycaffe's and caffe-py's): what each printed, the
arrays and texts record.py kept, and the files the case names.

Printed text must match line for line once memory addresses (``0x7f...``) are blanked and
the case's ``ignore`` lines (timings) are dropped; every number in it must be within the
tolerance (relative ``rtol``, or one unit of the last digit printed). An array must have the
same shape and ``max|a - b| <= rtol * max(max|b|, 1e-6)``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w])")
ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
RTOL = 1e-4


def printed_numbers_match(expected: str, actual: str, rtol: float) -> bool:
    """Same text around the numbers; each number within ``rtol`` or one last-digit unit."""
    if NUMBER.sub("#", expected) != NUMBER.sub("#", actual):
        return False
    for a, b in zip(NUMBER.findall(actual), NUMBER.findall(expected), strict=True):
        x, y = float(a), float(b)
        digits = b.lower().split("e")[0]
        unit = 10.0 ** -(len(digits.split(".")[1]) if "." in digits else 0)
        if "e" in b.lower():
            unit *= 10.0 ** int(b.lower().split("e")[1])
        if abs(x - y) > max(rtol * abs(y), unit * 1.01, 1e-12):
            return False
    return True


def text_problems(expected: str, actual: str, rtol: float, ignore: list[str],
                  what: str) -> list[str]:
    def lines(text: str) -> list[str]:
        kept = []
        for line in text.splitlines():
            if any(re.search(p, line) for p in ignore):
                continue
            kept.append(ADDRESS.sub("0x?", line.rstrip()))
        return kept

    exp, act = lines(expected), lines(actual)
    problems = []
    if len(exp) != len(act):
        problems.append(f"{what}: {len(act)} lines, expected {len(exp)}")
    for k, (e, a) in enumerate(zip(exp, act, strict=False)):
        if not printed_numbers_match(e, a, rtol):
            problems.append(f"{what} line {k + 1}: {a!r}, expected {e!r}")
            if len(problems) > 8:
                break
    return problems


def array_problem(expected: np.ndarray, actual: np.ndarray, rtol: float, what: str
                  ) -> str | None:
    if expected.shape != actual.shape:
        return f"{what}: shape {actual.shape}, expected {expected.shape}"
    if expected.size == 0:
        return None
    e, a = expected.astype(np.float64), actual.astype(np.float64)
    if not np.array_equal(np.isnan(e), np.isnan(a)):
        return f"{what}: NaN in different places"
    e, a = np.nan_to_num(e), np.nan_to_num(a)
    scale = max(float(np.abs(e).max()), 1e-6)
    error = float(np.abs(a - e).max()) / scale
    return None if error <= rtol else f"{what}: error {error:.3g} > {rtol:g}"


def arrays_of(path: Path) -> dict[str, np.ndarray]:
    """A compared file as named arrays (.npy: one; .npz: its own; .caffemodel: its blobs)."""
    if path.suffix == ".npy":
        return {"": np.load(path)}
    if path.suffix == ".npz":
        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    from caffe_py.solver.caffemodel import read_net

    return {f"{layer}/{i}": b.numpy() for layer, blobs in read_net(path).items()
            for i, b in enumerate(blobs)}


def compare(expected: Path, actual: Path, case: dict[str, Any]) -> list[str]:
    """Every difference between two recorded runs (directories written by run_case)."""
    rtol = case.get("rtol", RTOL)
    ignore = case.get("ignore", [])
    problems = text_problems((expected / "stdout.txt").read_text(),
                             (actual / "stdout.txt").read_text(), rtol, ignore, "stdout")
    with np.load(expected / "plots.npz") as e, np.load(actual / "plots.npz") as a:
        if sorted(e.files) != sorted(a.files):
            problems.append(f"plots: {sorted(a.files)}, expected {sorted(e.files)}")
        for key in sorted(set(e.files) & set(a.files)):
            problem = array_problem(e[key], a[key], rtol, f"plot {key}")
            if problem:
                problems.append(problem)
    exp_texts = json.loads((expected / "texts.json").read_text())
    act_texts = json.loads((actual / "texts.json").read_text())
    problems += text_problems("\n".join(exp_texts), "\n".join(act_texts), rtol, ignore,
                              "texts")
    for name in case["files"]:
        stored = Path(name).name + (".npz" if Path(name).suffix == ".caffemodel" else "")
        exp_file, act_file = expected / "files" / stored, actual / "files" / stored
        if not act_file.exists():
            problems.append(f"{name}: not written")
            continue
        if exp_file.suffix in (".npy", ".npz", ".caffemodel"):
            e_arrays, a_arrays = arrays_of(exp_file), arrays_of(act_file)
            if sorted(e_arrays) != sorted(a_arrays):
                problems.append(f"{name}: holds {sorted(a_arrays)}, expected {sorted(e_arrays)}")
            for key in sorted(set(e_arrays) & set(a_arrays)):
                problem = array_problem(e_arrays[key], a_arrays[key], rtol, f"{name} {key}")
                if problem:
                    problems.append(problem)
        elif exp_file.suffix == ".png":
            if exp_file.read_bytes() != act_file.read_bytes():
                problems.append(f"{name}: the image differs")
        else:
            problems += text_problems(exp_file.read_text(), act_file.read_text(), rtol, [],
                                      name)
    return problems
