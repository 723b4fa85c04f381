"""Running a net for N batches (Caffe's Solver::Test and ``caffe test``) and timing its layers
(``caffe time``), with Caffe's output lines."""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from ..errors import DataError
from ..net import Net

log = logging.getLogger(__name__)


def run_batches(net: Net, iterations: int, *, autocast: Callable = contextlib.nullcontext,
                between: Callable[[], bool] | None = None,
                on_batch: Callable[[int, dict[str, torch.Tensor], float], None] | None = None,
                ) -> dict[str, torch.Tensor] | None:
    """The mean of every output (flattened, on the CPU) over ``iterations`` forward passes.

    Sums stay on the device until the end (one host sync), unless ``on_batch`` wants each
    batch's values. ``between`` runs before each batch; True stops early (returns None).
    The mean loss is under the key ``"__loss__"`` (:func:`output_means` drops it).
    """
    sums: dict[str, torch.Tensor] = {}
    loss_sum = torch.zeros((), device=net.device)
    with torch.no_grad():
        for i in range(iterations):
            if between is not None and between():
                return None
            with autocast():
                out = net()
            loss_sum += out.loss.detach().float()
            for name, value in out.outputs.items():
                flat = value.detach().float().reshape(-1)
                sums[name] = sums[name] + flat if name in sums else flat.clone()
            if on_batch is not None:
                on_batch(i, {n: v.detach().float().reshape(-1).cpu()
                             for n, v in out.outputs.items()}, float(out.loss))
    means = {name: (s / iterations).cpu() for name, s in sums.items()}
    means["__loss__"] = (loss_sum / iterations).cpu().reshape(1)
    raise_device_problems(net)
    return means


def raise_device_problems(net: Net) -> None:
    """Raise what the net's layers noticed on the device (e.g. a bad label; a host sync)."""
    for check in net.device_checks():
        problem = check.problem(check.state.cpu())
        if problem is not None:
            raise DataError(problem)


