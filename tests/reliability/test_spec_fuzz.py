"""The spec fuzzer: random mutations of the shipped specs, through what `cpy net` and
`cpy train` do before the first iteration (load, validate, build). Every outcome is a clean
acceptance or exit 1 with one line on stderr, 'Error: ...'; never another exception, a
traceback or a hang. 200 mutations run in `make test`; `pytest -m long` runs 3,000."""
from __future__ import annotations

import copy
import signal
from collections import Counter
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from caffe_py.cli import cli, printable
from caffe_py.errors import CaffePyError
from caffe_py.options import TrainOptions
from caffe_py.solver.solver import Solver
from caffe_py.spec.solver_spec import load_solver
from caffe_py.train import prepared

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
NET = yaml.safe_load((CONFIGS / "lenet.yaml").read_text())
SOLVER = {**yaml.safe_load((CONFIGS / "mnist.yaml").read_text()), "net": "net.yaml",
          "snapshot_prefix": "snaps/lenet"}
CASE_SECONDS = 20  # a case past this is a hang
# the solver's net: LeNet fed by DummyData (no database), so a solver builds its nets in full
DUMMY_NET = copy.deepcopy(NET)
DUMMY_NET["layer"][:2] = [{"name": "data", "type": "DummyData", "top": ["data", "label"],
                           "dummy_data_param": {"shape": [{"dim": [8, 1, 28, 28]},
                                                          {"dim": [8]}]}}]
OUTCOMES: Counter[str] = Counter()

# the values a mutation writes: wrong types, edge numbers, hostile text
values = st.one_of(
    st.none(), st.booleans(),
    st.integers(min_value=-2**70, max_value=2**70),
    st.sampled_from([0, -1, 1, 2**31, 2**63 - 1, 2**63, 10**12]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["\f", "a\nb", "\x00", "../" * 30, "/dev/zero", "x" * 300, "MAX", "GPU"]),
    st.lists(st.integers(-3, 3), max_size=4),
    st.dictionaries(st.sampled_from(["type", "value", "dim", "min", "max"]),
                    st.integers(-3, 3), max_size=2),
)


def paths(node, prefix=()):
    """Every (path, value) in a loaded YAML tree."""
    yield prefix, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from paths(value, (*prefix, i))


def parent_of(tree, path):
    node = tree
    for key in path[:-1]:
        node = node[key]
    return node


@st.composite
def mutated(draw, base):
    """``base`` with 1-3 mutations: delete, replace, rename a key, duplicate or swap items."""
    tree = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        where = [p for p, _ in paths(tree) if p]
        if not where:
            break
        path = draw(st.sampled_from(where))
        parent, key = parent_of(tree, path), path[-1]
        op = draw(st.sampled_from(["delete", "replace", "rename", "duplicate", "swap"]))
        if op == "delete":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(values)
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=10))] = parent.pop(key)
        elif op == "duplicate" and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))
        elif op == "swap" and isinstance(parent, list) and len(parent) > 1:
            other = draw(st.integers(0, len(parent) - 1))
            parent[key], parent[other] = parent[other], parent[key]
    return tree


class Hang(Exception):
    pass


def bounded(call):
    """``call()`` within CASE_SECONDS, else the case fails as a hang."""
    def alarm(*_):
        raise Hang(f"no outcome within {CASE_SECONDS} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(CASE_SECONDS)
    try:
        return call()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def check_net(tmp_path: Path, net) -> None:
    """`cpy net` on the mutated net: exit 0, or exit 1 with one line 'Error: ...'."""
    (tmp_path / "net.yaml").write_text(yaml.safe_dump(net, sort_keys=False, allow_unicode=True))
    args = ["net", str(tmp_path / "net.yaml"), "--input-shape", "data=1,28,28"]
    result = bounded(lambda: CliRunner().invoke(cli, args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{type(result.exception).__name__}: {result.exception}")
    assert result.exit_code in (0, 1), result.output
    if result.exit_code == 1:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    OUTCOMES["net accepted" if result.exit_code == 0 else "net refused in one line"] += 1


def check_solver(tmp_path: Path, solver) -> None:
    """What `cpy train` does before its first iteration on the mutated solver: load it and
    build the Solver (its nets, data, updater); a CaffePyError must be one line."""
    (tmp_path / "net.yaml").write_text(yaml.safe_dump(DUMMY_NET, sort_keys=False))
    path = tmp_path / "solver.yaml"
    path.write_text(yaml.safe_dump(solver, sort_keys=False, allow_unicode=True))

    def build():
        param = prepared(load_solver(path), TrainOptions())
        with Solver(param, device="cpu"):
            pass

    try:
        bounded(build)
    except CaffePyError as exc:
        assert "\n" not in printable(str(exc)), str(exc)
        OUTCOMES["solver refused in one line"] += 1
    else:
        OUTCOMES["solver accepted"] += 1


FAST = settings(max_examples=150, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))
LONG = settings(FAST, max_examples=3000)


@FAST
@given(net=mutated(NET))
def test_mutated_nets(tmp_path_factory, net):
    check_net(tmp_path_factory.mktemp("net"), net)


@FAST
@given(solver=mutated(SOLVER))
def test_mutated_solvers(tmp_path_factory, solver):
    check_solver(tmp_path_factory.mktemp("solver"), solver)


@pytest.mark.long
@LONG
@given(net=mutated(NET))
def test_many_mutated_nets(tmp_path_factory, net):
    check_net(tmp_path_factory.mktemp("net"), net)


@pytest.mark.long
@LONG
@given(solver=mutated(SOLVER))
def test_many_mutated_solvers(tmp_path_factory, solver):
    check_solver(tmp_path_factory.mktemp("solver"), solver)


@pytest.fixture(scope="module", autouse=True)
def report_outcomes():
    """Print the outcome counts (seen with -s; docs/reliability.md quotes the long run's)."""
    yield
    print(f"\nspec fuzzing outcomes: {dict(sorted(OUTCOMES.items()))}")
