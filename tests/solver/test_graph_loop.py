"""The whole-iteration CUDA-graph loop's host logic, on the CPU: ``emulate=True`` runs the
recorded iterations at each replay instead of a captured graph, so chunking, batch slots,
per-iteration rates, the loss ring and Caffe's bookkeeping are checked against the eager loop
here; the capture itself is checked on a GPU (tests/solver/test_solver_gpu.py)."""
from __future__ import annotations

import logging

import pytest
import torch

from caffe_py.errors import SolverError
from caffe_py.solver.graph_loop import GraphedLoop
from caffe_py.solver.graphs import capture_blocker
from caffe_py.solver.solver import Solver


def weights(solver):
    return [lp.param.detach().clone() for lp in solver.net.learnable_params()]


def trained(param, loop=None, resume=None):
    with Solver(param) as solver:
        solver.runner = loop
        solver.solve(resume)
        return solver, weights(solver)


def close(a, b, tol=1e-5):
    return all(torch.allclose(x, y, rtol=tol, atol=1e-7) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("rule", [
    {"type": "SGD", "lr_policy": "inv", "gamma": 0.1, "power": 0.75, "weight_decay": 0.01},
    {"type": "SGD", "lr_policy": "multistep", "gamma": 0.5, "stepvalue": "[3, 7]"},
    {"type": "Adam", "momentum2": 0.99, "lr_policy": "fixed", "base_lr": 0.01},
    {"type": "Nesterov", "iter_size": 2, "clip_gradients": 0.5},
])
def test_chunks_train_as_the_eager_loop_with_an_lmdb(ws, rule):
    ws.net(ws.LMDB_NET, batch=2)
    common = {"max_iter": 12, "display": 4, "test_iter": 2, "test_interval": 8, **rule}
    eager, want = trained(ws.load(**common))
    loop = GraphedLoop(chunk=4, emulate=True)
    graphed, got = trained(ws.load(**common, snapshot_prefix="g/t"), loop)
    assert loop.fallback is None and loop.chunk == 4 and sorted(loop.graphs) == [1, 4]
    assert graphed.iter == eager.iter == 12
    assert graphed.current_step == eager.current_step
    assert close(got, want)
    assert graphed.last_test[0]["acc"].item() == pytest.approx(eager.last_test[0]["acc"].item())


def test_a_graph_keeps_its_first_outputs_values_not_their_autograd_graph(ws):
    """Held with its autograd graph, the first iteration's loss kept that iteration's
    AccumulateGrad nodes, and the capture stream they were made on, alive into the next
    capture: PyTorch then warned of a stream mismatch at every chunked run's second capture."""
    ws.net(ws.LMDB_NET, batch=2)
    loop = GraphedLoop(chunk=4, emulate=True)
    trained(ws.load(max_iter=12, display=4), loop)
    assert sorted(loop.graphs) == [1, 4]
    for graph in loop.graphs.values():
        out = graph.first_out[0][0]
        assert out.loss.grad_fn is None and not out.loss.requires_grad
        assert out.outputs and all(v.grad_fn is None for v in out.outputs.values())


def test_the_chunk_divides_display_test_and_snapshot(ws):
    loop = GraphedLoop(emulate=True)
    loop.slots = 32
    loop._replay_ms = [0.01]   # a tiny step: 32 would fit in the target
    with Solver(ws.load(display=20, snapshot=30, max_iter=10)) as solver:
        assert loop._chunk_length(solver) == 10
    loop._replay_ms = [1.0]
    with Solver(ws.load(display=100, max_iter=10)) as solver:
        assert loop._chunk_length(solver) == 4
    loop.slots = 3   # the slots' memory allows 3
    with Solver(ws.load(display=100, max_iter=10)) as solver:
        assert loop._chunk_length(solver) == 2


def test_lines_snapshots_and_resume_follow_the_eager_loop(ws, caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")
    common = {"max_iter": 12, "display": 4, "snapshot": 8, "lr_policy": "step", "gamma": 0.5,
              "stepsize": 5}
    trained(ws.load(**common, snapshot_prefix="e/t"))
    eager_lines = [m for m in caplog.messages if m.startswith(("Iteration", "Snapshot"))]
    caplog.clear()
    trained(ws.load(**common, snapshot_prefix="e/t"), GraphedLoop(chunk=4, emulate=True))
    lines = [m for m in caplog.messages if m.startswith(("Iteration", "Snapshot"))]
    strip = [m.split(" (")[0] if "iter/s" in m else m.split(", loss")[0] for m in lines]
    assert strip == [m.split(" (")[0] if "iter/s" in m else m.split(", loss")[0]
                     for m in eager_lines]
    # resume from iteration 8 (aligned) and from a state at iteration 5 (single steps first)
    state = ws.root / "e" / "t_iter_8.solverstate.pt"
    straight, want = trained(ws.load(**common, snapshot_prefix="s/t"))
    resumed, got = trained(ws.load(**common, snapshot_prefix="r/t"),
                           GraphedLoop(chunk=4, emulate=True), resume=str(state))
    assert resumed.iter == 12 and close(got, want)


def test_a_misaligned_start_runs_single_iterations_until_aligned(ws):
    loop = GraphedLoop(chunk=4, emulate=True)
    runs = []
    real = loop._replay
    loop._replay = lambda s, length: (runs.append((s.iter, length)), real(s, length))
    with Solver(ws.load(max_iter=11, display=0)) as solver:
        solver.runner = loop
        solver.iter = 1
        solver.solve()
    assert runs == [(3, 1), (4, 4), (8, 1), (9, 1), (10, 1)]  # 1, 2 warm up eagerly


def test_a_non_finite_loss_stops_within_a_few_iterations_without_display(ws):
    text = (ws.root / "net.yaml").read_text().replace("{type: gaussian}",
                                                      "{type: constant, value: .inf}")
    ws.net(text)
    with Solver(ws.load(max_iter=1000, display=0, snapshot=0)) as solver:
        solver.runner = GraphedLoop(chunk=4, emulate=True)
        with pytest.raises(SolverError, match="^iteration 0: the loss is not finite"):
            solver.solve()
        assert solver.iter <= 2 * 16 + 4


def test_callbacks_keep_the_eager_loop_and_say_why(ws, caplog):
    caplog.set_level(logging.INFO, logger="caffe_py")

    class Nothing:
        def on_start(self, solver):
            pass

        def on_gradient_ready(self, solver):
            pass

    with Solver(ws.load(max_iter=4), callbacks=[Nothing()]) as solver:
        loop = GraphedLoop(emulate=True)
        solver.runner = loop
        solver.solve()
        assert loop.fallback == "callbacks run between the forward and the update"
    assert ("CUDA graphs off (cpu): callbacks run between the forward and the update; running "
            "eagerly") in caplog.messages
    with Solver(ws.load(max_iter=4)) as solver:
        assert capture_blocker(solver, whole_iteration=True) == "the net runs on cpu, not CUDA"


def test_without_a_given_chunk_three_timed_single_replays_size_it(ws):
    ws.net(ws.LMDB_NET, batch=2)
    common = {"max_iter": 40, "display": 10, "lr_policy": "fixed"}
    _, want = trained(ws.load(**common))
    loop = GraphedLoop(emulate=True)
    runs = []
    real = loop._replay
    loop._replay = lambda s, length: (runs.append((s.iter, length)), real(s, length))
    _, got = trained(ws.load(**common, snapshot_prefix="g/t"), loop)
    assert loop.chunk == 10 and sorted(loop.graphs) == [1, 10]   # 32 slots; 10 divides display
    assert runs[:6] == [(2, 1), (3, 1), (4, 1), (5, 1), (6, 1), (7, 1)]
    assert (10, 10) in runs and (20, 10) in runs
    assert close(got, want)


class _Compiler:
    """A stand-in for torch.compile: the net itself, counting calls (or failing)."""

    def __init__(self, error: Exception | None = None):
        self.error, self.calls, self.compiled = error, 0, 0

    def __call__(self, net):
        self.compiled += 1

        def run(*args, **kwargs):
            self.calls += 1
            if self.error is not None:
                raise self.error
            return net(*args, **kwargs)
        return run


def test_auto_compile_switches_after_the_timed_replays_of_a_long_run(ws, caplog):
    """Once the timed replays show a long run ahead, the net is compiled, the graphs are
    dropped, and the compiled step warms up and is captured again; training goes on to the
    same weights (the stand-in compiler computes what the net does)."""
    from caffe_py.solver.roles import AutoCompile, CompiledStep

    caplog.set_level(logging.INFO, logger="caffe_py")
    ws.net(ws.LMDB_NET, batch=2)
    common = {"max_iter": 40, "display": 10, "lr_policy": "fixed"}
    _, want = trained(ws.load(**common))
    compiler = _Compiler()
    loop = GraphedLoop(emulate=True, auto_compile=AutoCompile(min_seconds=-1.0,
                                                              compiler=compiler))
    runs = []
    real = loop._replay
    loop._replay = lambda s, length: (runs.append((s.iter, length)), real(s, length))
    solver, got = trained(ws.load(**common, snapshot_prefix="g/t"), loop)
    assert isinstance(solver.step_fn, CompiledStep) and solver.step_fn.failed is None
    assert compiler.compiled == 1 and compiler.calls >= 2 + 1 + 3 + 1
    assert loop.auto_compile is None and loop.chunk == 10 and sorted(loop.graphs) == [1, 10]
    # warm-up 0-1, timed 2-4, then warm-up 5-6 (compiled, eager), timed 7-9, chunks from 10
    assert runs[:6] == [(2, 1), (3, 1), (4, 1), (7, 1), (8, 1), (9, 1)]
    assert (10, 10) in runs and (30, 10) in runs
    assert solver.iter == 40 and close(got, want)
    assert ("Compiling the net with torch.compile: 35 iterations left at 0.0 ms make about 0 "
            "min (--compile off skips this)") in caplog.messages


def test_auto_compile_leaves_a_short_run_alone(ws, caplog):
    from caffe_py.solver.roles import AutoCompile

    caplog.set_level(logging.INFO, logger="caffe_py")
    compiler = _Compiler()
    policy = AutoCompile(compiler=compiler)
    assert policy.worth(30_000, 62.0) and not policy.worth(10_000, 0.4)
    loop = GraphedLoop(emulate=True, auto_compile=policy)
    solver, _ = trained(ws.load(max_iter=12), loop)
    assert compiler.compiled == 0 and loop.auto_compile is None
    assert not any(m.startswith("Compiling") for m in caplog.messages)
    assert solver.iter == 12


def test_a_failing_automatic_compile_trains_the_plain_net(ws, caplog):
    """The compiler's failure is one line; the step runs the plain net from then on and the
    run ends where it should, its loss finite. With --compile on the failure is the run's."""
    from caffe_py.solver.roles import AutoCompile, CompiledStep

    caplog.set_level(logging.INFO, logger="caffe_py")
    ws.net(ws.LMDB_NET, batch=2)
    compiler = _Compiler(RuntimeError("inductor: no C++ compiler\nmore detail"))
    loop = GraphedLoop(emulate=True, auto_compile=AutoCompile(min_seconds=-1.0,
                                                              compiler=compiler))
    solver, got = trained(ws.load(max_iter=20, display=10, lr_policy="fixed"), loop)
    assert compiler.calls == 1 and solver.step_fn.failed == (
        "RuntimeError: inductor: no C++ compiler")
    assert solver.iter == 20 and all(torch.isfinite(w).all() for w in got)
    assert ("torch.compile failed (RuntimeError: inductor: no C++ compiler); training the "
            "plain net (one batch skipped); --compile off skips the attempt") in caplog.messages
    with Solver(ws.load(max_iter=2)) as solver:
        solver.step_fn = CompiledStep(solver.net, compiler=_Compiler(RuntimeError("boom")))
        with pytest.raises(RuntimeError, match="^boom$"):
            solver.solve()


def test_the_final_forward_reads_the_next_real_batch_as_the_eager_loop(ws, caplog):
    """Between step calls the Data layers read their real feeds again: solve's last line (a
    forward of the next batch) and a user's forward see what the eager loop's see."""
    caplog.set_level(logging.INFO, logger="caffe_py")
    ws.net(ws.LMDB_NET, batch=2)
    common = {"max_iter": 12, "display": 4, "lr_policy": "fixed"}
    trained(ws.load(**common))
    eager = [m for m in caplog.messages if m.startswith("Iteration 12, loss = ")]
    caplog.clear()
    trained(ws.load(**common, snapshot_prefix="g/t"), GraphedLoop(chunk=4, emulate=True))
    assert [m for m in caplog.messages if m.startswith("Iteration 12, loss = ")] == eager
    assert len(eager) == 1