def output_means(means: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``run_batches``' result without the loss entry."""
    return {k: v for k, v in means.items() if k != "__loss__"}


def format_output_lines(prefix: str, values: Mapping[str, torch.Tensor],
                        loss_weights: Mapping[str, float]) -> list[str]:
    """Caffe's '<prefix> #k: name = v (* w = w*v loss)', one line per output element."""
    lines, k = [], 0
    for name, value in output_means(values).items():
        for v in value.reshape(-1).tolist():
            weight = loss_weights.get(name, 0.0)
            extra = f" (* {weight:g} = {weight * v:g} loss)" if weight else ""
            lines.append(f"{prefix} #{k}: {name} = {v:g}{extra}")
            k += 1
    return lines


@dataclass
class LayerTimes:
    """Milliseconds summed over the timed iterations, per layer in layer order (a name may
    repeat: each layer has its own row)."""

    names: list[str] = field(default_factory=list)
    forward: list[float] = field(default_factory=list)
    backward: list[float] = field(default_factory=list)
    iterations: list[float] = field(default_factory=list)
    """Forward-backward milliseconds of each iteration."""


def time_layers(net: Net, iterations: int,
                inputs: Mapping[str, torch.Tensor] | None = None) -> LayerTimes:
    """Caffe's ``time``: each layer's forward and backward, ``iterations`` times.

    Forward is timed around each layer's call within a real forward pass. Backward is timed
    per layer in isolation, from the bottoms that pass saw (the gradient of each top is ones),
    as Caffe's Backward calls each layer on its own. Layers are told apart by their place in
    the net, not their names (two layers may share one).
    """
    sync = (lambda: torch.cuda.synchronize(net.device)) if net.device.type == "cuda" \
        else (lambda: None)
    layers = list(net.layers)
    place = {id(layer): i for i, layer in enumerate(layers)}
    times = LayerTimes([layer.name for layer in layers], [0.0] * len(layers),
                       [0.0] * len(layers))
    seen: dict[int, tuple] = {}
    starts: dict[int, float] = {}

    def before(layer, args):
        sync()
        seen[place[id(layer)]] = tuple(a.detach() for a in args)
        starts[place[id(layer)]] = time.perf_counter()

    def after(layer, args, out):
        sync()
        i = place[id(layer)]
        times.forward[i] += (time.perf_counter() - starts[i]) * 1e3

    needs = _bottoms_needing_grad(net, inputs, place)
    hooks = [layer.register_forward_pre_hook(before) for layer in layers]
    try:  # warm-up: the first isolated backward of a layer pays one-time setup costs
        with torch.no_grad():
            net(inputs)
        for i in reversed(range(len(layers))):
            _time_backward(layers[i], seen[i], needs[i], sync)
    finally:
        for h in hooks:
            h.remove()
    hooks = [h for layer in layers
             for h in (layer.register_forward_pre_hook(before),
                       layer.register_forward_hook(after))]
    try:
        for _ in range(iterations):
            start = time.perf_counter()
            with torch.no_grad():
                net(inputs)
            for i in reversed(range(len(layers))):
                times.backward[i] += _time_backward(layers[i], seen[i], needs[i], sync)
            times.iterations.append((time.perf_counter() - start) * 1e3)
            log.info(f"Iteration: {len(times.iterations)} forward-backward time: "
                     f"{times.iterations[-1]:.3f} ms.")
    finally:
        for h in hooks:
            h.remove()
    return times


def _bottoms_needing_grad(net: Net, inputs: Mapping[str, torch.Tensor] | None,
                          place: Mapping[int, int]) -> dict[int, list[bool]]:
    """Per layer (its place in the net), which bottoms a real backward computes gradients for
    (Caffe's bottom_need_backward): the data layers' tops, for one, need none."""
    needs: dict[int, list[bool]] = {}

    def record(layer, args):
        needs[place[id(layer)]] = [isinstance(a, torch.Tensor) and a.requires_grad
                                   for a in args]

    hooks = [layer.register_forward_pre_hook(record) for layer in net.layers]
    try:
        with torch.enable_grad():
            net(inputs)
    finally:
        for h in hooks:
            h.remove()
    return needs


def _time_backward(layer: torch.nn.Module, bottoms: tuple, needs: list[bool],
                   sync: Callable[[], None]) -> float:
    """Milliseconds of one backward through ``layer`` alone (0 when nothing needs a gradient)."""
    inputs = [b.clone().requires_grad_(True) if need else b
              for b, need in zip(bottoms, needs, strict=True)]
    with torch.enable_grad():
        tops = layer(*inputs)
    tops = [tops] if isinstance(tops, torch.Tensor) else list(tops)
    tops = [t for t in tops if t.requires_grad]
    wrt = [x for x in inputs if x.requires_grad] + [p for p in layer.parameters()
                                                    if p.requires_grad]
    if not tops or not wrt:
        return 0.0
    grads = [torch.ones_like(t) for t in tops]
    sync()
    start = time.perf_counter()
    torch.autograd.grad(tops, wrt, grads, allow_unused=True)
    sync()
    return (time.perf_counter() - start) * 1e3


def time_report(net: Net, times: LayerTimes, iterations: int) -> list[str]:
    """Caffe's summary lines: per layer averages, then the totals."""
    lines = ["Average time per layer: "]
    width = max([10] + [len(n) for n in times.names])
    for name, forward, backward in zip(times.names, times.forward, times.backward,
                                       strict=True):
        lines.append(f"{name:>{width}}\tforward: {forward / iterations:.5g} ms.")
        lines.append(f"{name:>{width}}\tbackward: {backward / iterations:.5g} ms.")
    fwd = sum(times.forward) / iterations
    bwd = sum(times.backward) / iterations
    total = sum(times.iterations)
    lines += [f"Average Forward pass: {fwd:.5g} ms.",
              f"Average Backward pass: {bwd:.5g} ms.",
              f"Average Forward-Backward: {total / iterations:.5g} ms.",
              f"Total Time: {total:.5g} ms."]
    return lines


@contextlib.contextmanager
def fed(net: Net, *, seed: int = 0):
    """Readers for ``net``'s Data layers, started, and closed on exit (nothing when none)."""
    if not net.data_layers():
        yield net
        return
    from ..io import ReaderPool, attach_feeds

    with ReaderPool(replicas=1) as pool:
        attach_feeds(net, pool, replica=0, device=net.device, seed=seed)
        pool.start()
        yield net


def random_inputs(net: Net, seed: int = 0) -> dict[str, torch.Tensor]:
    """Gaussian tensors of the build shapes for a net's Input tops (what ``time`` feeds)."""
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(net.blobs[name], generator=gen).to(net.device)
            for name in net.input_names}
