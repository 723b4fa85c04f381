"""The solver spec: Caffe's SolverParameter as a typed message, loaded from YAML.

Field names and defaults are caffe.proto's, so a lenet_solver.prototxt translates line for
line. The nets are named by path (``net``, ``train_net``, ``test_net``) or written inline
(``net_param``, ``train_net_param``, ``test_net_param``, parsed by
:func:`caffe_py.spec.net_spec.parse_net`). Relative paths resolve against the solver file's
directory. :meth:`SolverParameter.check` holds the cross-field rules Caffe enforces with
CHECKs (AdaGrad without momentum, a ``step`` policy with a ``stepsize``, one ``test_iter`` per
test net...), reported at the offending key's line.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import SpecError
from ..fileio import exists, is_dir
from . import yamlio
from .lr_policy import learning_rate
from .net_spec import NetParameter, NetState, merge_states, parse_net
from .schema import Check, Message, Source, field, is_set, location, parse_message

SOLVER_TYPES = ("SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam")
LR_POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")
PRECISIONS = ("FLOAT32", "BF16", "FLOAT16")
MEMORY_FORMATS = ("AUTO", "CONTIGUOUS", "CHANNELS_LAST")
SNAPSHOT_FORMATS = {"pt": None, "caffemodel": None, "BINARYPROTO": 1, "HDF5": 0}
# caffe.proto's old SolverType enum (solver_type) -> the type string (UpgradeSolverType)
SOLVER_TYPE_ENUM = {"SGD": "SGD", "NESTEROV": "Nesterov", "ADAGRAD": "AdaGrad",
                    "RMSPROP": "RMSProp", "ADADELTA": "AdaDelta", "ADAM": "Adam"}

# Which fields each lr policy reads (beyond base_lr); a policy missing one is an error.
_POLICY_NEEDS = {
    "fixed": (),
    "step": ("gamma", "stepsize"),
    "exp": ("gamma",),
    "inv": ("gamma", "power"),
    "multistep": ("gamma", "stepvalue"),
    "poly": ("power",),
    "sigmoid": ("gamma", "stepsize"),
}
_INLINE_NETS = ("net_param", "train_net_param", "test_net_param")
# SolverParameter fields caffe-py accepts but that change nothing, and why (a note when set).
INERT_FIELDS = {
    "debug_info": "Caffe's per-blob debug lines are not printed",
    "snapshot_diff": "no diffs are written into snapshots (nothing reads them back)",
}


@dataclass
class SolverParameter(Message):
    """How to train: the nets, the schedule, the update rule and the snapshots."""

    # --- the nets ------------------------------------------------------------------------
    net: str = field("", "one net spec for TRAIN and TEST (phase rules pick the layers)",
                     path=True)
    net_param: NetParameter | None = field(None, "the net written inline (instead of net)")
    train_net: str = field("", "the TRAIN net spec (instead of net)", path=True)
    train_net_param: NetParameter | None = field(None, "the TRAIN net written inline")
    test_net: list[str] = field([], "TEST net specs, one per test net", path=True)
    test_net_param: list[NetParameter] = field([], "TEST nets written inline")
    train_state: NetState | None = field(None, "level and stages of the TRAIN net")
    test_state: list[NetState] = field([], "level and stages of each TEST net")
    # --- testing ---------------------------------------------------------------------------
    test_iter: list[int] = field([], "batches per test pass, one value per test net", min=1)
    test_interval: int = field(0, "test every this many iterations (0: never)", min=0)
    test_initialization: bool = field(True, "also test before the first iteration")
    test_compute_loss: bool = field(False, "also print each test pass's mean loss "
                                           "('Test loss: ...')")
    eval_type: str = field("classification", "SSD's fork: 'detection' turns the outputs of "
                                             "DetectionEvaluate layers into their mAP",
                           choices=("classification", "detection"))
    ap_version: str = field("Integral", "SSD's fork: how the mAP integrates precision over "
                                        "recall", choices=("11point", "MaxIntegral",
                                                           "Integral"))
    show_per_class_result: bool = field(False, "SSD's fork: also print each class's AP")
    # --- schedule and display --------------------------------------------------------------
    base_lr: float = field(0.0, "the base learning rate", min=0)
    display: int = field(0, "print the loss every this many iterations (0: never)", min=0)
    average_loss: int = field(1, "the displayed loss is the mean of this many iterations",
                              min=1)
    max_iter: int = field(0, "iterations to train", min=0)
    iter_size: int = field(1, "forward/backward passes per update (gradient accumulation)",
                           min=1)
    lr_policy: str = field("fixed", "learning-rate schedule", choices=LR_POLICIES)
    gamma: float = field(0.0, "step/exp/inv/multistep/sigmoid: the rate's factor")
    power: float = field(0.0, "inv/poly: the exponent")
    stepsize: int = field(0, "step: iterations per step; sigmoid: the midpoint", min=0)
    stepvalue: list[int] = field([], "multistep: the iterations where the rate drops", min=0)
    # --- the update ------------------------------------------------------------------------
    type: str = field("SGD", "the update rule", choices=SOLVER_TYPES)
    solver_type: str = field("SGD", "the old enum form of type (SGD, NESTEROV, ADAGRAD, "
                                    "RMSPROP, ADADELTA, ADAM); sets type, as Caffe upgrades it",
                             choices={name: number for number, name in enumerate(SOLVER_TYPE_ENUM)})
    momentum: float = field(0.0, "SGD/Nesterov momentum; AdaDelta decay; Adam beta1",
                            min=0, max=1)
    momentum2: float = field(0.999, "Adam beta2", min=0, max=1)
    rms_decay: float = field(0.99, "RMSProp: decay of the squared-gradient history",
                             min=0, max=1)
    delta: float = field(1e-8, "AdaGrad/RMSProp/AdaDelta/Adam: added to the denominator",
                         min=0)
    weight_decay: float = field(0.0, "regularization strength (times each blob's decay_mult)",
                                min=0)
    regularization_type: str = field("L2", "L2 adds decay*w, L1 adds decay*sign(w)",
                                     choices=("L2", "L1"))
    clip_gradients: float = field(-1.0, "scale gradients down when their global L2 norm "
                                        "exceeds this (< 0: off)")
    # --- snapshots -------------------------------------------------------------------------
    snapshot: int = field(0, "write a snapshot every this many iterations (0: only at the end)",
                          min=0)
    snapshot_prefix: str = field("", "snapshot path prefix (empty: the solver file's name)",
                                 path=True)
    snapshot_after_train: bool = field(True, "write a snapshot when training ends")
    snapshot_format: str = field("pt", "pt: torch.save (loaded with weights_only=True); "
                                       "caffemodel (or BINARYPROTO): Caffe's .caffemodel and "
                                       ".solverstate; HDF5: Caffe's .caffemodel.h5 and "
                                       ".solverstate.h5", choices=SNAPSHOT_FORMATS)
    snapshot_diff: bool = field(False, "accepted, changes nothing: Caffe's debugging option to "
                                       "write the last update into the weights file; no tool "
                                       "reads it back")
    weights: list[str] = field([], "weights files to start from, copied by layer name in "
                                   "order (as cpy train --weights; those come after these)",
                               path=True)
    # --- machine ---------------------------------------------------------------------------
    random_seed: int = field(-1, "seed for fillers, dropout and data order (-1: the clock)")
    solver_mode: str = field("GPU", "CPU or GPU (cpy train --gpus decides when given)",
                             choices={"CPU": 0, "GPU": 1})
    device_id: int = field(0, "the GPU to use when --gpus is not given", min=0)
    debug_info: bool = field(False, "accepted, changes nothing: Caffe's per-blob debug lines "
                                    "(mean |data| and |diff| of every blob each iteration) are "
                                    "not printed")
    layer_wise_reduce: bool = field(True, "several replicas: reduce the gradients bucket by "
                                          "bucket while backward runs (Caffe 1.0's overlap); "
                                          "false: all at once after backward, the plain order "
                                          "(docs/parallel.md)")
    precision: str = field("FLOAT32", "FLOAT32; BF16: forward/backward under bfloat16 "
                                      "autocast, weights and update in float32; FLOAT16: "
                                      "under float16 autocast with dynamic loss scaling (see "
                                      "loss_scale)",
                           choices=PRECISIONS)
    loss_scale: float = field(65536.0, "FLOAT16: the loss scale to start from; the loss is "
                                       "multiplied by it before backward and the gradients "
                                       "divided by it before the update. An iteration whose "
                                       "gradients overflow (inf or NaN) is not applied and "
                                       "halves the scale", min=1e-30)
    loss_scale_window: int = field(2000, "FLOAT16: the scale doubles after this many "
                                         "iterations in a row without an overflow", min=1)
    memory_format: str = field("AUTO", "layout of 4-D weights and activations: CHANNELS_LAST "
                                       "(what cuDNN's fastest convolutions want), CONTIGUOUS "
                                       "(NCHW, Caffe's), or AUTO: CHANNELS_LAST on CPUs and, "
                                       "on CUDA, for nets with a convolution 64 channels "
                                       "wide or more; the numbers are the same",
                               choices=MEMORY_FORMATS)
    # --- data-parallel consistency (docs/parallel.md, "Two levels, two consistency models") --
    model_average_period: int = field(
        0, "the replicas of one host: 0 sums their gradients every iteration (synchronous, "
           "Caffe's); K > 0 lets each replica update its own weights on its own records and "
           "averages the replicas' weights and update history through the tree every K "
           "iterations (local SGD), and before every test, snapshot and the end", min=0)
    host_average_period: int = field(
        0, "between hosts (several processes): 0 has the hosts join every reduction of the "
           "level below synchronously (the gradient every iteration, or each "
           "model_average_period average); K > 0 averages the hosts' weights and history "
           "every K iterations, and before every test, snapshot and the end", min=0)
    host_average_async: bool = field(
        False, "with host_average_period K > 0: start the hosts' exchange and go on "
               "computing; its result is folded in K iterations later as a delta (the "
               "average minus the weights that were sent), so a slow link costs no waiting")

    def validate(self, v: Check) -> None:
        """Caffe's cross-field CHECKs; run by :func:`parse_solver` once inline nets are in."""
        self._check_nets(v)
        self._check_policy(v)
        if self.type in ("AdaGrad", "RMSProp") and self.momentum != 0:
            v.fail("momentum", f"momentum cannot be used with {self.type} "
                               f"(got {self.momentum:g})", "remove momentum or set it to 0")
        if self.type == "AdaDelta" and not is_set(self, "momentum"):
            v.fail("type", "AdaDelta needs momentum (its decay rate)", "add e.g. momentum: 0.95")
        if self.precision == "FLOAT16" and self.model_average_period:
            v.fail("precision", "precision FLOAT16 with model_average_period: each replica "
                                "would scale its loss on its own and the scales drift apart",
                   "use BF16 (no loss scale needed), or model_average_period: 0")
        if self.host_average_async and self.host_average_period == 0:
            v.fail("host_average_async", "host_average_async needs host_average_period > 0 "
                                         "(the iterations an exchange may overlap)",
                   "add e.g. 'host_average_period: 16', or remove host_average_async")

    def _check_nets(self, v: Check) -> None:
        train = [k for k in ("net", "net_param", "train_net", "train_net_param") if is_set(self, k)]
        if not train:
            v.fail(None, "no net is given", "add 'net: <file>' (or net_param, train_net)")
        if len(train) > 1:
            v.fail(train[1], f"{' and '.join(train)} are all set; a solver trains one net",
                   "keep one of them")
        explicit = len(self.test_net) + len(self.test_net_param)
        generic = bool(self.net or self.net_param)
        n_iter = len(self.test_iter)
        if explicit and n_iter != explicit and not (generic and n_iter > explicit):
            key = "test_iter" if n_iter else ("test_net" if self.test_net else "test_net_param")
            v.fail(key, f"{explicit} test net(s) but {n_iter} test_iter value(s)",
                   "give one test_iter per test net")
        if not generic and not explicit and n_iter:
            v.fail("test_iter", "test_iter is given but there is no test net",
                   "add test_net, or use 'net:' for both phases")
        if self.test_state and len(self.test_state) != max(n_iter, explicit):
            v.fail("test_state", f"{len(self.test_state)} test_state value(s) for "
                                 f"{max(n_iter, explicit)} test net(s)",
                   "give one test_state per test net")
        if self.test_interval and not n_iter:
            v.fail("test_interval", "test_interval is set but test_iter is not",
                   "add test_iter (batches per test pass), or remove test_interval")

    def _check_policy(self, v: Check) -> None:
        if not is_set(self, "base_lr"):
            v.fail(None, "base_lr is not set", "add e.g. 'base_lr: 0.01'")
        for key in ("base_lr", "weight_decay", "momentum", "momentum2", "delta", "gamma",
                    "power"):
            if not math.isfinite(getattr(self, key)):   # inf passes a minimum
                v.fail(key, f"{key} is {getattr(self, key)}, not a finite number",
                       "give a finite value")
        for need in _POLICY_NEEDS[self.lr_policy]:
            if not is_set(self, need):
                v.fail("lr_policy", f"lr_policy {self.lr_policy} needs {need}",
                       f"add '{need}: <value>'")
        if self.lr_policy == "step" and self.stepsize <= 0:
            v.fail("stepsize", "lr_policy step needs stepsize > 0", "set stepsize >= 1")
        if self.lr_policy == "poly" and self.max_iter <= 0:
            v.fail("max_iter", "lr_policy poly needs max_iter > 0", "set max_iter")
        if any(b <= a for a, b in zip(self.stepvalue, self.stepvalue[1:], strict=False)):
            v.fail("stepvalue", f"stepvalue must increase, got {self.stepvalue}",
                   "list the iterations in ascending order")
        self._check_rates(v)
        if self.type == "Adam" and (self.momentum >= 1 or self.momentum2 >= 1):
            key = "momentum" if self.momentum >= 1 else "momentum2"
            v.fail(key, f"Adam needs {key} < 1 (its bias correction divides by 1 - "
                        f"{key}^t), got {getattr(self, key):g}",
                   f"use e.g. {key}: {0.9 if key == 'momentum' else 0.999}")

    def _check_rates(self, v: Check) -> None:
        """The policy's rate at the first and the last iteration (each policy is monotone in
        the iteration) must be a finite number: an overflow (step with gamma 1e300) or no real
        value (inv with 1 + gamma * iter below 0) stopped the run at that iteration, after
        the ones before it had trained."""
        if not (is_set(self, "base_lr") and all(is_set(self, n) or n == "stepvalue"
                                                for n in _POLICY_NEEDS[self.lr_policy])):
            return
        for it in sorted({0, max(self.max_iter - 1, 0)}):
            step = len(self.stepvalue) if it else 0
            try:
                rate = learning_rate(self, it, step)[0]
            except (OverflowError, ValueError, ZeroDivisionError):
                rate = math.nan
            if not math.isfinite(rate):
                v.fail("lr_policy", f"lr_policy {self.lr_policy} gives no finite learning rate "
                                    f"at iteration {it} with these gamma, power and stepsize",
                       "check gamma (inv: 1 + gamma * iter must stay > 0; step, exp, multistep: "
                       "gamma^iter must stay finite)")
                return

    def inert_notes(self) -> list[str]:
        """One line per field written in the spec that caffe-py accepts but does not act on."""
        return [f"{key}: {why}; it changes nothing here" for key, why in INERT_FIELDS.items()
                if is_set(self, key)]

    # --- what the solver reads --------------------------------------------------------------
    @property
    def file(self) -> str:
        """The file the spec came from (``<string>`` when built in code)."""
        loc = location(self)
        return loc.file if loc is not None else "<string>"

    def train_net_spec(self) -> tuple[NetParameter, NetState]:
        """The TRAIN net and its state (Caffe's Solver::InitTrainNet)."""
        for inline, path in (("train_net_param", "train_net"), ("net_param", "net")):
            net = getattr(self, inline)
            if net is None and getattr(self, path):
                net = _load_net(getattr(self, path), self, path)
            if net is not None:
                return net, merge_states("TRAIN", net.state, self.train_state)
        raise SpecError("no net is given", file=self.file, fix="add 'net: <file>'")

    def test_net_specs(self) -> list[tuple[NetParameter, NetState]]:
        """The TEST nets in Caffe's order: test_net_param, test_net, then the generic net."""
        nets = list(self.test_net_param)
        nets += [_load_net(p, self, "test_net") for p in self.test_net]
        generic = self.net_param or (_load_net(self.net, self, "net") if self.net else None)
        if generic is not None:
            nets += [generic] * (len(self.test_iter) - len(nets))
        states: Sequence[NetState | None] = self.test_state or [None for _ in nets]
        return [(net, merge_states("TEST", net.state, state))
                for net, state in zip(nets, states, strict=True)]


