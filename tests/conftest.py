"""Shared fixtures: toy layer types (to test the Net apart from the layer library), specs, the
check that a test leaves no thread behind, the check that the suite leaves the checkout as it
found it, and the CPU thread count fixed for the suite.

The toy types are declared in the spec's table and registered only while a test module that
asks for ``toy_layers`` runs, and removed afterwards, so the registry test and other modules
see the real library alone.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from support import ROOT, tree_changes, tree_state

from caffe_py.layers import registry
from caffe_py.layers.base import Layer, Shape
from caffe_py.spec import layer_params
from caffe_py.spec.net_spec import FillerParameter, NetParameter, parse_net
from caffe_py.spec.schema import Message, Source, field
from caffe_py.spec.yamlio import loads

# A CPU run follows other processes' load with its thread count (caffe_py/cpu_threads.py),
# and its numbers and lines follow the count: the suite fixes the count at torch's own, as a
# user's OMP_NUM_THREADS does, so that what a run prints does not depend on what else the
# machine runs (subprocesses inherit it). tests/test_cpu_threads.py tests the governor itself.
os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))


@dataclass
class ToyParameter(Message):
    """Settings of the toy layers."""

    value: float = field(1.0, "ToyScale: initial weight; ToySource: the constant")
    bias_term: bool = field(False, "ToyScale: add a learnable bias (blob 1)")
    shape: list[int] = field([], "ToyScale: weight shape (default (C,)); ToySource: top shape")


class ToyScale(Layer):
    """y = x * w (+ b), w of C values broadcast over axis 1; blobs [weight, bias]."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        p, channels = self.param(), bottom_shapes[0][1]
        self.add_blob("weight", p.shape or [channels], FillerParameter(value=p.value))
        if p.bias_term:
            self.add_blob("bias", [channels])
        return [bottom_shapes[0]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        view = [1, -1] + [1] * (x.dim() - 2)
        y = x * self.weight.reshape(view)
        return y + self.bias.reshape(view) if self.param().bias_term else y


class ToyAdd(Layer):
    """The sum of two or more bottoms of one shape."""

    bottoms = (2, None)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        for i, shape in enumerate(bottom_shapes[1:], start=1):
            if shape != bottom_shapes[0]:
                raise self.bottom_error(i, f"has shape {list(shape)} but bottom 0 has "
                                           f"{list(bottom_shapes[0])}", "give equal shapes")
        return [bottom_shapes[0]]

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return sum(xs[1:], xs[0])


class ToyLoss(Layer):
    """Tops: sum(x^2) / 2 and mean(x)."""

    is_loss = True
    tops = (1, 2)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        return [()] * len(self.spec.top)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        half_sq = (x * x).sum() / 2
        return (half_sq, x.mean()) if len(self.spec.top) == 2 else half_sq


class ToySource(Layer):
    """No bottoms; one constant top of ``toy_param.shape``."""

    bottoms = (0, 0)

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        return [tuple(self.param().shape)]

    def forward(self) -> torch.Tensor:
        return torch.full(self.top_shapes[0], self.param().value)


class ToyStat(Layer):
    """y = x * w; blob 1 is a buffer counting TRAIN forwards (like BatchNorm's statistics)."""

    def setup(self, bottom_shapes: list[Shape]) -> list[Shape]:
        self.add_blob("weight", [bottom_shapes[0][1]], FillerParameter(value=1.0))
        self.add_blob("count", [1], learnable=False)
        return [bottom_shapes[0]]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.phase == "TRAIN":
            self.count.add_(1)
        return x * self.weight.reshape([1, -1] + [1] * (x.dim() - 2))


TOY_LAYERS = {"ToyScale": ToyScale, "ToyAdd": ToyAdd, "ToyLoss": ToyLoss,
              "ToySource": ToySource, "ToyStat": ToyStat}
TOY_BLOCKS = {"ToyScale": {"toy_param": ToyParameter}, "ToySource": {"toy_param": ToyParameter}}


@pytest.fixture(scope="module")
def toy_layers():
    """Declare and register the toy types for one test module."""
    for name, cls in TOY_LAYERS.items():
        layer_params.declare(name, TOY_BLOCKS.get(name, {}))
        registry.register(name)(cls)
    yield TOY_LAYERS
    for name in TOY_LAYERS:
        registry._LAYERS.pop(name, None)
        layer_params.undeclare(name)


def _spec_of(text: str, file: str = "net.yaml", base_dir: Path = Path(".")) -> NetParameter:
    return parse_net(loads(text, file), Source(file, base_dir))


@pytest.fixture
def spec_of():
    """``spec_of(yaml_text, file="net.yaml")``: a NetParameter parsed as if read from ``file``."""
    return _spec_of


@pytest.fixture
def no_stray_threads():
    """Fails a test that leaves a thread running (a feed, reader or replica it started); a
    module opts in with ``pytestmark = pytest.mark.usefixtures("no_stray_threads")``."""
    before = {t.ident for t in threading.enumerate()}
    yield
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert left == []


@pytest.fixture(scope="session", autouse=True)
def working_tree_unchanged():
    """Tests write only under tmp_path: after the session every file of the checkout (ignored
    ones included, caches aside) is as it was before it, or the last test's teardown fails
    naming what changed. (Editing files while the suite runs trips it too.)"""
    before = tree_state(ROOT)
    yield
    after = tree_state(ROOT)
    changed = tree_changes(before, after) if before is not None and after is not None else []
    if changed:
        pytest.fail(f"the tests changed {len(changed)} file(s) of the checkout (write under "
                    f"tmp_path instead): {', '.join(changed[:10])}", pytrace=False)
