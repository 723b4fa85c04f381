"""Loading and validating specs needs neither torch nor the layer library: a fresh process
imports every caffe_py.spec module, loads configs/mnist.yaml and its net, and checks what is
loaded."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import pkgutil, sys
import caffe_py.spec
for info in pkgutil.walk_packages(caffe_py.spec.__path__, "caffe_py.spec."):
    __import__(info.name)
from caffe_py.spec.solver_spec import load_solver
param = load_solver("configs/mnist.yaml")
train, _ = param.train_net_spec()
tests = param.test_net_specs()
assert [lp.name for lp in train.layer][:2] == ["mnist", "mnist"], train.layer
assert len(tests) == 1
heavy = ("torch", "caffe_py.layers", "caffe_py.net", "caffe_py.kernels", "caffe_py.io",
         "caffe_py.solver", "caffe_py.parallel")
print(sorted(m for m in sys.modules if m.split(".")[0] == "torch" or m.startswith(heavy)))
"""


def test_spec_validation_imports_no_torch_and_no_layer():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    result = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"