def parse_solver(node: Any, src: Source) -> SolverParameter:
    """Parse a SolverParameter mapping; inline nets go through the net spec parser."""
    if not isinstance(node, dict):
        raise SpecError("a solver spec is a mapping of SolverParameter fields", file=src.file,
                        line=getattr(node, "line", None))
    if not isinstance(node, yamlio.MarkedDict):
        node = yamlio.MarkedDict(node)
        node.key_lines = {}
    spec = parse_message(SolverParameter, node, src, skip=_INLINE_NETS)
    spec.net_param = _inline(node, "net_param", src)
    spec.train_net_param = _inline(node, "train_net_param", src)
    tests = node.get("test_net_param", [])
    tests = tests if isinstance(tests, list) else [tests]
    spec.test_net_param = [parse_net(t, src, f"test_net_param[{i}]")
                           for i, t in enumerate(tests)]
    if is_set(spec, "solver_type"):  # Caffe's UpgradeSolverType
        if is_set(spec, "type"):
            Check(node, src, "").fail("solver_type", "solver_type (the old enum) and type are "
                                      "both set; Caffe refuses to upgrade that too",
                                      "keep type only")
        spec.type = SOLVER_TYPE_ENUM[spec.solver_type]
    spec.validate(Check(node, src, ""))
    if spec.snapshot_format == "BINARYPROTO":  # Caffe's enum name for the same files
        spec.snapshot_format = "caffemodel"
    _default_prefix(spec, src, str(node.get("snapshot_prefix", "")))
    return spec


