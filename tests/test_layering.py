"""The arrows between the package's rooms, checked over every import statement and every
attribute access.

A room is a top-level subpackage (``solver/``) or module (``net``) of caffe_py, and each
subpackage of ``io/`` (``io/reader/``) is a room of its own. Every import counts: absolute or
relative, at module level, inside a function or under TYPE_CHECKING. The rules are the
design's (docs/architecture.md): the solver never knows about parallelism; the net knows
neither training nor parallelism; layers are built by the net and know nothing of training;
io is a leaf below them all, its rooms in one order (formats <- db <- decoders <- reader <-
feed); the spec is the schema and imports no torch and no layer; the kernels are a leaf; only
the command line speaks click; and no room imports another room's ``_private`` names or reaches
into another room's objects for their ``_private`` attributes.
"""
from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "caffe_py"

_IO_LEAF = "io is a leaf below the net, the layers, the solver and parallel code: they call it"
IO_ORDER = ("formats", "db", "decoders", "reader", "feed")
"""io's rooms, each importing only those before it (caffe_py/io/README.md)."""

# importer room -> {forbidden room or outside package: why}. A rule of a room holds for the
# rooms nested in it (io's for io/reader/), and forbidding a room forbids those nested in it.
FORBIDDEN = {
    "solver": {"parallel": "the solver plugs parallelism in through callbacks"},
    "net": {
        "solver": "the net is one forward and backward: the solver drives it, not the reverse",
        "parallel": "the net is one replica's: parallel code drives it through the solver",
    },
    "layers": {
        "net": "the net builds and calls the layers, not the reverse",
        "solver": "a layer computes; the solver trains",
    },
    "io": {"net": _IO_LEAF, "layers": _IO_LEAF, "solver": _IO_LEAF, "parallel": _IO_LEAF},
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
for _i, _room in enumerate(IO_ORDER):
    FORBIDDEN[f"io.{_room}"] = {
        f"io.{later}": "io's rooms import only those before them (formats <- db <- decoders "
                       "<- reader <- feed)" for later in IO_ORDER[_i + 1:]}
NESTED = {"io"}  # rooms whose subpackages are rooms of their own
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
    """The rooms of one package tree: name (``io.reader`` for a nested one) -> whether it is a
    subpackage."""

    root: str
    subpackage: dict[str, bool]

    @classmethod
    def of(cls, package: Path) -> _Rooms:
        rooms = {p.stem: False for p in package.glob("*.py") if p.name != "__init__.py"}
        rooms.update({p.parent.name: True for p in package.glob("*/__init__.py")})
        rooms.update({f"{outer}.{p.parent.name}": True for outer in NESTED
                      for p in package.glob(f"{outer}/*/__init__.py")})
        return cls(package.name, rooms)

    def room_of(self, target: str) -> str | None:
        """The room of a dotted path; '__init__' for the package's own names; None outside."""
        parts = target.split(".")
        if parts[0] != self.root:
            return None
        if len(parts) > 2 and f"{parts[1]}.{parts[2]}" in self.subpackage:
            return f"{parts[1]}.{parts[2]}"
        return parts[1] if len(parts) > 1 and parts[1] in self.subpackage else "__init__"

    def depth(self, room: str) -> int:
        """How many parts of a dotted path name the room (the package's own: 1)."""
        return 1 if room == "__init__" else 1 + len(room.split("."))

    def shown(self, room: str | None) -> str:
        if room == "__init__":
            return self.root
        name = str(room).replace(".", "/")
        return f"{name}/" if self.subpackage.get(str(room)) else name


def _why(room: str | None, target: str) -> str | None:
    """The reason ``room`` may not import ``target`` (a room, or an outside package's top)."""
    if room is None:
        return None
    parts = room.split(".")
    for owner in (".".join(parts[:n]) for n in range(len(parts), 0, -1)):
        for forbidden, why in FORBIDDEN.get(owner, {}).items():
            if target == forbidden or target.startswith(forbidden + "."):
                return why
    return None


def _modules(package: Path) -> Iterator[tuple[Path, str, bool, str]]:
    """Each module of the package: path, dotted name, whether a package, shown path."""
    for path in sorted(package.rglob("*.py")):
        module, is_package = _module_name(package, path)
        yield path, module, is_package, path.relative_to(package.parent).as_posix()


def find_violations(package: Path) -> list[Violation]:
    """Every rule broken by an import or an attribute access in the package at ``package``
    (a caffe_py tree)."""
    rooms = _Rooms.of(package)
    found = []
    for path, module, is_package, shown in _modules(package):
        for imp in _imports(path, module, is_package):
            rule = _broken_rule(rooms.room_of(module), imp.target, rooms)
            if rule is not None:
                found.append(Violation(shown, imp.line, rule))
    return sorted(found + _private_reaches(package, rooms),
                  key=lambda v: (v.file, v.line, v.rule))


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
        why = _why(room, top)
        return f"{rooms.shown(room)} imports {top} ({target}): {why}" if why else None
    if target_room == "pycaffe" and room not in PYCAFFE_USERS:
        return f"{rooms.shown(room)} imports pycaffe/ ({target}): pycaffe's interface sits " \
               "over the library, which never imports it"
    if target_room != room:
        why = _why(room, target_room)
        if why:
            return f"{rooms.shown(room)} imports {rooms.shown(target_room)} " \
                   f"({target}): {why}"
        inner = target.split(".")[rooms.depth(target_room):]
        private = [p for p in inner if p.startswith("_") and not p.startswith("__")]
        if private:
            return f"imports {rooms.shown(target_room)}'s private name {private[0]} " \
                   f"({target}): use its public interface"
    return None


# --- private attributes -----------------------------------------------------------------------
def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined_privates(tree: ast.AST) -> set[str]:
    """The private names a module defines: functions, classes, assigned names, class fields
    and its objects' attributes (``self._x = ...``; not ``other._x = ...``, which reaches)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {name for name in names if _is_private(name)}


def _torch_privates() -> set[str]:
    """nn.Module's own private attributes (``_parameters``, the hook registries): the layers
    and the net are modules, and what torch defines on them is torch's, not a room's, even
    where a room happens to use the same name."""
    import torch

    return {n for n in (*dir(torch.nn.Module), *vars(torch.nn.Module())) if _is_private(n)}


def _private_reaches(package: Path, rooms: _Rooms) -> list[Violation]:
    """``x._name`` (x not self or cls) in one room where ``_name`` is defined in another room
    and not in this one: reaching into another room's objects past their interface."""
    parsed = [(shown, rooms.room_of(module), ast.parse(path.read_text(), filename=str(path)))
              for path, module, _, shown in _modules(package)]
    owners: dict[str, set[str | None]] = {}
    for _, room, tree in parsed:
        for name in _defined_privates(tree):
            owners.setdefault(name, set()).add(room)
    external = _torch_privates()
    found = []
    for shown, room, tree in parsed:
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)) or \
                    (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                continue
            others = owners.get(node.attr, set())
            if others and room not in others and node.attr not in external:
                named = ", ".join(sorted(rooms.shown(o) for o in others))
                found.append(Violation(shown, node.lineno, f"reaches {named}'s private "
                                       f"attribute {node.attr} ({ast.unparse(node)}): use its "
                                       "public interface"))
    return found


def test_the_package_keeps_its_layering():
    violations = find_violations(PACKAGE)
    if violations:
        pytest.fail(f"{len(violations)} layering violation(s):\n"
                    + "\n".join(map(str, violations)), pytrace=False)


# --- the check itself, on planted trees -----------------------------------------------------
def _tree(root: Path, files: dict[str, str]) -> Path:
    package = root / "caffe_py"
    for name in ("solver", "parallel", "spec", "layers", "kernels", "io", "commands", "pycaffe",
                 *(f"io/{inner}" for inner in IO_ORDER)):
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
        "io/feed/feeds.py": "import torch\nfrom ..reader import ReaderPool\n"
                            "from ..formats import x\n",
        "io/reader/reader.py": "from ...errors import DataError\nfrom ._queue import _Slot\n",
        "io/formats/datum.py": "from ...spec.net_spec import TransformationParameter\n",
        "layers/data.py": "from ..io.feed import attach_feeds\nfrom ..kernels import build\n",
        "net.py": "from .layers import registry\nfrom .io import feed_of\n",
    }) == []


