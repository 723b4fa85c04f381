"""The training loop: Caffe's Step order, display and test lines, snapshots, exact resume."""
from __future__ import annotations

import logging
import math

import pytest
import torch

from caffe_py.errors import SolverError
from caffe_py.options import TrainOptions
from caffe_py.solver.roles import Role
from caffe_py.solver.snapshot import load_state, load_weights
from caffe_py.solver.solver import Solver
from caffe_py.train import train


@pytest.fixture
def run(caplog):
    """``run(param, resume=None, **solver_kw)``: a solve; (the Solver, its log lines)."""
    caplog.set_level(logging.INFO, logger="caffe_py")

    def solve(param, resume=None, **kw):
        caplog.clear()
        with Solver(param, **kw) as solver:
            solver.solve(resume)
        return solver, [r.getMessage() for r in caplog.records]

    return solve


def weights_of(solver):
    return {k: [b.clone() for b in v] for k, v in solver.net.layer_blobs().items()}


def assert_bitwise(a, b):
    assert a.keys() == b.keys()
    for name in a:
        for x, y in zip(a[name], b[name], strict=True):
            assert torch.equal(x, y), name


def test_display_test_and_snapshot_lines_follow_caffe(ws, run):
    p = ws.load(test_iter=2, test_interval=3, display=3, snapshot=3, max_iter=6,
                lr_policy="step", gamma=0.5, stepsize=3)
    solver, lines = run(p)
    prefix = str(ws.root / "snaps" / "tiny")
    assert lines[:4] == ["Solving tiny", "Learning Rate Policy: step",
                         "Iteration 0, Testing net (#0)", lines[3]]
    assert lines[3].startswith("    Test net output #0: loss = ")
    assert lines[4].startswith("Iteration 0 (") and ", loss = " in lines[4]
    assert lines[5].startswith("    Train net output #0: loss = ") and "(* 1 = " in lines[5]
    assert lines[6] == "Iteration 0, lr = 0.1"
    assert lines[7:9] == [f"Snapshotting to {prefix}_iter_3.pt",
                          f"Snapshotting solver state to {prefix}_iter_3.solverstate.pt"]
    assert "Iteration 3, lr = 0.05" in lines
    assert lines[-4].startswith("Iteration 6, loss = ")
    assert lines[-3:-1] == ["Iteration 6, Testing net (#0)", lines[-2]]
    assert lines[-1] == "Optimization Done."
    assert lines[-6:-4] == [f"Snapshotting to {prefix}_iter_6.pt",
                            f"Snapshotting solver state to {prefix}_iter_6.solverstate.pt"]
    assert solver.iter == 6 and solver.current_step == 1  # rate of it 5: 5 // 3
    state = load_state(f"{prefix}_iter_6.solverstate.pt")
    assert (state["iter"], state["current_step"], state["learned_net"]) == (
        6, 1, "tiny_iter_6.pt")


def test_test_outputs_are_the_mean_over_test_iter(ws, run):
    # Zero weights (no filler) give uniform softmax: the loss is log(3) on every batch.
    ws.net(DUMMY_ZERO := (ws.root / "net.yaml").read_text().replace(
        ", weight_filler: {type: xavier}", ""))
    assert "xavier" not in DUMMY_ZERO
    p = ws.load(test_iter=3, test_interval=10, max_iter=0, snapshot_after_train=False)
    solver, lines = run(p)
    assert f"    Test net output #0: loss = {math.log(3):g} (* 1 = {math.log(3):g} loss)" in lines
    assert solver.last_test[0]["loss"].item() == pytest.approx(math.log(3))


@pytest.mark.parametrize("rule", [
    {"type": "SGD", "lr_policy": "multistep", "gamma": 0.5, "stepvalue": "[2, 4]"},
    {"type": "Adam", "momentum2": 0.99, "lr_policy": "fixed"},
    {"type": "Nesterov", "snapshot_format": "caffemodel"},
    {"type": "AdaDelta", "momentum": 0.9, "snapshot_format": "HDF5"},
])
def test_resume_is_bitwise_identical_with_dummy_data(ws, rule, run):
    straight, _ = run(ws.load(max_iter=6, test_iter=1, test_interval=2, **rule))
    first, _ = run(ws.load(max_iter=3, test_iter=1, test_interval=2, snapshot_prefix="b/t",
                           **rule))
    ext = {"caffemodel": ".solverstate", "HDF5": ".solverstate.h5"}.get(
        rule.get("snapshot_format"), ".solverstate.pt")
    state = ws.root / "b" / f"t_iter_3{ext}"
    resumed, lines = run(ws.load(max_iter=6, test_iter=1, test_interval=2, snapshot_prefix="c/t",
                                 **rule), resume=str(state))
    assert lines[2] == f"Restoring previous solver status from {state}"
    assert resumed.iter == 6 and resumed.current_step == straight.current_step
    assert_bitwise(weights_of(straight), weights_of(resumed))
    for h1, h2 in zip(straight.updater.history, resumed.updater.history, strict=True):
        assert torch.equal(h1, h2)
    assert not torch.equal(weights_of(first)["ip"][0], weights_of(straight)["ip"][0])


