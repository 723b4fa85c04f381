"""The `cpy` command line: a click group whose commands live in caffe_py/commands/.

Commands are thin: they parse and check flags, then call the library. A
:class:`~caffe_py.errors.CaffePyError` from the library becomes one line on stderr and exit
status 1, never a traceback. A command's module is imported only when that command runs (or
when help lists them), so `cpy convert` does not pay for importing torch.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import click

from . import configs_dir, start_load
from .commands.output import log_user_error, logging_to_console
from .errors import CaffePyError, device_fault
from .limits import one_line_limits
from .spec import yamlio

# command name -> the module under caffe_py/commands/ that defines it (in its COMMANDS list)
COMMANDS = {
    "train": "train", "test": "train", "time": "train", "device-query": "train",
    "net": "net",
    "convert": "data", "compute-mean": "data", "db-info": "data",
    "import-prototxt": "tools",
    "plot": "plot",
    "export": "export", "draw": "export",
    "build-ext": "ext",
    "pycaffe": "pycaffe",
    # Caffe's tools under their own names, their flags read as gflags reads them
    "convert_imageset": "caffe_tools", "compute_image_mean": "caffe_tools",
    "convert_mnist_data": "caffe_tools", "upgrade_net_proto_text": "caffe_tools",
    "extract_features": "caffe_tools",
}


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        module_name = COMMANDS.get(name)
        if module_name is None:
            return None
        module = importlib.import_module(f"{__package__}.commands.{module_name}")
        return next(c for c in module.COMMANDS if c.name == name)

    def invoke(self, ctx: click.Context):
        yamlio.FOREIGN.setdefault(".prototxt", _prototxt_as_yaml)
        try:
            with logging_to_console(), one_line_limits():
                try:
                    return super().invoke(ctx)
                except CaffePyError as exc:
                    message = printable(str(exc))
                    log_user_error(message)  # the log files keep it too, as Caffe's do
                    raise click.ClickException(message) from None
                except RuntimeError as exc:   # a GPU's failure is a fault, not a bug
                    fault = device_fault(exc)
                    if fault is None:
                        raise
                    log_user_error(printable(fault))
                    raise click.ClickException(printable(fault)) from None
        except CaffePyError as exc:  # before the command ran (a GLOG_* variable)
            raise click.ClickException(printable(str(exc))) from None

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """click's main, but every error (a usage error too) exits with status 1, printed as
        one line: ``Error: ...``."""
        kwargs["standalone_mode"] = False
        given = args[0] if args else kwargs.get("args")  # main(args, ...) or main(args=...)
        kwargs["args"] = caffe_spellings(list(sys.argv[1:] if given is None else given))
        try:
            code = super().main(*args[1:], **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:  # `cpy` alone: the help, as is
            click.echo(exc.ctx.get_help() if exc.ctx else exc.message, err=True)
            sys.exit(1)
        except click.UsageError as exc:   # one line too, with where to read the usage
            see = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            message = printable(exc.format_message()).rstrip(".")
            click.echo(f"Error: {message}{see}", err=True)
            sys.exit(1)
        except click.ClickException as exc:
            exc.message = printable(exc.message)
            exc.show()
            sys.exit(1)
        except click.Abort:  # Ctrl-C or end of input at a prompt
            click.echo("Interrupted.", err=True)
            sys.exit(130)
        if isinstance(code, int) and code != 0:
            sys.exit(code)
        return code


def _prototxt_as_yaml(path: Any) -> str:
    from .tools.to_yaml import prototxt_as_yaml

    return prototxt_as_yaml(path)


# Caffe's tools/caffe.cpp flags (gflags: one dash or two, ``-gpu 0``, ``--gpu=0,1``) -> cpy's
CAFFE_FLAGS = {"solver": "--solver", "gpu": "--gpus", "weights": "--weights",
               "snapshot": "--snapshot", "model": "--model", "iterations": "--iterations",
               "sigint_effect": "--sigint-effect", "sighup_effect": "--sighup-effect",
               "phase": "--phase", "level": "--level", "stage": "--stage"}
COMMAND_ALIASES = {"device_query": "device-query"}  # Caffe's action names
CAFFE_TOOLS = tuple(name for name, module in COMMANDS.items() if module == "caffe_tools")
"""Caffe's tools, commands of their own that read their flags as gflags does."""


VERBATIM = (*CAFFE_TOOLS, "pycaffe")
"""Commands whose arguments are theirs to read: Caffe's tools (as gflags reads them) and a
pycaffe script's own (classify.py has its own --gpu)."""


def caffe_spellings(args: list[str]) -> list[str]:
    """Caffe's flags as gflags spells them (``-solver x``, ``-gpu=0``, ``--gpu 0,1``) and
    Caffe's action names, as cpy's; the arguments of :data:`VERBATIM` commands are left as
    they are."""
    if args and args[0] in VERBATIM:
        return list(args)
    out = []
    for arg in args:
        flag, eq, value = arg.partition("=")
        name = flag[2:] if flag.startswith("--") else flag[1:] if flag.startswith("-") else ""
        if name in CAFFE_FLAGS:
            out.append(CAFFE_FLAGS[name] + (f"={value}" if eq else ""))
        else:
            out.append(COMMAND_ALIASES.get(arg, arg) if not out else arg)
    return out


def printable(message: str) -> str:
    """``message`` on one line: newlines and other control characters (from a file name or
    a value) written as escapes, so that every error stays one line."""
    if message.isprintable():
        return message
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in message)


def _print_configs_dir(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    try:
        click.echo(configs_dir())
    except CaffePyError as exc:
        raise click.ClickException(str(exc)) from None
    ctx.exit()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="caffe-py", prog_name="cpy")
@click.option("--configs-dir", is_flag=True, expose_value=False, is_eager=True,
              callback=_print_configs_dir,
              help="Print the directory of the shipped net and solver specs and exit.")
def cli() -> None:
    """caffe-py: train Caffe-style nets from YAML specs on CPUs and GPUs."""


def main() -> None:
    """The `cpy` program: the command, then :func:`exit_now` with its status."""
    start_load.note()   # before torch loads: a CPU run's first look at other processes' load
    try:
        cli(prog_name="cpy")
        code: int = 0
    except KeyboardInterrupt:  # e.g. during start-up, before a command's own handling
        click.echo("Interrupted.", err=True)
        code = 130
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:  # sys.exit("message"): Python prints it and exits 1
            click.echo(stop.code, err=True)
            code = 1
    exit_now(code)


def exit_now(code: int) -> None:
    """End the process with ``code`` once every atexit handler has run and the standard
    streams are flushed, without the interpreter's teardown: with torch loaded that teardown
    alone takes about half a second on a 2-core machine, after all of the command's work (its
    files are written and closed by then). With another thread still running, or without
    torch, the process ends the usual way."""
    import atexit
    import threading

    if "torch" not in sys.modules or any(t.is_alive() and not t.daemon
                                         for t in threading.enumerate()
                                         if t is not threading.main_thread()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said
            pass
    os._exit(code)
