"""Running an unchanged pycaffe script: ``import caffe`` resolved to caffe_py.pycaffe.

:func:`run_script` installs an import hook for this process only (nothing is installed in
site-packages, so a genuine pycaffe elsewhere is never shadowed outside such a process), then
runs the script as ``__main__`` with its own ``sys.argv`` and directory on ``sys.path``, as
``python SCRIPT ARGS`` would. The library's log goes to stderr, as Caffe's glog lines do
(``GLOG_minloglevel`` 1 or more keeps INFO out).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import runpy
import sys
from types import ModuleType
from typing import Any

from ..errors import CaffePyError
from .errors import nearest

MODULES = {
    "caffe": "caffe_py.pycaffe",
    "caffe._caffe": "caffe_py.pycaffe",
    "caffe.pycaffe": "caffe_py.pycaffe.net",
    "caffe.io": "caffe_py.pycaffe.io",
    "caffe.proto": "caffe_py.pycaffe.proto",
    "caffe.proto.caffe_pb2": "caffe_py.pycaffe.proto.caffe_pb2",
    "caffe.net_spec": "caffe_py.pycaffe.net_spec",
    "caffe.draw": "caffe_py.pycaffe.draw",
    "caffe.classifier": "caffe_py.pycaffe.classifier",
    "caffe.detector": "caffe_py.pycaffe.detector",
}
"""pycaffe's modules and the modules of this package that stand for them."""


class PycaffeImportError(CaffePyError, ImportError):
    """A pycaffe module this package does not stand for (e.g. ``caffe.coord_map``)."""


class CaffeAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The import hook: ``caffe`` and ``caffe.<x>`` are caffe_py.pycaffe's modules."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "caffe" and not fullname.startswith("caffe."):
            return None
        if fullname not in MODULES:
            near = nearest(fullname, MODULES)
            raise PycaffeImportError(f"{fullname} is not covered by caffe-py's pycaffe; the "
                                     f"nearest covered module is {near} (docs/pycaffe.md "
                                     "lists what is covered)")
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: Any) -> ModuleType:
        return importlib.import_module(MODULES[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        pass  # the module ran when it was imported under its own name


def install() -> None:
    """Resolve ``import caffe`` to caffe_py.pycaffe in this process (idempotent). The module
    is registered at once, so that a Python layer built before the script's own ``import
    caffe`` gets the whole interface too, not the layers' stand-in."""
    if not any(isinstance(f, CaffeAlias) for f in sys.meta_path):
        sys.meta_path.insert(0, CaffeAlias())
    for name in [n for n in sys.modules if n == "caffe" or n.startswith("caffe.")]:
        if sys.modules[name].__name__ != MODULES.get(name):
            del sys.modules[name]  # a module imported as 'caffe' before (not ours)
    sys.modules["caffe"] = importlib.import_module(MODULES["caffe"])


def log_to_stderr() -> None:
    """The library's log lines on stderr, at glog's GLOG_minloglevel (0: INFO)."""
    logger = logging.getLogger("caffe_py")
    if logger.handlers:
        return
    try:
        level = int(os.environ.get("GLOG_minloglevel", "0"))
    except ValueError:
        level = 0
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel((logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)[
        max(0, min(level, 3))])
    logger.propagate = False


def run_script(script: str, args: list[str]) -> int:
    """Run ``script`` with ``args`` as ``python script args`` would, ``import caffe`` being
    caffe_py.pycaffe; returns the exit status (a caffe-py error: its line, status 1)."""
    if not os.path.isfile(script):
        print(f"Error: {script}: no such file (give the pycaffe script to run)",
              file=sys.stderr)
        return 2
    install()
    log_to_stderr()
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [script, *args]
    here = os.path.dirname(os.path.abspath(script))
    if sys.path:
        sys.path[0] = here
    else:
        sys.path.insert(0, here)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except CaffePyError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0
    return 0


USAGE = ("usage: python -m caffe_py.pycaffe SCRIPT [ARGS...]\n"
         "Run a pycaffe script (or an exported notebook) unchanged, with 'import caffe' "
         "resolved to caffe-py's pycaffe for this process only.")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    return run_script(argv[0], argv[1:])
