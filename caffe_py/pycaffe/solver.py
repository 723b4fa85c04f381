"""pycaffe's solvers (``caffe.SGDSolver(file)``, ``caffe.get_solver(file)``...) over
caffe-py's Solver.

The caffe-py Solver trains (Caffe's update rules, test passes, snapshots); this class gives
it pycaffe's face: ``net`` and ``test_nets`` as :class:`~caffe_py.pycaffe.net.Net` views whose
blobs hold what the last pass computed, ``iter``, ``step``, ``solve``, ``snapshot`` and
``restore``. As in Caffe, a parameter's ``diff`` after a step holds the update just applied
(Caffe's ApplyUpdate leaves it there), and a solver with a ``random_seed`` seeds Caffe's
random stream, from which the nets' fillers and Dropout masks are drawn.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import torch

from ..layers.base import RECORD_FILLERS
from ..net import default_options
from ..solver.solver import Solver as CaffePySolver
from ..spec.solver_spec import load_solver
from . import caffe_stream, mode
from .blobs import param_diff, pull_mirrors, push_mirrors
from .errors import missing
from .files import NET_OPTIONS, check_file, prototxt_node
from .net import Net

_CLASSES = {"SGD": "SGDSolver", "Nesterov": "NesterovSolver", "AdaGrad": "AdaGradSolver",
            "RMSProp": "RMSPropSolver", "AdaDelta": "AdaDeltaSolver", "Adam": "AdamSolver"}


class Solver:
    """pycaffe's ``caffe.Solver``: what every solver class has."""

    solver_type: str | None = None
    """The update rule this class applies whatever the file's ``type`` (None: the file's)."""

    def __init__(self, solver_file: str):
        check_file(str(solver_file))
        param = _load(str(solver_file))
        if self.solver_type is not None:
            param = dataclasses.replace(param, type=self.solver_type)
        # Caffe's blobs are C-contiguous; pycaffe's views of them must be too
        param = dataclasses.replace(param, memory_format="CONTIGUOUS")
        if param.random_seed >= 0:  # Solver::Init: Caffe::set_random_seed(random_seed)
            caffe_stream.STREAM.seed(param.random_seed)
        fills: list = []
        with default_options({**NET_OPTIONS, RECORD_FILLERS: fills}):
            self._solver = CaffePySolver(param, device=mode.device())
        self._param = param
        nets = [self._solver.net, *self._solver.test_nets]
        for test_net in self._solver.test_nets:  # Caffe: own weights until the first test
            test_net.unshare()
        self._tests_share = False
        for n in nets:  # Caffe's order: the TRAIN net is set up, then each TEST net
            layers = {id(layer) for layer in n.layers}
            caffe_stream.refill(n, [e for e in fills if id(e[0]) in layers])
        fills.clear()  # the record holds the blobs first made: let shared ones go
        self.net = Net.of_solver(self._solver.net, self)
        self.test_nets = [Net.of_solver(n, self) for n in self._solver.test_nets]
        self._update_diffs = [lp.param for lp in self._solver.net.learnable_params()]
        weakref.finalize(self, self._solver.close)

    @property
    def iter(self) -> int:
        return self._solver.iter

    @property
    def param(self) -> Any:
        return self._param

    @property
    def lr(self) -> float:
        """The learning rate of the next update (SGDSolver's GetLearningRate)."""
        return self._solver.current_rate()

    def step(self, iters: int) -> None:
        """Caffe's Step: ``iters`` iterations (tests, displays and snapshots when due)."""
        iters = int(iters)
        if iters <= 0:
            return
        self._share_if_tested(iters)
        push_mirrors()
        if iters > 1:
            self._solver.step(iters - 1)
        before = [p.detach().to("cpu", torch.float32, copy=True) for p in self._update_diffs]
        self._solver.step(1)
        with torch.no_grad():  # Caffe's ApplyUpdate leaves each update in the diff
            for p, old in zip(self._update_diffs, before, strict=True):
                param_diff(p).copy_(old - p.detach().to("cpu", torch.float32))
        pull_mirrors()

    def _share_if_tested(self, iters: int) -> None:
        """Caffe's Test() shares the TRAIN net's weights with a TEST net before its first
        pass (ShareTrainedLayersWith): share them when one of the next ``iters`` iterations
        tests."""
        if self._tests_share:
            return
        p = self._param
        first = self._solver.iter
        for it in range(first, first + iters):
            if p.test_interval and it % p.test_interval == 0 and (it > 0 or
                                                                  p.test_initialization):
                self.share_tests()
                return

    def share_tests(self) -> None:
        """The TEST nets use the TRAIN net's weights from now on (what Caffe's first test pass
        does, or ``test_net.share_with(solver.net)``)."""
        if not self._tests_share:
            self._tests_share = True
            for test_net in self._solver.test_nets:
                test_net.share_weights_with(self._solver.net)

    def solve(self, resume_file: str | None = None) -> None:
        """Caffe's Solve: train to max_iter (from a solver state when given)."""
        self.share_tests()
        push_mirrors()
        self._solver.solve(resume_file)
        pull_mirrors()

    def snapshot(self) -> None:
        """Write the weights and the solver state of the current iteration."""
        push_mirrors()
        self._solver.snapshot()

    def restore(self, path: str) -> None:
        """Caffe's Restore: the weights, the iteration, the learning-rate step and the
        update history from a solver state (and the weights written with it). The data
        layers read on from where they are, as Caffe's do (``cpy train --snapshot`` also
        resumes their read positions)."""
        check_file(str(path))
        pool = self._solver.pool
        positions = pool.state_dict() if pool is not None else None
        self._solver.restore(str(path))
        if pool is not None and positions is not None:
            pool.load_state_dict(positions)
        pull_mirrors()

    def share_weights(self, net: Net) -> None:
        """Make ``net`` use this solver's TRAIN net weights (pycaffe's share_weights)."""
        net.share_with(self.net)

    def apply_update(self) -> None:
        """Caffe's ApplyUpdate on the gradients in the TRAIN net's diffs."""
        params = self._update_diffs
        for p in params:
            p.grad = param_diff(p).to(p.device).clone()
        self._solver.apply_update()
        pull_mirrors()

    def add_callback(self, on_start: Any, on_gradients_ready: Any) -> None:
        """Callbacks around each iteration, as pycaffe's (called with no argument)."""
        self._solver.callbacks.append(_Callback(on_start, on_gradients_ready))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_solver", "_param", "_update_diffs"):
            raise AttributeError(name)
        raise missing("caffe.Solver", name, [n for n in dir(type(self)) if not n.startswith("_")]
                      + ["net", "test_nets"])


