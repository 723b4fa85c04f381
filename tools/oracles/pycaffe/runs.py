"""Running one example of pycaffe_cases.py in a prepared workspace, under either pycaffe.

:func:`run_case` runs ``record.py`` around the case's script and collects what it printed,
what record.py kept, and the files the case names, into one directory: stdout.txt,
plots.npz, texts.json and files/ (a .caffemodel kept as .npz of its blobs).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
BVLC_PYTHON = "/opt/caffe/python"


def command(which: str) -> tuple[list[str], dict[str, str]]:
    """The interpreter command and environment running a script under ``which`` pycaffe:
    'bvlc' (/opt/caffe's build) or 'caffe-py' (this repository's, as ``python -m``)."""
    # one compute thread each: reproducible sums, and no spinning peer thread on a shared
    # 2-core machine (a busy neighbour makes torch's intra-op threads several times slower)
    env = dict(os.environ, PYTHONHASHSEED="0", PYTHONUNBUFFERED="1", MPLBACKEND="Agg",
               GLOG_minloglevel="2", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if which == "bvlc":
        env["PYTHONPATH"] = BVLC_PYTHON
        return [sys.executable], env
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return [sys.executable, "-m", "caffe_py.pycaffe"], env


def stored_name(name: str) -> str:
    path = Path(name)
    return path.name + ".npz" if path.suffix == ".caffemodel" else path.name


def run_case(case: dict, work: Path, out: Path, which: str, timeout: float = 1800) -> float:
    """Run ``case`` in the workspace ``work`` under ``which`` pycaffe; its results in
    ``out``. Returns the seconds it took; a failing script is an AssertionError with its
    stderr's end."""
    if out.exists():
        shutil.rmtree(out)
    (out / "files").mkdir(parents=True)
    prefix, env = command(which)
    script = work / case["script"]
    cmd = prefix + [str(HERE / "record.py"), str(out), str(script), *case["args"]]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=work / case["cwd"], env=env, capture_output=True,
                          text=True, timeout=timeout)
    seconds = time.perf_counter() - start
    (out / "stdout.txt").write_text(done.stdout)
    (out / "stderr.txt").write_text(done.stderr)
    if done.returncode != 0:
        raise AssertionError(f"{case['script']} under {which} exited {done.returncode}:\n"
                             f"{done.stderr[-3000:]}")
    for name in case["files"]:
        source = work / name
        target = out / "files" / stored_name(name)
        if not source.exists():
            continue
        if source.suffix == ".caffemodel":
            sys.path.insert(0, str(HERE))
            from compare import arrays_of

            np.savez_compressed(target, **arrays_of(source))
        else:
            shutil.copyfile(source, target)
    return seconds
