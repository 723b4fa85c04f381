"""The update pipeline and the six rules against a plain per-parameter oracle and hand values."""
import math

import pytest
import torch

from caffe_py.solver.rules import Updater, group_params
from caffe_py.spec.lr_policy import learning_rate
from caffe_py.spec.schema import Source
from caffe_py.spec.solver_spec import parse_solver


def solver(**fields):
    node = {"net_param": {"name": "n"}, "base_lr": 0.1, "max_iter": 100, **fields}
    return parse_solver(node, Source())


def reference_update(p, w, g, h, rate, it, lr_mult, decay_mult):
    """One parameter, written straight from CAFFE_REFERENCE.md (g already clipped)."""
    if lr_mult == 0:
        return
    g = g / p.iter_size
    decay = p.weight_decay * decay_mult
    if decay:
        g = g + decay * (w if p.regularization_type == "L2" else torch.sign(w))
    lr, m, d = rate * lr_mult, p.momentum, p.delta
    if p.type == "SGD":
        h[0] = m * h[0] + lr * g
        update = h[0]
    elif p.type == "Nesterov":
        old = h[0].clone()
        h[0] = m * h[0] + lr * g
        update = (1 + m) * h[0] - m * old
    elif p.type == "AdaGrad":
        h[0] = h[0] + g * g
        update = lr * g / (torch.sqrt(h[0]) + d)
    elif p.type == "RMSProp":
        h[0] = p.rms_decay * h[0] + (1 - p.rms_decay) * g * g
        update = lr * g / (torch.sqrt(h[0]) + d)
    elif p.type == "AdaDelta":
        h[0] = m * h[0] + (1 - m) * g * g
        u = g * torch.sqrt((h[1] + d) / (h[0] + d))
        h[1] = m * h[1] + (1 - m) * u * u
        update = lr * u
    elif p.type == "Adam":
        t = it + 1
        h[0] = m * h[0] + (1 - m) * g
        h[1] = p.momentum2 * h[1] + (1 - p.momentum2) * g * g
        update = lr * math.sqrt(1 - p.momentum2 ** t) / (1 - m ** t) * h[0] / (
            torch.sqrt(h[1]) + d)
    w -= update


def reference_run(p, weights, grads_per_step, mults):
    ws = [w.clone() for w in weights]
    n_hist = 2 if p.type in ("AdaDelta", "Adam") else 1
    hs = [[torch.zeros_like(w) for _ in range(n_hist)] for w in ws]
    step = 0
    for it, grads in enumerate(grads_per_step):
        rate, step = learning_rate(p, it, step)
        live = [g for g, (lr, _) in zip(grads, mults, strict=True) if lr != 0]
        scale = 1.0
        if p.clip_gradients > 0:
            norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in live))
            scale = p.clip_gradients / norm if norm > p.clip_gradients else 1.0
        for w, g, h, (lr, dec) in zip(ws, grads, hs, mults, strict=True):
            reference_update(p, w, g * scale, h, rate, it, lr, dec)
    return ws


def pipeline_run(p, weights, grads_per_step, mults):
    params = [torch.nn.Parameter(w.clone()) for w in weights]
    up = Updater(p, params, mults)
    step = 0
    for it, grads in enumerate(grads_per_step):
        rate, step = learning_rate(p, it, step)
        for w, g in zip(params, grads, strict=True):
            w.grad = g.clone()
        up.apply(rate, it)
    return [w.detach() for w in params]


SOLVERS = [
    {"type": "SGD", "momentum": 0.9},
    {"type": "Nesterov", "momentum": 0.9},
    {"type": "AdaGrad", "delta": 1e-6},
    {"type": "RMSProp", "rms_decay": 0.9, "delta": 1e-6},
    {"type": "AdaDelta", "momentum": 0.95, "delta": 1e-6},
    {"type": "Adam", "momentum": 0.9, "momentum2": 0.99, "delta": 1e-6},
]
POLICIES = [
    {"lr_policy": "fixed"},
    {"lr_policy": "step", "gamma": 0.1, "stepsize": 2},
    {"lr_policy": "multistep", "gamma": 0.5, "stepvalue": [1, 3]},
    {"lr_policy": "inv", "gamma": 0.1, "power": 0.75},
]


