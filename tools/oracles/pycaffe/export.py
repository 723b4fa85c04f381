"""Export BVLC Caffe's example notebooks and scripts to the Python 3 scripts in caffe_tree/.

    python tools/oracles/pycaffe/export.py /opt/caffe-src/caffe

reads, from a BVLC Caffe 1.0 checkout (Debian's `caffe` source package, the code of BVLC
master 9b89154), the four notebooks and the files they and two python/ scripts need, and
writes them under caffe_tree/ in Caffe's own layout (examples/, python/). A notebook becomes
a script the way nbconvert's script exporter makes one, made Python 3:

1. its code cells in order, each after a ``# In[n]:`` line;
2. IPython syntax as plain Python: ``%matplotlib inline`` and ``%%time`` become comments (the
   scripts draw off-screen and are not timed), ``%timeit STMT`` runs STMT once, a shell
   escape ``!cmd`` (``$name`` expanded from Python variables, as IPython does) runs through
   ``os.system``;
3. a cell whose last statement is an expression (the value the notebook shows as Out[n])
   prints its repr when it is not None, unless the line ends with ';' (which hides it in
   the notebook too);
4. 2to3 with its default fixers (print statements, dict.iteritems, zip/map as lists...);
5. the edits of PORT below, each a Python 2 or old-library behaviour 2to3 leaves alone (an
   int division the code indexes with, numpy's removed np.int, SciPy's removed
   scipy.misc.imresize, for which Pillow's bilinear resize is what imresize called).

Nothing else changes: the data and weights the examples download are made by prep.py, which
also applies the few documented substitutions (smaller data, fewer iterations) to a copy.
"""
from __future__ import annotations

import ast
import json
import re
import shutil
import sys
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
TREE = HERE / "caffe_tree"

NOTEBOOKS = {
    "examples/00-classification.ipynb": "examples/00-classification.py",
    "examples/01-learning-lenet.ipynb": "examples/01-learning-lenet.py",
    "examples/net_surgery.ipynb": "examples/net_surgery.py",
    "examples/pascal-multilabel-with-datalayer.ipynb":
        "examples/pascal-multilabel-with-datalayer.py",
}
SCRIPTS = {  # Python files taken as they are, or (Python 2) through 2to3; then PORT
    "python/classify.py": "python/classify.py",
    "python/draw_net.py": "python/draw_net.py",
    "examples/pycaffe/tools.py": "examples/pycaffe/tools.py",
    "examples/pycaffe/layers/pascal_multilabel_datalayers.py":
        "examples/pycaffe/layers/pascal_multilabel_datalayers.py",
}
DATA = [  # files of the tree the scripts read, copied unchanged
    "examples/mnist/lenet_auto_solver.prototxt",
    "examples/mnist/lenet_train_test.prototxt",
    "examples/net_surgery/conv.prototxt",
    "LICENSE",
]

PORT = {
    "examples/01-learning-lenet.py": [
        ("test_interval = niter / 10",
         "test_interval = niter // 10",
         "Python 2's int division: test_acc is indexed with it // test_interval"),
    ],
    "examples/pascal-multilabel-with-datalayer.py": [
        ("gtlist = solver.net.blobs['label'].data[image_index, ...].astype(np.int)",
         "gtlist = solver.net.blobs['label'].data[image_index, ...].astype(int)",
         "np.int was removed from numpy (1.24)"),
        ("gtlist = test_net.blobs['label'].data[image_index, ...].astype(np.int)",
         "gtlist = test_net.blobs['label'].data[image_index, ...].astype(int)",
         "np.int was removed from numpy (1.24), here too"),
        ("check_baseline_accuracy(solver.test_nets[0], 5823/128)",
         "check_baseline_accuracy(solver.test_nets[0], 5823//128)",
         "Python 2's int division: the count of batches is a range() bound"),
    ],
    "examples/pycaffe/layers/pascal_multilabel_datalayers.py": [
        ("im = scipy.misc.imresize(im, self.im_shape)  # resize",
         "im = np.asarray(Image.fromarray(im).resize(\n"
         "            (self.im_shape[1], self.im_shape[0]), Image.BILINEAR))  # resize",
         "scipy.misc.imresize, removed from SciPy (1.3), resized a uint8 image with Pillow's "
         "bilinear filter: that call"),
    ],
}


def shell(cmd: str) -> str:
    """A shell escape as Python: IPython's $name / {expr} expansion, then os.system."""
    parts = re.split(r"(\$\w+|\{[^}]+\})", cmd)
    pieces = []
    for part in parts:
        if part.startswith("$"):
            pieces.append(f"{{{part[1:]}}}")
        elif part.startswith("{"):
            pieces.append(part)
        else:
            pieces.append(part.replace("{", "{{").replace("}", "}}"))
    expanded = "".join(pieces)
    literal = repr(expanded)
    return f"__import__('os').system(f{literal})" if "{" in cmd or "$" in cmd else \
        f"__import__('os').system({repr(cmd)})"