def test_resume_is_bitwise_identical_with_an_lmdb(ws, run):
    ws.net(ws.LMDB_NET, batch=2)
    common = {"max_iter": 8, "test_iter": 2, "test_interval": 3, "lr_policy": "fixed"}
    straight, _ = run(ws.load(**common))
    run(ws.load(**{**common, "max_iter": 4}, snapshot_prefix="b/t"))
    resumed, _ = run(ws.load(**common, snapshot_prefix="c/t"),
                     resume=str(ws.root / "b" / "t_iter_4.solverstate.pt"))
    assert_bitwise(weights_of(straight), weights_of(resumed))
    assert straight.last_test[0]["acc"].item() == resumed.last_test[0]["acc"].item()


def test_hdf5_snapshots_resume_an_lmdb_run_exactly(ws, run):
    pytest.importorskip("h5py")
    ws.net(ws.LMDB_NET, batch=2)
    common = {"max_iter": 7, "lr_policy": "fixed", "snapshot_format": "HDF5"}
    straight, _ = run(ws.load(**common))
    run(ws.load(**{**common, "max_iter": 3}, snapshot_prefix="b/t"))
    state = ws.root / "b" / "t_iter_3.solverstate.h5"
    assert (ws.root / "b" / "t_iter_3.caffemodel.h5").is_file()
    resumed, _ = run(ws.load(**common, snapshot_prefix="c/t"), resume=str(state))
    assert_bitwise(weights_of(straight), weights_of(resumed))


def test_solver_weights_field_and_test_compute_loss(ws, run):
    first, _ = run(ws.load(max_iter=2, snapshot_format="caffemodel", snapshot_prefix="w/t"))
    solver, lines = run(ws.load(max_iter=0, weights="w/t_iter_2.caffemodel", test_iter=2,
                                test_interval=1, test_compute_loss=True, debug_info=True,
                                snapshot_after_train=False))
    assert_bitwise(weights_of(first), weights_of(solver))
    assert f"Finetuning from {ws.root / 'w' / 't_iter_2.caffemodel'}" in lines
    assert "Note: debug_info: Caffe's per-blob debug lines are not printed; it changes " \
           "nothing here" in lines
    loss = solver.last_test[0]["__loss__"].item()
    assert f"Test loss: {loss:g}" in lines


