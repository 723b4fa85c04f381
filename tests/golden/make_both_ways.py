"""Writes the both-ways fixtures: a tiny training run (both_ways_case.py) whose weights and
solver states, in Caffe's binary and HDF5 formats, are written by the genuine Caffe 1.0 and
loaded by caffe-py, and written by caffe-py and loaded by Caffe (pycaffe, `caffe train
--snapshot`), with the losses each program printed.

Run from the repository root, with Caffe built into /opt/caffe (../shared/caffe):

    GLOG_minloglevel=0 PYTHONPATH=/opt/caffe/python:$PWD python tests/golden/make_both_ways.py

It writes, under tests/golden/both_ways: the records LMDB, net.prototxt / net.yaml and the
solvers; init.caffemodel (pycaffe's initial weights); Caffe's and caffe-py's iteration-5
snapshots in both formats; and caffe.npz: the initial weights, every loss `caffe train`
printed (straight runs, and runs resumed from either program's snapshots), and the weights
pycaffe loaded from caffe-py's files. CI never runs it; test_both_ways.py reads the files.
"""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from both_ways_case import BATCH, FIXTURE, HERE, MAX_ITER, NET, RECORDS, SHAPE, solver  # noqa: E402
from make_data_golden import prototxt  # noqa: E402

CAFFE = Path(os.environ.get("CAFFE_ROOT", "/opt/caffe")) / "bin" / "caffe"
FORMATS = {"bin": ("BINARYPROTO", ".caffemodel", ".solverstate"),
           "h5": ("HDF5", ".caffemodel.h5", ".solverstate.h5")}
LOSS_LINE = re.compile(r"Iteration (\d+)(?: \([^)]*\))?, loss = (\S+)")


def write_inputs() -> None:
    import yaml

    from caffe_py.io.db.lmdb_store import LmdbWriter
    from caffe_py.io.formats.datum import datum_from_array, encode_datum

    rng = np.random.default_rng(3)
    with LmdbWriter(HERE / "records_lmdb") as db:
        for i in range(RECORDS):
            pixels = rng.integers(0, 256, SHAPE, dtype=np.uint8)
            db.put(b"%08d" % i, encode_datum(datum_from_array(pixels, i % 3)))
    (HERE / "net.prototxt").write_text(prototxt(NET))
    (HERE / "net.yaml").write_text(yaml.safe_dump(NET, sort_keys=False))
    for tag, (fmt, _, _) in FORMATS.items():
        for who in ("caffe", "cpy"):
            spec = solver(f"{who}_{tag}", fmt)
            (HERE / f"solver_{who}_{tag}.prototxt").write_text(prototxt(spec))
            (HERE / f"solver_{who}_{tag}.yaml").write_text(yaml.safe_dump(
                {**spec, "net": "net.yaml"}, sort_keys=False))


def initial_weights() -> dict[str, np.ndarray]:
    import caffe

    caffe.set_mode_cpu()
    caffe.set_random_seed(1)
    net = caffe.Net("net.prototxt", caffe.TRAIN)
    net.save("init.caffemodel")
    return {f"init/{name}/{i}": b.data.copy() for name, blobs in net.params.items()
            for i, b in enumerate(blobs)}


def caffe_train(solver_file: str, *flags: str) -> np.ndarray:
    """`caffe train`, and the losses it printed: (iteration, loss) rows."""
    env = {**os.environ, "GLOG_logtostderr": "1", "GLOG_minloglevel": "0"}
    out = subprocess.run([str(CAFFE), "train", f"--solver={solver_file}", *flags], env=env,
                         capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"caffe train failed:\n{out.stderr[-3000:]}")
    rows = [(int(m[1]), float(m[2])) for m in LOSS_LINE.finditer(out.stderr)]
    return np.array(rows, np.float64)


def caffe_py_train(solver_file: str) -> None:
    """caffe-py's straight run from init.caffemodel, snapshotting as the solver says."""
    from caffe_py.solver.solver import Solver
    from caffe_py.spec.solver_spec import load_solver

    logging.basicConfig(level=logging.WARNING)
    with Solver(load_solver(solver_file)) as s:
        s.load_weights(["init.caffemodel"])
        s.solve()


def loaded_by_pycaffe(weights: str) -> dict[str, np.ndarray]:
    import caffe

    net = caffe.Net("net.prototxt", caffe.TRAIN)
    if weights.endswith(".h5"):
        net.load_hdf5(weights)
    else:
        net.copy_from(weights)
    return {f"{name}/{i}": b.data.copy() for name, blobs in net.params.items()
            for i, b in enumerate(blobs)}


def drop(*names: str) -> None:
    for name in names:
        Path(name).unlink(missing_ok=True)


def both_ways(tag: str) -> dict[str, np.ndarray]:
    """One format's runs: Caffe straight and resumed from its own iteration-5 state, caffe-py
    straight (its state), Caffe resumed from caffe-py's state, and what pycaffe loads from
    caffe-py's weights."""
    weights_ext, state_ext = FORMATS[tag][1:]
    arrays = {}

    def drop_final(who: str) -> None:
        drop(f"{who}_{tag}_iter_{MAX_ITER}{weights_ext}", f"{who}_{tag}_iter_{MAX_ITER}{state_ext}")

    arrays[f"caffe/straight_{tag}"] = caffe_train(f"solver_caffe_{tag}.prototxt",
                                                  "--weights=init.caffemodel")
    drop_final("caffe")
    arrays[f"caffe/resume_caffe_{tag}"] = caffe_train(
        f"solver_caffe_{tag}.prototxt", f"--snapshot=caffe_{tag}_iter_5{state_ext}")
    drop_final("caffe")
    caffe_py_train(f"solver_cpy_{tag}.yaml")
    drop_final("cpy")
    arrays[f"caffe/resume_cpy_{tag}"] = caffe_train(
        f"solver_cpy_{tag}.prototxt", f"--snapshot=cpy_{tag}_iter_5{state_ext}")
    drop_final("cpy")
    for name, value in loaded_by_pycaffe(f"cpy_{tag}_iter_5{weights_ext}").items():
        arrays[f"pycaffe_loaded_cpy_{tag}/{name}"] = value
    return arrays


def main() -> None:
    HERE.mkdir(exist_ok=True)
    os.chdir(HERE)  # Caffe reads and writes relative paths from where it runs
    for old in Path(".").glob("*_iter_*"):
        old.unlink()
    if Path("records_lmdb").exists():
        for f in Path("records_lmdb").iterdir():
            f.unlink()
        Path("records_lmdb").rmdir()
    write_inputs()
    arrays = initial_weights()
    for tag in FORMATS:
        arrays.update(both_ways(tag))
        print(f"{tag}: " + ", ".join(f"{k} {len(v)} losses" for k, v in arrays.items()
                                     if k.startswith("caffe/") and k.endswith(tag)))
    np.savez_compressed(FIXTURE, **arrays)
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes); batch {BATCH}")


if __name__ == "__main__":
    main()
