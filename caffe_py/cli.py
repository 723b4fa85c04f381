"""The `cpy` command line: a click group whose commands live in caffe_py/commands/.

Commands are thin: they parse and check flags, then call the library. A
:class:`~caffe_py.errors.CaffePyError` from the library becomes one line on stderr and exit
status 1, never a traceback.
"""
from __future__ import annotations

import importlib

import click

from .errors import CaffePyError

# One module per command family; each exposes COMMANDS, a list of click commands.
COMMAND_MODULES = ("net", "data", "train", "ext", "tools")


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except CaffePyError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="caffe-py", prog_name="cpy")
def cli() -> None:
    """caffe-py: train Caffe-style nets from YAML specs on CPUs and GPUs."""


for _name in COMMAND_MODULES:
    for _command in importlib.import_module(f"{__package__}.commands.{_name}").COMMANDS:
        cli.add_command(_command)


def main() -> None:
    cli(prog_name="cpy")