def test_iter_size_k_with_batch_b_equals_batch_k_times_b(ws, run):
    ws.net(ws.LMDB_NET, batch=2)
    small, _ = run(ws.load(max_iter=3, iter_size=2, weight_decay=0.01))
    ws.net(ws.LMDB_NET, batch=4)
    big, _ = run(ws.load(max_iter=3, weight_decay=0.01))
    for a, b in zip(weights_of(small)["ip"], weights_of(big)["ip"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_lr_mult_zero_blob_stays_fixed_in_a_net(ws, run):
    text = (ws.root / "net.yaml").read_text().replace(
        "{lr_mult: 2, decay_mult: 0}", "{lr_mult: 0}").replace(
        "weight_filler: {type: xavier}", "weight_filler: {type: xavier}, "
        "bias_filler: {type: constant, value: 0.5}")
    ws.net(text)
    solver, _ = run(ws.load(max_iter=4, weight_decay=0.1))
    assert torch.equal(solver.net.layer_blobs()["ip"][1], torch.full((3,), 0.5))


class Recorder:
    def __init__(self, calls):
        self.calls = calls

    def on_start(self, solver):
        self.calls.append(("start", solver.iter))

    def on_gradient_ready(self, solver):
        grad = solver.updater.params[0].grad
        self.calls.append(("grad", solver.iter, grad is not None and bool(grad.abs().sum() > 0)))


def test_callbacks_run_around_backward_and_applies_updates_false_keeps_weights(ws):
    calls: list = []
    p = ws.load(max_iter=2, snapshot_after_train=False)
    with Solver(p, callbacks=[Recorder(calls)], role=Role(applies_updates=False)) as solver:
        before = weights_of(solver)
        solver.step(2)
        assert calls == [("start", 0), ("grad", 0, True), ("start", 1), ("grad", 1, True)]
        assert_bitwise(before, weights_of(solver))
        assert solver.iter == 2


def test_non_finite_loss_stops_naming_the_iteration_and_writes_no_snapshot(ws, run):
    text = (ws.root / "net.yaml").read_text().replace("{type: gaussian}",
                                                      "{type: constant, value: .inf}")
    ws.net(text)
    p = ws.load(max_iter=4, snapshot=2)
    with pytest.raises(SolverError) as err:
        run(p)
    assert str(err.value).startswith("iteration 0: the loss is not finite (NaN or inf); "
                                     "training stopped and no snapshot was written")
    assert not list(ws.root.glob("snaps/*.pt"))  # no snapshot (the metrics table is there)


def test_bf16_precision_runs_layers_in_bfloat16_and_keeps_float32_weights(ws, run):
    solver, _ = run(ws.load(max_iter=2, precision="BF16", snapshot_after_train=False))
    assert solver.param.precision == "BF16"
    assert all(w.dtype == torch.float32 for w in solver.updater.params)
    assert all(torch.isfinite(w).all() for w in solver.updater.params)
    # Under autocast the InnerProduct computes in bfloat16, so the same first iteration (same
    # seed, data and weights) gives a slightly different loss than in float32.
    dtypes: dict[str, list[torch.dtype]] = {}
    losses = {}
    for precision in ("FLOAT32", "BF16"):
        seen = dtypes.setdefault(precision, [])
        with Solver(ws.load(precision=precision)) as solver:
            solver.net.layer_by_name("ip").register_forward_hook(
                lambda _layer, _bottoms, top, seen=seen: seen.append(top.dtype))
            solver.step(1)
            losses[precision] = solver.smoothed_loss()
    assert dtypes == {"FLOAT32": [torch.float32], "BF16": [torch.bfloat16]}
    assert losses["BF16"] != losses["FLOAT32"]
    assert losses["BF16"] == pytest.approx(losses["FLOAT32"], abs=0.05)


def test_finetune_copies_weights_by_layer_name(ws, run):
    first, _ = run(ws.load(max_iter=2))
    weights = ws.root / "snaps" / "tiny_iter_2.pt"
    with Solver(ws.load(max_iter=2)) as solver:
        solver.load_weights([str(weights)])
        assert_bitwise({"ip": load_weights(weights)["ip"]}, {"ip": solver.net.layer_blobs()["ip"]})


def test_train_rejects_unwritable_snapshot_dir_before_training(ws):
    (ws.root / "afile").write_text("x")
    p = ws.load(snapshot_prefix="afile/sub/tiny")
    with pytest.raises(SolverError) as err:
        train(p, [torch.device("cpu")], TrainOptions())
    assert str(err.value).startswith(f"cannot write snapshots to '{ws.root / 'afile' / 'sub'}' "
                                     f"(snapshot_prefix {ws.root / 'afile' / 'sub' / 'tiny'}):")
    assert str(err.value).endswith("make the directory writable or change snapshot_prefix")


def test_train_rejects_weights_with_snapshot_and_swapped_files(ws):
    p = ws.load()
    cpu = [torch.device("cpu")]
    with pytest.raises(SolverError, match="--weights and --snapshot are exclusive"):
        train(p, cpu, TrainOptions(weights=["a.pt"], snapshot="a.solverstate.pt"))
    with pytest.raises(SolverError, match=r"^x\.solverstate\.pt is a solver state, not weights"):
        train(p, cpu, TrainOptions(weights=["x.solverstate.pt"]))
    with pytest.raises(SolverError, match=r"^x\.pt is not a solver state"):
        train(p, cpu, TrainOptions(snapshot="x.pt"))


def test_input_layer_in_a_train_net_is_an_error(ws):
    ws.net("name: n\nlayer:\n  - {name: in, type: Input, top: x, "
           "input_param: {shape: {dim: [2, 3]}}}\n")
    with pytest.raises(SolverError, match="the TRAIN net 'n' has Input layer 'in'"):
        Solver(ws.load())


def test_smoothed_loss_is_the_mean_of_the_last_average_loss_iterations(ws):
    with Solver(ws.load(average_loss=3)) as solver:
        for i, loss in enumerate([1.0, 2.0, 3.0, 4.0]):
            solver.iter = i
            solver.record_loss(torch.tensor(loss))
            if i == 1:
                assert solver.smoothed_loss() == 1.5  # fewer than 3 so far: their mean
        assert solver.smoothed_loss() == 3.0
        solver.iter = 7
        solver.record_loss(torch.tensor(float("nan")))
        solver.iter = 8
        solver.record_loss(torch.tensor(float("inf")))
        with pytest.raises(SolverError, match="^iteration 7: the loss is not finite"):
            solver.check_finite()


def test_progress_advances_once_per_iteration_from_the_resumed_iteration(ws, run):
    import contextlib

    calls: list = []

    class Bar:
        def update(self, n):
            calls.append(n)

    @contextlib.contextmanager
    def factory(total, initial):
        calls.append(("open", total, initial))
        yield Bar()
        calls.append("closed")

    run(ws.load(max_iter=2))
    with Solver(ws.load(max_iter=5)) as solver:
        solver.solve(str(ws.root / "snaps" / "tiny_iter_2.solverstate.pt"), progress=factory)
    assert calls == [("open", 5, 2), 1, 1, 1, "closed"]


def test_a_worker_role_neither_updates_nor_tests_nor_reports(ws, run):
    from caffe_py.solver.roles import WORKER

    p = ws.load(max_iter=2, test_iter=1, test_interval=1, display=1, snapshot=1)
    with Solver(p, role=WORKER) as solver:
        before = weights_of(solver)
        solver.step(2)
        assert solver.test_nets == [] and not solver.display_due()
        assert_bitwise(before, weights_of(solver))
    assert not list(ws.root.glob("snaps/*.pt"))  # no snapshot (the metrics table is there)
