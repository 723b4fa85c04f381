"""precision FLOAT16: dynamic loss scaling on the device. An overflowing iteration changes no
weight and no history and halves the scale; a window without one doubles it; the scale is in
the solver state (resume is exact); replicas keep one scale."""
from __future__ import annotations

import pytest
import torch

from caffe_py.errors import SpecError
from caffe_py.parallel import ReplicatedRun, Tuning
from caffe_py.solver.solver import Solver
from caffe_py.spec.solver_spec import load_solver

NET = """
net_param:
  name: tiny
  layer:
    - {{name: data, type: DummyData, top: [data, label],
       dummy_data_param: {{shape: [{{dim: [8, 6]}}, {{dim: [8]}}],
                          data_filler: [{{type: gaussian, std: 3}}, {{type: uniform, min: 0,
                                                                       max: 2.99}}]}}}}
    - {{name: ip1, type: InnerProduct, bottom: data, top: ip1,
       inner_product_param: {{num_output: 16, weight_filler: {{type: xavier}}}}}}
    - {{name: relu, type: ReLU, bottom: ip1, top: ip1}}
    - {{name: ip2, type: InnerProduct, bottom: ip1, top: ip2,
       inner_product_param: {{num_output: 3, weight_filler: {{type: xavier}}}}}}
    - {{name: loss, type: SoftmaxWithLoss, bottom: [ip2, label], top: loss}}
base_lr: 0.05
momentum: 0.9
weight_decay: 0.001
max_iter: {iters}
random_seed: 3
precision: {precision}
loss_scale: {scale}
loss_scale_window: {window}
snapshot_after_train: false
snapshot_prefix: {prefix}
"""


def _param(tmp_path, *, precision="FLOAT16", scale=1024.0, window=2000, iters=10,
           name="s", extra=""):
    path = tmp_path / f"{name}.yaml"
    path.write_text(NET.format(precision=precision, scale=scale, window=window, iters=iters,
                               prefix=tmp_path / name / "s") + extra)
    return load_solver(path)


def _weights(solver):
    return [lp.param.detach().clone() for lp in solver.net.learnable_params()]


def test_an_overflow_is_skipped_not_trained_on(tmp_path):
    with Solver(_param(tmp_path, scale=1e30)) as s:
        s.iteration()   # scaled by 1e30, the float16 backward overflows
        assert all(not w.any() for w in s.updater.history)
        assert s.loss_scale.scale.item() == pytest.approx(5e29)
        assert s.loss_scale.skipped.item() == 1 and s.iter == 1
        before = _weights(s)
        s.loss_scale.scale.fill_(1.0)   # now nothing overflows: the next update is applied
        s.iteration()
        assert not all(a.equal(b) for a, b in zip(_weights(s), before, strict=True))
        assert all(torch.isfinite(w).all() for w in _weights(s))
        assert s.loss_scale.skipped.item() == 1


def test_an_overflow_leaves_weights_and_history_as_they_were(tmp_path):
    with Solver(_param(tmp_path, scale=1.0)) as s:
        for _ in range(3):
            s.iteration()
        weights, history = _weights(s), [h.clone() for h in s.updater.history]
        s.loss_scale.scale.fill_(1e30)
        s.iteration()
        assert all(a.equal(b) for a, b in zip(_weights(s), weights, strict=True))
        assert all(a.equal(b) for a, b in zip(s.updater.history, history, strict=True))
        assert s.loss_scale.skipped.item() == 1


def test_the_scale_doubles_after_a_window_without_an_overflow(tmp_path):
    with Solver(_param(tmp_path, scale=8.0, window=3)) as s:
        seen = []
        for _ in range(7):
            s.iteration()
            seen.append(s.loss_scale.scale.item())
        assert seen == [8.0, 8.0, 16.0, 16.0, 16.0, 32.0, 32.0]


def test_float16_trains_as_float32_within_half_precision(tmp_path):
    with Solver(_param(tmp_path, precision="FLOAT32", name="f32")) as s:
        s.solve()
        want = _weights(s)
    with Solver(_param(tmp_path, name="f16")) as s:
        s.solve()
        got = _weights(s)
        assert s.loss_scale.skipped.item() == 0
    for a, b in zip(got, want, strict=True):
        assert ((a - b).norm() / b.norm()).item() < 2e-2   # float16: 11 bits of mantissa


def test_the_scale_is_in_the_solver_state_and_a_resume_is_exact(tmp_path):
    """Six iterations, snapshot, six more in a new Solver = twelve straight, from a scale
    large enough to overflow (it comes down, then grows again every 2 good iterations)."""

    def run(param, resume=None, stop=None):
        seen = []
        with Solver(param) as s:
            if resume:
                s.restore(resume)
            while s.iter < (stop or param.max_iter):
                s.iteration()
                seen.append(s.loss_scale.scale.item())
            if stop:
                s.snapshot()
            return _weights(s), s.loss_scale.state_dict(), seen

    common = {"scale": 2.0**24, "window": 2, "iters": 12}
    straight, state, seen = run(_param(tmp_path, **common, name="a"))
    assert state["skipped"] >= 1
    steps = list(zip(seen, seen[1:], strict=False))
    assert any(b < a for a, b in steps) and any(b > a for a, b in steps)
    run(_param(tmp_path, **common, name="b"), stop=6)
    resumed, resumed_state, _ = run(_param(tmp_path, **common, name="b"),
                                    resume=str(tmp_path / "b" / "s_iter_6.solverstate.pt"))
    assert resumed_state == state
    assert all(a.equal(b) for a, b in zip(resumed, straight, strict=True))


@pytest.mark.parametrize("captured", [False, True])
def test_replicas_keep_one_scale_and_skip_together(tmp_path, captured):
    """The tree: the root's scale flows down with the weights; captured whole iterations:
    every replica sees the same summed gradient and the same overflow."""
    param = _param(tmp_path, scale=1e30, iters=4)
    with ReplicatedRun(param, ["cpu"] * 2, tuning=Tuning(captured=captured)) as run:
        run.run()
        scales = [s.loss_scale.scale.item() for s in run.solvers]
        assert run.root.loss_scale.skipped.item() == 4
        assert all(not h.any() for h in run.root.updater.history)
    if captured:
        assert scales[0] == scales[1] == pytest.approx(1e30 / 16)
    else:   # the worker's scale is the root's as of the last weights it received
        assert scales[0] == pytest.approx(1e30 / 16) and scales[1] == pytest.approx(1e30 / 8)


def test_float16_with_model_averaging_is_refused(tmp_path):
    with pytest.raises(SpecError, match="precision FLOAT16 with model_average_period: each "
                                        "replica would scale its loss on its own"):
        _param(tmp_path, extra="model_average_period: 4\n")
