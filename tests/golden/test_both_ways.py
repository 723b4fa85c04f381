"""Files both ways with the genuine Caffe 1.0 (fixtures by make_both_ways.py): weights and
solver states in Caffe's binary and HDF5 formats, written by Caffe and loaded here, written here
and loaded by Caffe; `caffe train --snapshot` resuming caffe-py's states and caffe-py resuming
Caffe's give the losses Caffe's own runs printed."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from both_ways_case import FIXTURE, HERE, MAX_ITER, SNAPSHOT

from caffe_py.solver import snapshot as snap
from caffe_py.solver.solver import Solver
from caffe_py.spec.solver_spec import load_solver

pytest.importorskip("h5py")
EXT = {"bin": (".caffemodel", ".solverstate"), "h5": (".caffemodel.h5", ".solverstate.h5")}


@pytest.fixture(scope="module")
def caffe():
    with np.load(FIXTURE) as f:
        return dict(f)


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A copy of the fixture directory, as the current directory (snapshots land there)."""
    copy = tmp_path / "both_ways"
    shutil.copytree(HERE, copy)
    monkeypatch.chdir(copy)
    return copy


def train(work, tag: str, *, weights: str | None = None, resume: str | None = None,
          prefix: str = "here", max_iter: int = MAX_ITER) -> tuple[Solver, dict[int, float]]:
    """A caffe-py run of the tiny solver; the loss of every iteration it ran."""
    param = load_solver(work / f"solver_cpy_{tag}.yaml")
    param.snapshot_prefix, param.max_iter = str(work / prefix), max_iter
    losses: dict[int, float] = {}
    with Solver(param) as solver:
        record = solver.record_loss

        def keep(loss):
            losses[solver.iter] = float(loss)
            record(loss)

        solver.record_loss = keep
        if weights:
            solver.load_weights([str(work / weights)])
        solver.solve(str(work / resume) if resume else None)
    return solver, losses


def assert_losses(ours: dict[int, float], theirs: np.ndarray) -> None:
    """Every loss Caffe printed, at its iteration, to every printed digit (Caffe prints 6
    significant digits, as %g)."""
    assert sorted(ours) == theirs[:, 0].astype(int).tolist()
    assert [f"{ours[int(i)]:g}" for i in theirs[:, 0]] == [f"{v:g}" for v in theirs[:, 1]]


def test_caffes_initial_weights_load(caffe, work):
    layers = snap.load_weights(work / "init.caffemodel")
    for key, value in caffe.items():
        if key.startswith("init/"):
            _, name, i = key.split("/")
            assert torch.equal(layers[name][int(i)], torch.from_numpy(value)), key


@pytest.mark.parametrize("tag", ["bin", "h5"])
def test_straight_run_prints_caffes_losses(caffe, work, tag):
    _, losses = train(work, tag, weights="init.caffemodel")
    assert_losses(losses, caffe[f"caffe/straight_{tag}"])


@pytest.mark.parametrize("tag", ["bin", "h5"])
def test_caffe_py_resumes_caffes_state_as_caffe_does(caffe, work, tag):
    state = f"caffe_{tag}_iter_{SNAPSHOT}{EXT[tag][1]}"
    _, losses = train(work, tag, resume=state)
    assert_losses(losses, caffe[f"caffe/resume_caffe_{tag}"])


@pytest.mark.parametrize("tag", ["bin", "h5"])
def test_caffe_resumed_caffe_py_s_state_as_caffe_py_does(caffe, work, tag):
    state = f"cpy_{tag}_iter_{SNAPSHOT}{EXT[tag][1]}"
    _, losses = train(work, tag, resume=state)
    assert_losses(losses, caffe[f"caffe/resume_cpy_{tag}"])
    # ... and both continue exactly where Caffe's own run went on
    np.testing.assert_array_equal(caffe[f"caffe/resume_cpy_{tag}"],
                                  caffe[f"caffe/straight_{tag}"][SNAPSHOT:])


@pytest.mark.parametrize("tag", ["bin", "h5"])
def test_the_files_caffe_loaded_are_what_caffe_py_writes(caffe, work, tag):
    """pycaffe loaded the committed caffe-py weights as caffe-py reads them; a caffe-py run
    today writes the same weights and history into the same formats."""
    weights_ext, state_ext = EXT[tag]
    committed = snap.load_weights(work / f"cpy_{tag}_iter_{SNAPSHOT}{weights_ext}")
    for key, value in caffe.items():
        if key.startswith(f"pycaffe_loaded_cpy_{tag}/"):
            _, name, i = key.split("/")
            assert torch.equal(committed[name][int(i)], torch.from_numpy(value)), key
    train(work, tag, weights="init.caffemodel", prefix="now", max_iter=SNAPSHOT)
    now = snap.load_weights(work / f"now_iter_{SNAPSHOT}{weights_ext}")
    assert now.keys() == committed.keys()
    for name in now:
        for a, b in zip(now[name], committed[name], strict=True):
            assert torch.equal(a, b), name
    ours = snap.load_state(work / f"now_iter_{SNAPSHOT}{state_ext}")
    then = snap.load_state(work / f"cpy_{tag}_iter_{SNAPSHOT}{state_ext}")
    theirs = snap.load_state(work / f"caffe_{tag}_iter_{SNAPSHOT}{state_ext}")
    assert (ours["iter"], ours["current_step"]) == (then["iter"], then["current_step"]) == (
        theirs["iter"], theirs["current_step"]) == (SNAPSHOT, 1)
    for a, b, c in zip(ours["history"], then["history"], theirs["history"], strict=True):
        assert torch.equal(a, b)
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-7)  # Caffe's own history
