"""The arrows between the package's rooms, checked over every import statement.

A room is a top-level subpackage (``solver/``) or module (``net``) of caffe_py. Every import
counts: absolute or relative, at module level, inside a function or under TYPE_CHECKING. The
rules are the design's (docs/architecture.md): the solver never knows about parallelism, the
spec is the schema and imports no torch and no layer, the kernels are a leaf, only the
command line speaks click, and no room imports another room's ``_private`` names.
"""
from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "caffe_py"

# importer room -> {forbidden room or outside package: why}
FORBIDDEN = {
    "solver": {"parallel": "the solver plugs parallelism in through callbacks"},
    "spec": {
        "layers": "the spec is the whole schema; layers take their messages from it",
        "net": "the spec loads and validates without building anything",
        "io": "the spec loads and validates without reading data",
        "kernels": "the spec loads and validates without building anything",
        "torch": "loading and validating a spec stays free of torch",
    },
    "kernels": {
        "layers": "the kernels are a leaf: layers call them, not the reverse",
        "net": "the kernels are a leaf: the net calls them, not the reverse",
    },
}
CLICK_ROOMS = {"commands", "cli"}  # the command line; the library never calls click
PYCAFFE_USERS = {"pycaffe", "commands", "cli"}
"""pycaffe/ is pycaffe's interface over the library: only it and the command line use it."""


@dataclass(frozen=True)
class Violation:
    file: str
    line: int
    rule: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.rule}"


@dataclass(frozen=True)
class _Import:
    """One imported name, resolved: ``target`` is a dotted path (a module, or a module's name)."""

    line: int
    target: str


@dataclass(frozen=True)
class _Rooms:
    """The rooms of one package tree: name -> whether it is a subpackage."""

    root: str
    subpackage: dict[str, bool]

    @classmethod
    def of(cls, package: Path) -> _Rooms:
        rooms = {p.stem: False for p in package.glob("*.py") if p.name != "__init__.py"}
        rooms.update({p.parent.name: True for p in package.glob("*/__init__.py")})
        return cls(package.name, rooms)

    def room_of(self, target: str) -> str | None:
        """The room of a dotted path; '__init__' for the package's own names; None outside."""
        parts = target.split(".")
        if parts[0] != self.root:
            return None
        return parts[1] if len(parts) > 1 and parts[1] in self.subpackage else "__init__"

    def shown(self, room: str | None) -> str:
        if room == "__init__":
            return self.root
        return f"{room}/" if self.subpackage.get(str(room)) else str(room)


def find_violations(package: Path) -> list[Violation]:
    """Every rule broken by an import in the package at ``package`` (a caffe_py tree)."""
    rooms = _Rooms.of(package)
    found = []
    for path in sorted(package.rglob("*.py")):
        module, is_package = _module_name(package, path)
        shown = path.relative_to(package.parent).as_posix()
        for imp in _imports(path, module, is_package):
            rule = _broken_rule(rooms.room_of(module), imp.target, rooms)
            if rule is not None:
                found.append(Violation(shown, imp.line, rule))
    return found


