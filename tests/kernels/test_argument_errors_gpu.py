"""The CUDA extension's argument errors raise RuntimeErrors whose first line names the numbers and
shapes involved (csrc/common.cuh, ``num`` and ``shape``). On the hosts with torch 2.11 and CUDA
13 a number streamed into a message of the extension crashed the process instead of raising, so
the calls run in a child process: a crash fails the test with the child's exit status rather
than taking the test session down. Skipped without CUDA; run with `pytest -m gpu`."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json
import torch
from caffe_py.kernels import build

ext = build.load()
cuda = dict(device="cuda")
x = torch.ones(2, 3, 4, **cuda)
out = torch.empty_like(x)
g = torch.ones(4, 6, 8, **cuda)
rows = torch.ones(8, 3, **cuda)
calls = {
    "bias_grad C": lambda: ext.bias_grad(g, 0, 8),
    "bias_grad split": lambda: ext.bias_grad(g, 5, 8),
    "prelu C": lambda: ext.prelu_forward(x, torch.ones(3, **cuda), out, 0, 4),
    "prelu split": lambda: ext.prelu_forward(x, torch.ones(3, **cuda), out, 5, 4),
    "bias_act parameter": lambda: ext.bias_act_forward(x, torch.ones(2, **cuda), out, 3, 4, 0,
                                                       0.0),
    "bias_act kind": lambda: ext.bias_act_forward(x, torch.ones(3, **cuda), out, 3, 4, 99, 0.0),
    "act kind": lambda: ext.act_forward(x, out, 99, 0.0),
    "act out shape": lambda: ext.act_forward(x, torch.empty(2, 3, 5, **cuda), 0, 0.0),
    "bn_relu sums": lambda: ext.bn_relu_forward(
        rows, None, None, None, torch.empty_like(rows), torch.zeros(2, **cuda),
        torch.zeros(3, **cuda), torch.zeros(1, **cuda), 1e-5, 0.999, 0.0),
}
said = {}
for name, call in calls.items():
    try:
        call()
        said[name] = None
    except RuntimeError as e:
        said[name] = str(e).splitlines()[0]
print(json.dumps(said))
"""

WANT = {
    "bias_grad C": "bias_grad: C and inner must be >= 1, got 0 and 8",
    "bias_grad split": "bias_grad: g's 192 elements do not split into [outer, 5, 8]",
    "prelu C": "prelu_forward: C and inner must be >= 1, got 0 and 4",
    "prelu split": "prelu_forward: 24 elements do not split into [outer, 5, 4]",
    "bias_act parameter": "bias_act_forward: the parameter must be a contiguous tensor of 3 "
                          "elements, got [2]",
    "bias_act kind": "unknown activation kind 99",
    "act kind": "unknown activation kind 99",
    "act out shape": "out must have x's shape [2, 3, 4] and the same dense memory layout",
    "bn_relu sums": "mean_sum must be a contiguous float tensor of 3 elements, got Float [2]",
}


def test_argument_errors_raise_with_their_numbers():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == WANT
