"""Start-up stays light: every `--help` and loading a spec import no torch.

Each case runs in a fresh interpreter, since the test process itself has torch loaded.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from caffe_py.cli import cli

ROOT = Path(__file__).resolve().parents[1]

# Runs cli.py as `python cli.py ARGS` does, then reports which heavy modules got imported.
_RUN_CLI = """
import runpy, sys
sys.argv = ["cli.py", *sys.argv[1:]]
try:
    runpy.run_path("cli.py", run_name="__main__")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print(f"exit={code} torch={'torch' in sys.modules}", file=sys.stderr)
"""

_LOAD_SPEC = """
import sys
from caffe_py.spec.solver_spec import load_solver
param = load_solver("configs/mnist.yaml")
nets = [param.train_net_spec(), *param.test_net_specs()]
print([(net.name, state.phase, len(net.layer)) for net, state in nets])
print(f"torch={'torch' in sys.modules} "
      f"layers={any(m.startswith('caffe_py.layers') for m in sys.modules)}")
"""


def _fresh_python(*args: str) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def _help_invocations() -> list[tuple[str, ...]]:
    """(), then every command, then every subcommand of a group: the --help pages of `cpy`."""
    found: list[tuple[str, ...]] = [()]
    ctx = click.Context(cli)
    for name in cli.list_commands(ctx):
        command = cli.get_command(ctx, name)
        found.append((name,))
        if isinstance(command, click.Group):
            found.extend((name, sub) for sub in command.list_commands(ctx))
    return found


@pytest.mark.parametrize("words", _help_invocations(), ids=lambda w: " ".join(w) or "cpy")
def test_help_imports_no_torch(words):
    result = _fresh_python("-c", _RUN_CLI, *words, "--help")
    assert result.stdout.startswith(f"Usage: cpy {' '.join(words)}".rstrip() + " ")
    assert result.stderr.splitlines()[-1] == "exit=0 torch=False"


def test_the_help_pages_cover_the_convert_subcommands():
    assert {("convert", "idx"), ("convert", "imageset"), ("convert", "cifar"),
            ("net",), ("train",)} <= set(_help_invocations())


def test_loading_a_solver_and_its_nets_imports_no_torch_and_no_layer():
    result = _fresh_python("-c", _LOAD_SPEC)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[('LeNet', 'TRAIN', 11), ('LeNet', 'TEST', 11)]",
                                        "torch=False layers=False"]