@pytest.mark.parametrize("policy", POLICIES, ids=[q["lr_policy"] for q in POLICIES])
@pytest.mark.parametrize("rule", SOLVERS, ids=[s["type"] for s in SOLVERS])
def test_rule_matches_reference(rule, policy):
    gen = torch.Generator().manual_seed(0)
    shapes = [(3, 4), (4,), (2, 2), (5,)]
    mults = [(1.0, 1.0), (2.0, 0.0), (1.0, 1.0), (0.5, 2.0)]
    weights = [torch.randn(s, generator=gen) for s in shapes]
    grads = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(5)]
    p = solver(weight_decay=0.01, **rule, **policy)
    got = pipeline_run(p, weights, grads, mults)
    want = reference_run(p, weights, grads, mults)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert not torch.equal(got[0], weights[0])


def test_sgd_uses_caffe_momentum_form_when_the_rate_changes():
    # w = 1, g = 1 each step, m = 0.9, rate 0.1 then 0.01.
    # Caffe: h1 = 0.1, w = 0.9; h2 = 0.09 + 0.01 = 0.1, w = 0.8.
    # torch.optim.SGD would give buf2 = 1.9 and w = 0.9 - 0.019 = 0.881.
    p = solver(type="SGD", momentum=0.9, lr_policy="step", gamma=0.1, stepsize=1)
    (w,) = pipeline_run(p, [torch.ones(1)], [[torch.ones(1)], [torch.ones(1)]], [(1.0, 1.0)])
    assert w.item() == pytest.approx(0.8, abs=1e-6)


def test_adam_adds_delta_before_bias_correction():
    # One step, g = 1: m1 = 0.1, m2 = 0.001, correction = sqrt(0.001) / 0.1.
    # update = 0.1 * correction * 0.1 / (sqrt(0.001) + 0.5) = 0.1 * 0.1 * 0.31623 / 0.53162
    p = solver(type="Adam", momentum=0.9, momentum2=0.999, delta=0.5)
    (w,) = pipeline_run(p, [torch.zeros(1)], [[torch.ones(1)]], [(1.0, 1.0)])
    want = -0.1 * (math.sqrt(0.001) / 0.1) * 0.1 / (math.sqrt(0.001) + 0.5)
    assert w.item() == pytest.approx(want, rel=1e-5)


def test_clip_scales_by_global_norm_before_iter_size_division():
    # grads (3, 4): norm 5 > clip 2 -> (1.2, 1.6); iter_size 2 -> (0.6, 0.8); SGD lr 1, m 0.
    p = solver(type="SGD", base_lr=1.0, clip_gradients=2.0, iter_size=2)
    got = pipeline_run(p, [torch.zeros(1), torch.zeros(1)],
                       [[torch.tensor([3.0]), torch.tensor([4.0])]], [(1.0, 1.0), (1.0, 1.0)])
    assert [w.item() for w in got] == pytest.approx([-0.6, -0.8])


def test_clip_leaves_small_gradients_alone():
    p = solver(type="SGD", base_lr=1.0, clip_gradients=10.0)
    got = pipeline_run(p, [torch.zeros(2)], [[torch.tensor([3.0, 4.0])]], [(1.0, 1.0)])
    assert got[0].tolist() == [-3.0, -4.0]


@pytest.mark.parametrize("kind, want", [("L2", 2.0 - 0.1 * 0.05 * 2.0),
                                        ("L1", 2.0 - 0.1 * 0.05 * 1.0)])
def test_regularization_uses_decay_mult(kind, want):
    p = solver(type="SGD", weight_decay=0.1, regularization_type=kind)
    got = pipeline_run(p, [torch.tensor([2.0]), torch.tensor([2.0])],
                       [[torch.zeros(1), torch.zeros(1)]], [(1.0, 0.5), (1.0, 0.0)])
    assert got[0].item() == pytest.approx(want)
    assert got[1].item() == 2.0  # decay_mult 0: no decay


