"""Write SSD's published VGG16 nets with the fork's own generator: examples/ssd/ssd_pascal.py
(SSD300 on VOC0712) and ssd_pascal_zf.py (the ZF variant) of weiliu89/caffe branch ssd, run
as they are except that the training job is not started, in a scratch Caffe root holding the
files they check for. Their train, test, deploy and solver prototxts go to
tests/fixtures/prototxts/ssd/<name>/ (the corpus, BSD-2-Clause as the fork).

    SSD_GIT=/path/to/weiliu89/caffe PYTHONPATH=/opt/ssd/python \\
        python tools/oracles/ssd/make_ssd_prototxts.py

The scripts and the fork's python/caffe/model_libs.py are Python 2: they are run through
lib2to3 first, with Python 2's division of integers kept (``/`` of two ints floors), and
model_libs's ``assert len > 0`` (always true in Python 2) dropped. HOME
is set to /home/ssd while they run (they write it into the test net's result folder), so the
files do not depend on who ran them.
"""
from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

COMMIT = "4817bf8b4200b35ada8ed0dc378dceaf38c539e4"
ROOT = Path(__file__).resolve().parents[3]
OUT = ROOT / "tests" / "fixtures" / "prototxts" / "ssd"
SCRIPTS = {"ssd_pascal.py": ("VGGNet/VOC0712/SSD_300x300", "SSD_300x300"),
           "ssd_pascal_zf.py": ("ZFNet/VOC0712/SSD_300x300", "SSD_ZF_300x300")}


def show(git: str, path: str) -> bytes:
    return subprocess.run(["git", "--git-dir", git, "show", f"{COMMIT}:{path}"], check=True,
                          capture_output=True).stdout


def _py2div(a, b):
    """Python 2's ``a / b``: floor division of two ints."""
    return a // b if isinstance(a, int) and isinstance(b, int) else a / b


class _Py2Division(ast.NodeTransformer):
    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Div):
            return ast.copy_location(ast.Call(ast.Name("_py2div", ast.Load()),
                                              [node.left, node.right], []), node)
        return node


def compiled(source: str, name: str):
    """Python 2 source compiled as Python 3 (lib2to3, then the division rule)."""
    tree = _Py2Division().visit(ast.parse(python3(source)))
    return compile(ast.fix_missing_locations(tree), name, "exec")


def python3(source: str) -> str:
    """Python 2 source as lib2to3 rewrites it."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from lib2to3 import refactor

    fixers = refactor.get_fixers_from_package("lib2to3.fixes")
    tool = refactor.RefactoringTool(fixers)
    return str(tool.refactor_string(source, "<fork>"))


def install_model_libs(git: str) -> None:
    """The fork's caffe.model_libs, in Python 3, as the scripts import it."""
    import types

    import caffe

    source = show(git, "python/caffe/model_libs.py").decode()
    module = types.ModuleType("caffe.model_libs")
    module.__dict__["_py2div"] = _py2div
    exec(compiled(source.replace("assert len > 0", "pass"), "model_libs.py"), module.__dict__)
    sys.modules["caffe.model_libs"] = module
    caffe.model_libs = module


def main() -> None:
    git = os.environ["SSD_GIT"]
    install_model_libs(git)
    os.environ["HOME"] = "/home/ssd"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for folder in ("examples/VOC0712/VOC0712_trainval_lmdb",
                       "examples/VOC0712/VOC0712_test_lmdb", "data/VOC0712"):
            (root / folder).mkdir(parents=True)
        for name in ("labelmap_voc.prototxt", "test_name_size.txt"):
            (root / "data/VOC0712" / name).write_bytes(
                show(git, f"data/VOC0712/{name}") if name.endswith(".prototxt") else b"")
        for model in ("VGGNet/VGG_ILSVRC_16_layers_fc_reduced.caffemodel",
                      "ZFNet/ZF_conv_reduced.caffemodel"):
            (root / "models" / model).parent.mkdir(parents=True, exist_ok=True)
            (root / "models" / model).write_bytes(b"")
        cwd = os.getcwd()
        os.chdir(root)
        try:
            for script, (folder, name) in SCRIPTS.items():
                text = show(git, f"examples/ssd/{script}").decode()
                (root / script).write_text(text)  # it copies itself into its job folder
                code = compiled(text.replace("run_soon = True", "run_soon = False"), script)
                exec(code, {"__name__": "__main__", "__file__": str(root / script),
                            "_py2div": _py2div})
                target = OUT / name
                target.mkdir(parents=True, exist_ok=True)
                for f in ("train.prototxt", "test.prototxt", "deploy.prototxt",
                          "solver.prototxt"):
                    shutil.copy(root / "models" / folder / f, target / f)
                print(f"wrote {target}")
        finally:
            os.chdir(cwd)
    del sys.modules["caffe"]


if __name__ == "__main__":
    main()