def test_privates_of_a_room_torch_and_self_are_not_reaches(tmp_path):
    assert _found(tmp_path, {
        "io/reader/reader.py": "class Queue:\n    def __init__(self):\n        self._detached = 0\n"
                              "def start(queue):\n    return queue._detached\n",
        "io/reader/decode.py": "def f(queue):\n    queue._detached = 1\n",  # the same room
        "io/decoders/processes.py": "class P:\n    def f(self):\n        self._buffers = []\n"
                                    "        return self._buffers, cls._x\n",
        "net.py": "def bind(layer):\n    del layer._buffers['w']\n"  # nn.Module's, not io's
                  "    return layer._forward_hooks, torch._foreach_add\n",
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
     "caffe_py/spec/solver_spec.py:1: spec/ imports io/reader/ (caffe_py.io.reader): the spec "
     "loads and validates without reading data"),
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
     "caffe_py/parallel/prefetch.py:1: imports io/reader/'s private name _Stream "
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


@pytest.mark.parametrize("name, text, expected", [
    ("io/feed/feeds.py", "from ...net import Net\n",
     f"caffe_py/io/feed/feeds.py:1: io/feed/ imports net (caffe_py.net.Net): {_IO_LEAF}"),
    ("io/db/db.py", "from ...layers import registry\n",
     f"caffe_py/io/db/db.py:1: io/db/ imports layers/ (caffe_py.layers.registry): {_IO_LEAF}"),
    ("io/reader/reader.py", "def f():\n    from ...solver import Solver\n",
     f"caffe_py/io/reader/reader.py:2: io/reader/ imports solver/ (caffe_py.solver.Solver): "
     f"{_IO_LEAF}"),
    ("io/__init__.py", "import caffe_py.parallel.sync\n",
     f"caffe_py/io/__init__.py:1: io/ imports parallel/ (caffe_py.parallel.sync): {_IO_LEAF}"),
    ("net.py", "from .solver import Solver\n",
     "caffe_py/net.py:1: net imports solver/ (caffe_py.solver.Solver): the net is one forward "
     "and backward: the solver drives it, not the reverse"),
    ("net.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
               "    from .parallel.sync import TreeSync\n",
     "caffe_py/net.py:3: net imports parallel/ (caffe_py.parallel.sync.TreeSync): the net is "
     "one replica's: parallel code drives it through the solver"),
    ("layers/data.py", "from ..net import Net\n",
     "caffe_py/layers/data.py:1: layers/ imports net (caffe_py.net.Net): the net builds and "
     "calls the layers, not the reverse"),
    ("layers/base.py", "import caffe_py.solver.roles\n",
     "caffe_py/layers/base.py:1: layers/ imports solver/ (caffe_py.solver.roles): a layer "
     "computes; the solver trains"),
    ("io/formats/datum.py", "from ..db import open_db\n",
     "caffe_py/io/formats/datum.py:1: io/formats/ imports io/db/ (caffe_py.io.db.open_db): io's "
     "rooms import only those before them (formats <- db <- decoders <- reader <- feed)"),
    ("io/reader/decode.py", "from ..feed.transformer import record_array\n",
     "caffe_py/io/reader/decode.py:1: io/reader/ imports io/feed/ "
     "(caffe_py.io.feed.transformer.record_array): io's rooms import only those before them "
     "(formats <- db <- decoders <- reader <- feed)"),
    ("io/feed/prefetch.py", "from ..reader.reader import _Stream\n",
     "caffe_py/io/feed/prefetch.py:1: imports io/reader/'s private name _Stream "
     "(caffe_py.io.reader.reader._Stream): use its public interface"),
])
def test_a_planted_violation_of_the_new_arrows_is_found(tmp_path, name, text, expected):
    assert _found(tmp_path, {name: text}) == [expected]


@pytest.mark.parametrize("files, expected", [
    ({"io/reader/reader.py": "class Queue:\n    def __init__(self):\n        self._detached = 0\n",
      "io/feed/prefetch.py": "def halt(queue):\n    return queue._detached\n"},
     "caffe_py/io/feed/prefetch.py:2: reaches io/reader/'s private attribute _detached "
     "(queue._detached): use its public interface"),
    ({"layers/data.py": "class Data:\n    _feed = None\n",
      "solver/graphs.py": "def swap(layer, feed):\n    layer._feed = feed\n"},
     "caffe_py/solver/graphs.py:2: reaches layers/'s private attribute _feed (layer._feed): use "
     "its public interface"),
    ({"kernels/build.py": "def _first_error(exc):\n    return exc\n",
      "commands/ext.py": "from ..kernels import build\nbuild._first_error(1)\n"},
     "caffe_py/commands/ext.py:2: reaches kernels/'s private attribute _first_error "
     "(build._first_error): use its public interface"),
    ({"solver/solver.py": "class Solver:\n    _iter = 0\n",
      "parallel/lockstep.py": "def step(solver):\n    del solver.net._iter\n"},
     "caffe_py/parallel/lockstep.py:2: reaches solver/'s private attribute _iter "
     "(solver.net._iter): use its public interface"),
])
def test_a_planted_private_reach_is_found(tmp_path, files, expected):
    assert _found(tmp_path, files) == [expected]


def test_every_violation_is_reported_at_once(tmp_path):
    found = _found(tmp_path, {
        "solver/solver.py": "import click\nfrom ..parallel import sync\n",
        "kernels/fusion.py": "x = 1\nfrom ..layers import base\n",
    })
    assert [f.split(": ")[0] for f in found] == [
        "caffe_py/kernels/fusion.py:2", "caffe_py/solver/solver.py:1",
        "caffe_py/solver/solver.py:2"]