class _Callback:
    def __init__(self, on_start: Any, on_gradients_ready: Any):
        self._start, self._ready = on_start, on_gradients_ready

    def on_start(self, solver: Any) -> None:
        self._start()

    def on_gradient_ready(self, solver: Any) -> None:
        self._ready()


class SGDSolver(Solver):
    solver_type = "SGD"


class NesterovSolver(SGDSolver):
    solver_type = "Nesterov"


class AdaGradSolver(SGDSolver):
    solver_type = "AdaGrad"


class RMSPropSolver(SGDSolver):
    solver_type = "RMSProp"


class AdaDeltaSolver(SGDSolver):
    solver_type = "AdaDelta"


class AdamSolver(SGDSolver):
    solver_type = "Adam"


def get_solver(solver_file: str) -> Solver:
    """The solver the file's ``type`` names (Caffe's SolverRegistry)."""
    check_file(str(solver_file))
    kind = _load(str(solver_file)).type
    return globals()[_CLASSES[kind]](solver_file)


def _load(path: str) -> Any:
    """A solver file: a prototxt whatever its suffix (its paths relative to the current
    directory, as Caffe reads them; its snapshots Caffe's .caffemodel and .solverstate
    unless it says otherwise), or a caffe-py YAML spec."""
    from ..spec.schema import Source, is_set
    from ..spec.solver_spec import parse_solver

    if path.endswith((".yaml", ".yml")):
        return load_solver(path)
    param = parse_solver(prototxt_node(path, "solver"), Source.of(path))
    if not is_set(param, "snapshot_format"):  # Caffe's default: BINARYPROTO
        param.snapshot_format = "caffemodel"
    return param