def cell_code(source: str) -> str:
    """One notebook cell as Python 2 source with IPython's syntax made plain Python."""
    lines = source.split("\n")
    out = []
    if lines and lines[0].startswith("%%"):
        out.append(f"# {lines[0]}  (a cell magic of the notebook)")
        lines = lines[1:]
    for line in lines:
        stripped = line.lstrip()
        indent = line[:len(line) - len(stripped)]
        if stripped.startswith("!"):
            out.append(indent + shell(stripped[1:]))
        elif stripped.startswith("%timeit"):
            out.append(indent + stripped[len("%timeit"):].strip() + "  # %timeit: run once")
        elif stripped.startswith("%"):
            out.append(f"{indent}# {stripped}")
        else:
            out.append(line)
    return "\n".join(out)


def show_last(code: str) -> str:
    """Print the value of the cell's last statement when it is an expression other than a
    print() call and not None, as the notebook shows it as Out[n]."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    if not tree.body or not isinstance(tree.body[-1], ast.Expr):
        return code
    last = tree.body[-1]
    value = last.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and \
            value.func.id == "print":
        return code
    if ast.get_source_segment(code, value).startswith("__import__('os').system("):
        return code  # a shell escape shows its output, not a value
    lines = code.split("\n")
    after = lines[last.end_lineno - 1][last.end_col_offset:]
    if after.lstrip().startswith(";"):  # a trailing ';' hides the value in the notebook
        return code
    segment = ast.get_source_segment(code, last)
    head = "\n".join(lines[:last.lineno - 1] + [lines[last.lineno - 1][:last.col_offset]])
    tail = after + "\n" + "\n".join(lines[last.end_lineno:])
    shown = ("_out = " + segment + tail.split("\n")[0]
             + "\nif _out is not None:  # Out[]: the value the notebook shows"
             + "\n    print(repr(_out))")
    rest = "\n".join(tail.split("\n")[1:])
    return head + shown + ("\n" + rest if rest.strip() else "")


def to_python3(code: str, name: str) -> str:
    """2to3 with its default fixers."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from lib2to3 import refactor

        tool = refactor.RefactoringTool(refactor.get_fixers_from_package("lib2to3.fixes"))
        return str(tool.refactor_string(code + ("\n" if not code.endswith("\n") else ""),
                                        name))


def port(code: str, target: str) -> str:
    for old, new, _why in PORT.get(target, []):
        if code.count(old) != 1:
            raise SystemExit(f"{target}: the port edit {old!r} matches {code.count(old)} times")
        code = code.replace(old, new)
    return code


def header(source: str, target: str, notebook: bool) -> str:
    notes = [f"# Exported from BVLC Caffe 1.0's {source} (the code of BVLC master 9b89154) by",
             "# tools/oracles/pycaffe/export.py: "
             + ("its code cells as a Python 3 script" if notebook else "made Python 3")
             + " (see export.py for the rules).",
             "# BVLC Caffe is BSD-2-Clause licensed: see LICENSE at the top of this tree."]
    for _old, _new, why in PORT.get(target, []):
        notes.append(f"# Port edit: {why}.")
    return "\n".join(notes) + "\n"


def export_notebook(caffe: Path, source: str, target: str) -> str:
    cells = json.loads((caffe / source).read_text())["cells"]
    chunks = []
    number = 0
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        number += 1
        code = cell_code("".join(cell["source"]))
        code = show_last(to_python3(code, source))
        chunks.append(f"# In[{number}]:\n\n{code.rstrip()}\n")
    body = "\n\n".join(chunks)
    return header(source, target, True) + "\n" + port(body, target)


def main() -> None:
    caffe = Path(sys.argv[1])
    if TREE.exists():
        shutil.rmtree(TREE)
    for source, target in NOTEBOOKS.items():
        out = TREE / target
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(export_notebook(caffe, source, target))
    for source, target in SCRIPTS.items():
        text = (caffe / source).read_text()
        try:  # Python 3 already: only the port edits, if any
            ast.parse(text)
            converted = port(text, target)
        except SyntaxError:
            converted = port(to_python3(text, source), target)
        out = TREE / target
        out.parent.mkdir(parents=True, exist_ok=True)
        note = header(source, target, False) if converted != text else \
            f"# From BVLC Caffe 1.0's {source} (the code of BVLC master 9b89154), " \
            "unchanged.\n# BVLC Caffe is BSD-2-Clause licensed: see LICENSE at the top of " \
            "this tree.\n"
        lines = converted.split("\n")
        if lines[0].startswith("#!"):  # keep the shebang first
            out.write_text(lines[0] + "\n" + note + "\n".join(lines[1:]))
        else:
            out.write_text(note + converted)
    for source in DATA:
        out = TREE / source
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(caffe / source, out)
    print(f"wrote {TREE}")


if __name__ == "__main__":
    main()
