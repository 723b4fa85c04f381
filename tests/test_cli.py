"""The command table: every command of every module is reachable, and nothing else is."""
from __future__ import annotations

import importlib
import subprocess
import sys

from click.testing import CliRunner

from caffe_py.cli import COMMANDS, cli


def test_every_command_module_is_listed_and_every_listed_command_exists():
    modules = sorted(set(COMMANDS.values()))
    defined = {c.name: m for m in modules
               for c in importlib.import_module(f"caffe_py.commands.{m}").COMMANDS}
    assert defined == COMMANDS


def test_help_lists_the_commands_in_order():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    listed = [line.split()[0] for line in result.output.split("Commands:")[1].splitlines()
              if line.strip()]
    assert listed == list(COMMANDS)


def test_a_command_that_needs_no_torch_does_not_import_it(tmp_path):
    code = ("import sys; from caffe_py.cli import cli; "
            "cli(['db-info', '--help'], standalone_mode=False); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip().splitlines()[-1] == "False"
