"""The one-kernel SGD update (csrc/sgd_update.cu, Updater with ``fused`` left to decide) against
the op-by-op pipeline (``fused=False``, itself held to Caffe's formulas by
tests/solver/test_rules.py), bit for bit: host and device rates, L2 and L1, iter_size, the
gradient clip before it, groups with other multipliers, a decay of zero, momentum zero,
channels_last weights, empty tensors, enough tensors for several launches, and views into one
buffer (a replica's flat buffers) on and off 16-byte boundaries.
Skipped without CUDA; run with `pytest -m gpu`."""
from __future__ import annotations

import pytest
import torch

from caffe_py.kernels import functions
from caffe_py.solver.rules import Updater
from caffe_py.spec.lr_policy import learning_rate
from caffe_py.spec.schema import Source
from caffe_py.spec.solver_spec import parse_solver

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

LENET = [(20, 1, 5, 5), (20,), (50, 20, 5, 5), (50,), (500, 800), (500,), (10, 500), (10,)]


def solver(**fields):
    node = {"net_param": {"name": "n"}, "base_lr": 0.01, "max_iter": 100, "momentum": 0.9,
            "weight_decay": 5e-4, "lr_policy": "inv", "gamma": 1e-4, "power": 0.75, **fields}
    return parse_solver(node, Source())