def load_solver(path: str | Path) -> SolverParameter:
    """Load and validate a solver spec file."""
    return parse_solver(yamlio.load(path), Source.of(path))


def _inline(node: dict, key: str, src: Source) -> NetParameter | None:
    return parse_net(node[key], src, key) if key in node else None


def _load_net(path: str, spec: SolverParameter, key: str) -> NetParameter:
    from .net_spec import load_net

    if not exists(path):
        loc = location(spec, key)
        raise SpecError(f"net file not found: {path}", file=spec.file,
                        line=loc.line if loc is not None else None, path=key,
                        fix="check the path (relative to the solver file's directory)")
    return load_net(path)


def _default_prefix(spec: SolverParameter, src: Source, written: str) -> None:
    """Caffe 1.0's UpgradeSnapshotPrefixProperty: an empty prefix is the solver file's name
    without extension; a prefix naming a directory gets that name appended."""
    stem = Path(src.file).stem if src.file != "<string>" else "caffe_py"
    if not spec.snapshot_prefix:
        spec.snapshot_prefix = str(src.base_dir / stem)
    elif written.endswith(("/", "\\")) or is_dir(spec.snapshot_prefix):
        spec.snapshot_prefix = str(Path(spec.snapshot_prefix) / stem)


__all__ = ["SolverParameter", "NetState", "parse_solver", "load_solver", "SOLVER_TYPES",
           "LR_POLICIES", "PRECISIONS",
           "MEMORY_FORMATS"]

