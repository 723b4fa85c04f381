"""The solver on CUDA: same numbers as the CPU, exact resume, BF16 (skipped without a GPU)."""
from __future__ import annotations

import pytest
import torch

from caffe_py.solver.solver import Solver

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def trained(param, device, resume=None):
    with Solver(param, device=device) as solver:
        solver.solve(resume)
        return {k: [b.detach().cpu() for b in v] for k, v in solver.net.layer_blobs().items()}


def no_dropout(ws):
    text = (ws.root / "net.yaml").read_text()
    start = text.index("  - name: drop")
    ws.net(text[:start] + text[text.index("  - name: loss"):])


def test_cuda_matches_cpu(ws):
    # an LMDB: the same records, crops and mirrors on both (DummyData draws on its device)
    ws.net(ws.LMDB_NET, batch=2)
    cpu = trained(ws.load(max_iter=5, snapshot_prefix="cpu/t"), "cpu")
    gpu = trained(ws.load(max_iter=5, snapshot_prefix="gpu/t"), "cuda:0")
    for a, b in zip(cpu["ip"], gpu["ip"], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_cuda_resume_continues_exactly(ws):
    straight = trained(ws.load(max_iter=6), "cuda:0")
    trained(ws.load(max_iter=3, snapshot_prefix="b/t"), "cuda:0")
    resumed = trained(ws.load(max_iter=6, snapshot_prefix="c/t"), "cuda:0",
                      resume=str(ws.root / "b" / "t_iter_3.solverstate.pt"))
    for a, b in zip(straight["ip"], resumed["ip"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_bf16_on_cuda_runs_layers_in_bfloat16_and_trains_float32_weights(ws):
    with Solver(ws.load(max_iter=20, precision="BF16", lr_policy="fixed"),
                device="cuda:0") as solver:
        before = [w.detach().clone() for w in solver.updater.params]
        dtypes: list[torch.dtype] = []
        solver.net.layer_by_name("ip").register_forward_hook(
            lambda _layer, _bottoms, top: dtypes.append(top.dtype))
        solver.step(20)
        assert dtypes == [torch.bfloat16] * 20  # autocast ran the InnerProduct in bfloat16
        assert all(w.dtype == torch.float32 and w.is_cuda for w in solver.updater.params)
        assert all(torch.isfinite(w).all() for w in solver.updater.params)
        assert not torch.equal(before[0], solver.updater.params[0])
        assert 0.5 < solver.smoothed_loss() < 3.0  # random labels over 3 classes: ~log(3)


def test_backward_runs_on_the_calling_thread_unless_told_not_to(ws):
    """The eager step hands its backward to the autograd engine's device thread only when the
    solver's backward_in_caller is off (a parallel run's replicas); the numbers agree."""
    import threading

    weights = {}
    for in_caller in (True, False):
        with Solver(ws.load(max_iter=4), device="cuda:0") as solver:
            solver.backward_in_caller = in_caller
            where: list[int] = []

            def note(grad, where=where):
                where.append(threading.get_ident())
                return grad

            solver.updater.params[0].register_hook(note)
            solver.step(4)
            assert len(where) == 4
            assert (set(where) == {threading.get_ident()}) is in_caller
            weights[in_caller] = [w.detach().clone() for w in solver.updater.params]
    for a, b in zip(weights[True], weights[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