def test_lr_mult_zero_is_never_updated_and_lr_mult_scales_the_rate():
    p = solver(type="SGD", weight_decay=0.5, clip_gradients=0.1)
    got = pipeline_run(p, [torch.ones(1), torch.zeros(1)],
                       [[torch.tensor([100.0]), torch.tensor([0.05])]], [(0.0, 1.0), (2.0, 0.0)])
    assert got[0].item() == 1.0
    # The frozen blob's gradient does not count towards the clip norm.
    assert got[1].item() == pytest.approx(-0.1 * 2 * 0.05)


def test_group_params_by_multipliers():
    groups = group_params([(1, 1), (2, 0), (1, 1), (0, 1)])
    assert [(g.indices, g.lr_mult, g.decay_mult) for g in groups] == [
        ((0, 2), 1.0, 1.0), ((1,), 2.0, 0.0), ((3,), 0.0, 1.0)]


def test_history_layout_is_caffe_order():
    p = solver(type="Adam", momentum=0.9)
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))]
    up = Updater(p, params, [(1, 1), (1, 1)])
    assert [tuple(h.shape) for h in up.history] == [(2,), (3,), (2,), (3,)]


def test_cpu_parameters_keep_the_op_by_op_pipeline():
    """The one-kernel SGD (tests/kernels/test_sgd_update_gpu.py) is for CUDA parameters only;
    on the CPU the first update settles on the pipeline, and a rate row as a tensor (what the
    graph loop passes) gives the numbers of the same rates as floats."""
    p = solver(type="SGD", momentum=0.9, weight_decay=0.01)
    a = [torch.nn.Parameter(torch.arange(6.0).reshape(2, 3)), torch.nn.Parameter(torch.ones(3))]
    b = [torch.nn.Parameter(w.detach().clone()) for w in a]
    ups = [Updater(p, ws, [(1, 1), (2, 0)]) for ws in (a, b)]
    for it in range(3):
        for ws in (a, b):
            for w in ws:
                w.grad = torch.full_like(w, 0.5 + it)
        scales = ups[0].scales(0.1, it)
        ups[0].apply_scales(scales)
        ups[1].apply_scales(torch.tensor(scales))
    assert ups[0].fused is False and ups[1].fused is False
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # the bias (lr_mult 2, no decay): h = 0.1, 0.39, 0.851 after g = 0.5, 1.5, 2.5
    assert a[1].tolist() == pytest.approx([1 - (0.1 + 0.39 + 0.851)] * 3)


@pytest.mark.parametrize("rule", ["SGD", "Adam"])
@pytest.mark.parametrize("masked", [False, True], ids=["update", "skip flag"])
def test_an_update_given_summed_gradients_divides_them_first(rule, masked):
    """``mean_of``: the gradients hold the sum over 3 replicas and the update divides them by 3
    first, what the all-reduce's 1/N gives (the multiply by 1/3, rounded) bit for bit; on the
    CPU, which no kernel folds it into, the update says it cannot take the mean itself."""
    p = solver(type=rule, momentum=0.9, weight_decay=0.01)
    gen = torch.Generator().manual_seed(4)
    start = [torch.randn(4, 3, generator=gen), torch.randn(3, generator=gen)]
    sums = [[torch.randn(4, 3, generator=gen), torch.randn(3, generator=gen)] for _ in range(3)]
    out = []
    for mean_of in (3, 1):
        params = [torch.nn.Parameter(w.clone()) for w in start]
        up = Updater(p, params, [(1, 1), (2, 0)])
        up.mean_of = mean_of
        for it, grads in enumerate(sums):
            for w, g in zip(params, grads, strict=True):
                w.grad = g.clone() if mean_of == 3 else g * (1.0 / 3)
            scales = up.scales(0.1, it)
            if masked:
                up.apply_scales(scales, skip=torch.zeros(()))
            else:
                up.apply_scales(scales)
        assert not up.can_take_mean()
        out.append([*params, *up.history])
    for a, b in zip(*out, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(out[0][0], start[0])