def _module_name(package: Path, path: Path) -> tuple[str, bool]:
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _imports(path: Path, module: str, is_package: bool) -> list[_Import]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [_Import(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(node, module, is_package)
            if base is not None:
                out += [_Import(node.lineno, base if alias.name == "*" else f"{base}.{alias.name}")
                        for alias in node.names]
    return out


def _resolve_from(node: ast.ImportFrom, module: str, is_package: bool) -> str | None:
    """The absolute module of ``from <...> import``; None when it climbs above the package."""
    if node.level == 0:
        return node.module
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if node.level - 1 >= len(parts):
        return None
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _broken_rule(room: str | None, target: str, rooms: _Rooms) -> str | None:
    target_room = rooms.room_of(target)
    if target_room is None:  # outside the package: torch, click, ...
        top = target.split(".")[0]
        if top == "click" and room not in CLICK_ROOMS:
            return f"imports click ({target}): only commands/ and cli.py may"
        why = FORBIDDEN.get(room or "", {}).get(top)
        return f"{room}/ imports {top} ({target}): {why}" if why else None
    if target_room == "pycaffe" and room not in PYCAFFE_USERS:
        return f"{rooms.shown(room)} imports pycaffe/ ({target}): pycaffe's interface sits " \
               "over the library, which never imports it"
    if target_room != room:
        why = FORBIDDEN.get(room or "", {}).get(target_room)
        if why:
            return f"{rooms.shown(room)} imports {rooms.shown(target_room)} " \
                   f"({target}): {why}"
        inner = target.split(".")[1 if target_room == "__init__" else 2:]
        private = [p for p in inner if p.startswith("_") and not p.startswith("__")]
        if private:
            return f"imports {rooms.shown(target_room)}'s private name {private[0]} " \
                   f"({target}): use its public interface"
    return None


def test_the_package_keeps_its_layering():
    violations = find_violations(PACKAGE)
    if violations:
        pytest.fail(f"{len(violations)} layering violation(s):\n"
                    + "\n".join(map(str, violations)), pytrace=False)


# --- the check itself, on planted trees -----------------------------------------------------
def _tree(root: Path, files: dict[str, str]) -> Path:
    package = root / "caffe_py"
    for name in ("solver", "parallel", "spec", "layers", "kernels", "io", "commands", "pycaffe"):
        (package / name).mkdir(parents=True, exist_ok=True)
        (package / name / "__init__.py").write_text("")
    for name in ("__init__.py", "net.py", "cli.py", "errors.py"):
        (package / name).write_text("")
    for name, text in files.items():
        (package / name).write_text(textwrap.dedent(text))
    return package


def _found(tmp_path: Path, files: dict[str, str]) -> list[str]:
    return [str(v) for v in find_violations(_tree(tmp_path, files))]


def test_a_clean_tree_passes(tmp_path):
    assert _found(tmp_path, {
        "solver/solver.py": "import torch\nfrom ..net import Net\nfrom . import rules\n",
        "parallel/sync.py": "from ..solver import Solver\nfrom ..solver.solver import Step\n",
        "spec/schema.py": "import yaml\nfrom ..errors import SpecError\nfrom ._marks import _x\n",
        "kernels/build.py": "import torch\nfrom ..errors import CaffePyError\n",
        "commands/net.py": "import click\nfrom ..net import Net\n",
        "commands/pycaffe.py": "from ..pycaffe.runner import run_script\n",
        "pycaffe/net.py": "from ..net import Net\nfrom ..solver import Solver\n",
        "cli.py": "import click\nfrom . import __version__\n",
    }) == []


@pytest.mark.parametrize("name, text, expected", [
    ("solver/solver.py", "from ..parallel.sync import TreeSync\n",
     "caffe_py/solver/solver.py:1: solver/ imports parallel/ (caffe_py.parallel.sync.TreeSync): "
     "the solver plugs parallelism in through callbacks"),
    ("solver/rules.py", "import caffe_py.parallel\n",
     "caffe_py/solver/rules.py:1: solver/ imports parallel/ (caffe_py.parallel): the solver "
     "plugs parallelism in through callbacks"),
    ("solver/solver.py", "def f():\n    from .. import parallel\n",
     "caffe_py/solver/solver.py:2: solver/ imports parallel/ (caffe_py.parallel): the solver "
     "plugs parallelism in through callbacks"),
    ("spec/net_spec.py", "def f():\n    from ..layers import registry\n",
     "caffe_py/spec/net_spec.py:2: spec/ imports layers/ (caffe_py.layers.registry): the spec "
     "is the whole schema; layers take their messages from it"),
    ("spec/schema.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n",
     "caffe_py/spec/schema.py:3: spec/ imports torch (torch): loading and validating a spec "
     "stays free of torch"),
    ("spec/__init__.py", "from torch import nn\n",
     "caffe_py/spec/__init__.py:1: spec/ imports torch (torch.nn): loading and validating a spec "
     "stays free of torch"),
    ("spec/solver_spec.py", "from caffe_py.net import Net\n",
     "caffe_py/spec/solver_spec.py:1: spec/ imports net (caffe_py.net.Net): the spec loads and "
     "validates without building anything"),
    ("spec/solver_spec.py", "from ..io import reader\n",
     "caffe_py/spec/solver_spec.py:1: spec/ imports io/ (caffe_py.io.reader): the spec loads "
     "and validates without reading data"),
    ("spec/solver_spec.py", "from ..kernels import available\n",
     "caffe_py/spec/solver_spec.py:1: spec/ imports kernels/ (caffe_py.kernels.available): the "
     "spec loads and validates without building anything"),
    ("kernels/fusion.py", "from ..layers.fusion import first_user\n",
     "caffe_py/kernels/fusion.py:1: kernels/ imports layers/ (caffe_py.layers.fusion.first_user): "
     "the kernels are a leaf: layers call them, not the reverse"),
    ("kernels/fusion.py", "from .. import net\n",
     "caffe_py/kernels/fusion.py:1: kernels/ imports net (caffe_py.net): the kernels are a "
     "leaf: the net calls them, not the reverse"),
    ("solver/solver.py", "import click\n",
     "caffe_py/solver/solver.py:1: imports click (click): only commands/ and cli.py may"),
    ("errors.py", "from click import ClickException\n",
     "caffe_py/errors.py:1: imports click (click.ClickException): only commands/ and cli.py may"),
    ("parallel/prefetch.py", "from ..io.reader import _Stream\n",
     "caffe_py/parallel/prefetch.py:1: imports io/'s private name _Stream "
     "(caffe_py.io.reader._Stream): use its public interface"),
    ("commands/train.py", "import caffe_py.solver._steps\n",
     "caffe_py/commands/train.py:1: imports solver/'s private name _steps "
     "(caffe_py.solver._steps): use its public interface"),
    ("commands/net.py", "from .. import _helpers\n",
     "caffe_py/commands/net.py:1: imports caffe_py's private name _helpers "
     "(caffe_py._helpers): use its public interface"),
    ("solver/solver.py", "from ..pycaffe import Net\n",
     "caffe_py/solver/solver.py:1: solver/ imports pycaffe/ (caffe_py.pycaffe.Net): pycaffe's "
     "interface sits over the library, which never imports it"),
    ("net.py", "from .errors import _message\n",
     "caffe_py/net.py:1: imports errors's private name _message (caffe_py.errors._message): "
     "use its public interface"),
])
def test_a_planted_violation_is_found(tmp_path, name, text, expected):
    assert _found(tmp_path, {name: text}) == [expected]


def test_every_violation_is_reported_at_once(tmp_path):
    found = _found(tmp_path, {
        "solver/solver.py": "import click\nfrom ..parallel import sync\n",
        "kernels/fusion.py": "x = 1\nfrom ..layers import base\n",
    })
    assert [f.split(": ")[0] for f in found] == [
        "caffe_py/kernels/fusion.py:2", "caffe_py/solver/solver.py:1",
        "caffe_py/solver/solver.py:2"]
