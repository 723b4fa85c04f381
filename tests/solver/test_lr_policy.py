"""All seven lr policies against their closed forms (CAFFE_REFERENCE.md)."""
import math

import numpy as np
import pytest

from caffe_py.spec.lr_policy import learning_rate
from caffe_py.spec.schema import Source
from caffe_py.spec.solver_spec import parse_solver


def solver(**fields):
    node = {"net_param": {"name": "n"}, "base_lr": 0.1, "max_iter": 100, **fields}
    return parse_solver(node, Source())


def f32(x):
    return float(np.float32(x))


CASES = [
    ({"lr_policy": "fixed"}, lambda it: 0.1),
    ({"lr_policy": "step", "gamma": 0.5, "stepsize": 3}, lambda it: 0.1 * 0.5 ** (it // 3)),
    ({"lr_policy": "exp", "gamma": 0.9}, lambda it: 0.1 * 0.9 ** it),
    ({"lr_policy": "inv", "gamma": 1e-2, "power": 0.75},
     lambda it: 0.1 * (1 + 1e-2 * it) ** -0.75),
    ({"lr_policy": "poly", "power": 2.0}, lambda it: 0.1 * (1 - it / 100) ** 2),
    ({"lr_policy": "sigmoid", "gamma": -0.1, "stepsize": 50},
     lambda it: 0.1 / (1 + math.exp(0.1 * (it - 50)))),
]


@pytest.mark.parametrize("fields, closed", CASES, ids=[c[0]["lr_policy"] for c in CASES])
def test_policy_matches_closed_form(fields, closed):
    p = solver(**fields)
    for it in (0, 1, 2, 3, 7, 50, 99):
        rate, _ = learning_rate(p, it, 0)
        assert rate == f32(closed(it)), (it, rate)


def test_multistep_rises_one_step_per_call_and_keeps_state():
    p = solver(lr_policy="multistep", gamma=0.1, stepvalue=[2, 4])
    step, rates = 0, []
    for it in range(6):
        rate, step = learning_rate(p, it, step)
        rates.append(rate)
    assert rates == [f32(0.1), f32(0.1), f32(0.01), f32(0.01), f32(0.001), f32(0.001)]
    assert step == 2
    # Resuming far past both values climbs one step per iteration, as Caffe's state does.
    rate, step = learning_rate(p, 10, 0)
    assert (rate, step) == (f32(0.01), 1)
    rate, step = learning_rate(p, 11, step)
    assert (rate, step) == (f32(0.001), 2)


def test_step_sets_current_step_from_iteration():
    p = solver(lr_policy="step", gamma=0.1, stepsize=10)
    assert learning_rate(p, 25, 0) == (f32(0.1 * 0.01), 2)


def test_sigmoid_past_exps_range_is_a_rate_of_zero():
    """Caffe's 1 / (1 + exp(z)) with exp overflowing to inf: the rate is 0, not an error."""
    p = solver(lr_policy="sigmoid", gamma=-1e30, stepsize=1)
    assert learning_rate(p, 5, 0) == (0.0, 0)
    assert learning_rate(p, 0, 0) == (f32(0.1), 0)
