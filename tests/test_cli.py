"""The command table: every command of every module is reachable, and nothing else is."""
from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from caffe_py.cli import COMMANDS, cli

ROOT = Path(__file__).resolve().parent.parent


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


EXIT = """
import atexit, sys, threading
import torch
from caffe_py.cli import exit_now
atexit.register(lambda: open(sys.argv[1], "w").write("handler ran"))
if sys.argv[2] == "thread":  # a non-daemon thread still running: the usual exit, after it
    threading.Thread(target=lambda: threading.Event().wait(0.3)).start()
print("no newline", end="")
exit_now(3)
"""


def test_the_fast_exit_runs_atexit_handlers_flushes_and_keeps_the_status(tmp_path):
    for how in ("alone", "thread"):
        mark = tmp_path / f"{how}.txt"
        done = subprocess.run([sys.executable, "-c", EXIT, str(mark), how], capture_output=True,
                              text=True, timeout=60)
        assert (done.returncode, done.stdout, mark.read_text()) == (3, "no newline",
                                                                    "handler ran"), how


def test_cpy_exits_with_each_commands_status(tmp_path):
    runs = {("--version",): 0, (): 1, ("bogus",): 1,
            ("train", "--solver", str(tmp_path / "none.yaml")): 1}
    for args, status in runs.items():
        done = subprocess.run([sys.executable, str(ROOT / "cli.py"), *args],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == status, (args, done.stderr)
        if args == ():  # the help, its lines as they are
            assert done.stderr.startswith("Usage: cpy [OPTIONS] COMMAND [ARGS]...\n\n")
    assert "none.yaml: file not found" in done.stderr


def test_a_usage_error_is_one_line_naming_the_help():
    """click's usage errors print the usage, a hint and a blank line before the error; cpy's
    are one line, as every other error."""
    cases = {("db-info",): "Error: Missing argument 'DB' (see 'cpy db-info --help')",
             ("train", "--bogus"): "Error: No such option '--bogus'. Did you mean '--gpus'? "
                                   "(see 'cpy train --help')",
             ("bogus",): "Error: No such command 'bogus' (see 'cpy --help')",
             ("convert", "imageset", "--seed", "-1", "r/", "l", "db"):
                 "Error: Invalid value for '--seed': -1 is not in the range 0<=x<=4294967295 "
                 "(see 'cpy convert imageset --help')"}
    for args, line in cases.items():
        done = subprocess.run([sys.executable, str(ROOT / "cli.py"), *args],
                              capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stderr) == (1, line + "\n"), args