def run(p, shapes, mults, fused, steps=5, device_rates=False, channels_last=False, seed=0,
        offset=None, mean_of=1, divided=False):
    """The weights, gradients and history after ``steps`` updates of random gradients.
    ``offset``: every weight and gradient is a view into one flat buffer, the first starting
    ``offset`` elements in and each next one right after it (as in a replica's flat buffers;
    an offset that is not a multiple of 4 leaves them off 16-byte boundaries). ``mean_of``:
    the gradients are sums over that many replicas, divided by the update, or with
    ``divided`` before it as the all-reduce would."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    params = [torch.nn.Parameter(torch.randn(s, generator=gen, device="cuda").contiguous(
        memory_format=fmt if len(s) == 4 else torch.contiguous_format)) for s in shapes]
    if offset is not None:
        params = [torch.nn.Parameter(view) for view in _views(params, offset)]
    up = Updater(p, params, mults, fused=fused)
    up.mean_of = 1 if divided else mean_of
    step = 0
    for it in range(steps):
        rate, step = learning_rate(p, it, step)
        grads = [torch.randn(w.shape, generator=gen, device="cuda").contiguous(
            memory_format=fmt if w.dim() == 4 else torch.contiguous_format) for w in params]
        if offset is not None:
            grads = _views(grads, offset)
        if divided:
            torch._foreach_mul_(grads, 1.0 / mean_of)
        for w, g in zip(params, grads, strict=True):
            w.grad = g
        scales = up.scales(rate, it)
        if device_rates:
            up.apply_scales(torch.tensor(scales, dtype=torch.float32, device="cuda"))
        else:
            up.apply_scales(scales)
    torch.cuda.synchronize()
    return up, [w.detach() for w in params] + [w.grad for w in params] + list(up.history)


def _views(tensors, offset):
    """Copies of ``tensors`` as views into one buffer, the first ``offset`` elements in."""
    buf = torch.zeros(offset + sum(t.numel() for t in tensors), device="cuda")
    views, at = [], offset
    for t in tensors:
        view = buf[at:at + t.numel()].view(t.shape)
        view.copy_(t)
        views.append(view)
        at += t.numel()
    return views


def assert_same(p, shapes, mults, **kw):
    fast, got = run(p, shapes, mults, None, **kw)
    slow, want = run(p, shapes, mults, False, **kw)
    assert fast.fused is True and slow.fused is False
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want, strict=True)):
        assert a.stride() == b.stride(), k
        assert torch.equal(a, b), (k, (a - b).abs().max().item())


LENET_MULTS = [(1, 1), (2, 0)] * 4


@pytest.mark.parametrize("device_rates", [False, True], ids=["host rate", "device rate"])
def test_lenet_update_is_the_pipelines_bit_for_bit(device_rates):
    assert_same(solver(), LENET, LENET_MULTS, device_rates=device_rates)


@pytest.mark.parametrize("fields", [{"regularization_type": "L1"}, {"iter_size": 3},
                                    {"momentum": 0.0}, {"weight_decay": 0.0},
                                    {"lr_policy": "fixed", "base_lr": 0.1},
                                    {"clip_gradients": 5.0}],
                         ids=["L1", "iter_size", "no momentum", "no decay", "fixed", "clip"])
@pytest.mark.parametrize("device_rates", [False, True], ids=["host rate", "device rate"])
def test_solver_fields_are_the_pipelines_bit_for_bit(fields, device_rates):
    assert_same(solver(**fields), LENET, [(1, 1), (2, 0), (1, 3), (0.5, 1)] * 2,
                device_rates=device_rates)


@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("device_rates", [False, True], ids=["host rate", "device rate"])
def test_the_replicas_mean_folded_into_the_kernel_is_the_division_after_the_sum(n, device_rates):
    # the all-reduce's part.mul_(1/N) then the kernel, against the kernel multiplying by 1/N
    # itself and against the pipeline dividing first, bit for bit (1/3 is not exact)
    p, shapes = solver(), [(5,), (64, 3, 3, 3), (4099,), (10, 7), (8192,)]
    mults = [(1, 1), (2, 0), (1, 1), (1, 3), (0.5, 1)]
    kw = {"device_rates": device_rates, "offset": 0}
    up, folded = run(p, shapes, mults, None, mean_of=n, **kw)
    _, divided = run(p, shapes, mults, None, mean_of=n, divided=True, **kw)
    slow, pipeline = run(p, shapes, mults, False, mean_of=n, **kw)
    assert up.fused is True and up.mean_of == n and slow.fused is False
    assert up.can_take_mean() and not slow.can_take_mean()
    for k, (a, b, c) in enumerate(zip(folded, divided, pipeline, strict=True)):
        assert torch.equal(a, b), (k, (a - b).abs().max().item())
        assert torch.equal(a, c), (k, (a - c).abs().max().item())


def test_many_tensors_split_over_launches():
    # 135 tensors (64 a launch), one of 3.1 M elements (757 blocks of 4,096), empty ones, sizes
    # that leave 1-3 elements after the last float4
    shapes = [(3_100_000,), (0,), *[(k * 37 + 1,) for k in range(130)], (0, 4), (8193,), (1,)]
    mults = [(1 + k % 3, k % 2) for k in range(len(shapes))]
    assert_same(solver(), shapes, mults, device_rates=True)
    assert_same(solver(), shapes, mults)


@pytest.mark.parametrize("offset", [0, 1, 2, 4], ids=lambda k: f"{k} elements in")
def test_views_into_one_buffer_at_any_alignment(offset):
    # a replica's flat buffers: aligned views stream in float4 packs, the others element by
    # element, the same numbers
    shapes = [(5,), (64, 3, 3, 3), (4099,), (10, 7), (1,), (8192,)]
    mults = [(1, 1), (2, 0)] * 3
    assert_same(solver(), shapes, mults, offset=offset, device_rates=True)
    assert_same(solver(), shapes, mults, offset=offset)


def test_channels_last_weights_stream_in_their_layout():
    assert_same(solver(), [(64, 32, 3, 3), (64,), (128, 64, 1, 1)], [(1, 1), (2, 0), (1, 1)],
                channels_last=True)


def test_lr_mult_zero_is_left_alone():
    p = solver()
    up, out = run(p, [(30,), (40,)], [(0, 1), (1, 1)], None, steps=2, seed=3)
    _, before = run(p, [(30,), (40,)], [(0, 1), (1, 1)], None, steps=0, seed=3)
    assert torch.equal(out[0], before[0])
    assert not torch.equal(out[1], before[1])


def test_a_layout_it_does_not_stream_falls_back_writing_nothing():
    w = torch.randn(6, 4, device="cuda")
    g = torch.randn(4, 6, device="cuda").t()  # the same shape, other strides
    h = torch.zeros_like(w)
    w0, g0 = w.clone(), g.clone()
    assert functions.sgd_update([w], [g], [h], [0], [0.1], [5e-4], 0.9, 1.0, False) is False
    assert torch.equal(w, w0) and torch.equal(g, g0) and not h.any()
    params = [torch.nn.Parameter(w.clone())]
    params[0].grad = g.clone()
    up = Updater(solver(), params, [(1, 1)])
    up.apply(0.1, 0)  # falls back to the pipeline: the same numbers as fused=False
    ref = [torch.nn.Parameter(w.clone())]
    ref[0].grad = g.clone()
    Updater(solver(), ref, [(1, 1)], fused=False).apply(0.1, 0)
    assert up.fused is True and torch.equal(params[0], ref[0])


def test_other_rules_keep_the_pipeline():
    up, _ = run(solver(type="Nesterov"), LENET, LENET_MULTS, None, steps=1)
    assert up.fused is False


def test_one_update_replays_in_a_cuda_graph_with_new_rates():
    p = solver()
    shapes, mults = LENET, LENET_MULTS
    gen = torch.Generator(device="cuda").manual_seed(5)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen, device="cuda")) for s in shapes]
    ref = [torch.nn.Parameter(w.detach().clone()) for w in params]
    grads = [torch.randn(s, generator=gen, device="cuda") for s in shapes]
    up, slow = Updater(p, params, mults), Updater(p, ref, mults, fused=False)
    rates = torch.zeros(2, device="cuda")
    for w, g in zip(params, grads, strict=True):
        w.grad = g.clone()
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        up.apply_scales(rates)  # the first call decides fused and warms the kernel up
    torch.cuda.current_stream().wait_stream(side)
    for w, r in zip(params, ref, strict=True):  # undo the warm-up's update
        w.data.copy_(r)
    for h in up.history:
        h.zero_()
    with torch.cuda.graph(graph):
        up.apply_scales(rates)
    for it in range(3):
        scales = up.scales(0.01 * (it + 1), it)
        rates.copy_(torch.tensor(scales))
        for w, g in zip(params, grads, strict=True):
            w.grad.copy_(g)
        graph.replay()
        for w, g in zip(ref, grads, strict=True):
            w.grad = g.clone()
        slow.apply_scales([torch.tensor(s, device="cuda") for s in scales])
    torch.cuda.synchronize()
    for a, b in zip([*params, *up.history], [*ref, *slow.history], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fields,mults", [({}, LENET_MULTS),
                                          ({"iter_size": 2}, LENET_MULTS),
                                          ({"clip_gradients": 5.0}, LENET_MULTS),
                                          ({"type": "Nesterov"}, LENET_MULTS),
                                          ({}, [(1, 1), (0, 0)] * 4)],
                         ids=["SGD", "iter_size", "clip", "Nesterov", "a frozen blob"])
def test_which_updates_take_the_replicas_mean(fields, mults):
    # only where dividing in the kernel's one multiply gives the all-reduce's numbers
    params = [torch.nn.Parameter(torch.zeros(s, device="cuda")) for s in LENET]
    assert Updater(solver(**fields), params, mults).can_take_mean() is (fields == {} and
                                                                         mults is LENET_MULTS)
