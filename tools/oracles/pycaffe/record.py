"""Run a pycaffe script and record what it shows: ``record.py OUT SCRIPT [ARGS...]``.

Run it with the pycaffe under test: ``PYTHONPATH=/opt/caffe/python python record.py ...``
(BVLC's) or ``python -m caffe_py.pycaffe record.py ...`` (caffe-py's). Before the script it
seeds every random stream the examples draw from (Caffe's, Python's, numpy's: the notebooks
seed none of them, so two runs of BVLC's pycaffe would differ); it draws with matplotlib's
off-screen backend and records every array given to imshow, plot and hist and every title
and label text, and the Graphviz source of every pydot graph rendered, into
OUT/plots.npz and OUT/texts.json. What the script prints goes to stdout as usual.

With BVLC's pycaffe only (a CPU-only build, with today's scikit-image), two calls are
adapted, never the script: ``set_mode_gpu`` / ``set_device`` keep the CPU (a CPU-only
Caffe aborts on them), and skimage.io.imread takes io.py's ``as_grey`` as today's
``as_gray`` (scikit-image renamed it in 0.16; BVLC's io.py still passes the old name).
"""
from __future__ import annotations

import json
import os
import random
import runpy
import sys

import numpy as np

SEED = 1701


def main() -> None:
    out, script, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(out, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg")
    import caffe

    if caffe.__name__ == "caffe":  # BVLC's pycaffe
        adapt_bvlc(caffe)
    caffe.set_random_seed(SEED)
    random.seed(SEED)
    np.random.seed(SEED)
    plots: list[tuple[str, np.ndarray]] = []
    texts: list[str] = []
    record_matplotlib(plots, texts)
    record_pydot(texts)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` has it
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.stdout.flush()
        np.savez_compressed(os.path.join(out, "plots.npz"),
                            **{f"{i:03d}_{kind}": a for i, (kind, a) in enumerate(plots)})
        with open(os.path.join(out, "texts.json"), "w") as f:
            json.dump(texts, f, indent=1)


def adapt_bvlc(caffe) -> None:
    caffe.set_mode_gpu = caffe.set_mode_cpu
    caffe.set_device = lambda device: None
    import skimage.io

    imread = skimage.io.imread

    def imread_as_grey(fname, *a, as_grey=None, **kw):
        if as_grey is not None:
            kw["as_gray"] = as_grey
        return imread(fname, *a, **kw)

    skimage.io.imread = imread_as_grey


def _array(value) -> np.ndarray | None:
    try:
        array = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    return array if array.dtype != object and array.size else None


def record_matplotlib(plots, texts) -> None:
    from matplotlib.axes import Axes

    def wrap(name, keep):
        original = getattr(Axes, name)

        def recorded(self, *a, **kw):
            result = original(self, *a, **kw)
            keep(a, kw, result)
            return result
        setattr(Axes, name, recorded)

    def arrays(kind):
        def keep(a, kw, result):
            for value in a:
                if isinstance(value, str):
                    continue
                array = _array(value)
                if array is not None:
                    plots.append((kind, array))
        return keep

    def hist(a, kw, result):
        arrays("hist")(a, kw, result)
        plots.append(("hist_counts", np.asarray(result[0], dtype=np.float64)))

    def text(kind):
        def keep(a, kw, result):
            if a:
                texts.append(f"{kind}: {a[0]}")
        return keep

    wrap("imshow", arrays("imshow"))
    wrap("plot", arrays("plot"))
    wrap("hist", hist)
    for name in ("set_title", "set_xlabel", "set_ylabel"):
        wrap(name, text(name))


def record_pydot(texts) -> None:
    try:
        import pydot
    except ImportError:
        return
    create = pydot.Dot.create

    def recorded(self, *a, **kw):
        texts.append("pydot: " + self.to_string())
        return create(self, *a, **kw)

    pydot.Dot.create = recorded


if __name__ == "__main__":
    main()
