"""Caffe's tools under their own names, reading their arguments as gflags does, so that a
script written for Caffe's build/tools runs with ``cpy`` in front: ``cpy convert_imageset
--resize_height=32 --resize_width=32 --shuffle -backend lmdb ROOT/ list.txt DB``.

gflags' rules: a flag is ``-name`` or ``--name``, its value after ``=`` or in the next
argument; a boolean flag alone is true, ``-noname`` false, ``-name=false`` too; flags and
positional arguments may be mixed, and ``--`` ends the flags. (cpy's own spelling with dashes,
``--resize-height``, is read as well.) Each tool logs Caffe's lines on stderr, as Caffe's
tools do, and calls the same library code as cpy's own command.
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click

log = logging.getLogger("caffe_py.commands")

_TRUE, _FALSE = ("true", "t", "yes", "y", "1"), ("false", "f", "no", "n", "0")


@dataclass(frozen=True)
class GFlag:
    """One flag of a tool: its name, kind (bool, int or str), default and help."""

    name: str
    kind: type
    default: Any
    help: str


class GFlagsError(click.UsageError):
    """An argument gflags would refuse (printed as one line, exit status 1)."""


def parse_gflags(tool: str, args: Sequence[str],
                 flags: Sequence[GFlag]) -> tuple[dict[str, Any], list[str]]:
    """(flag values by name, the positional arguments) of ``args``, as gflags reads them."""
    known = {f.name: f for f in flags}
    values = {f.name: f.default for f in flags}
    positional: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        i += 1
        if arg == "--":
            positional.extend(items[i:])
            break
        if not arg.startswith("-") or arg == "-":
            positional.append(arg)
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        name = name.replace("-", "_")
        flag = known.get(name)
        if flag is None and name.startswith("no") and name[2:] in known and \
                known[name[2:]].kind is bool and not eq:
            values[name[2:]] = False
            continue
        if flag is None:
            listed = ", ".join(f"-{f}" for f in known) or "none"
            raise GFlagsError(f"{tool}: unknown flag -{name} (its flags: {listed})")
        if flag.kind is bool:
            if eq and value.lower() not in _TRUE + _FALSE:
                raise GFlagsError(f"{tool}: -{name}={value}: expected true or false")
            values[name] = not eq or value.lower() in _TRUE
            continue
        if not eq:
            if i >= len(items):
                raise GFlagsError(f"{tool}: flag -{name} is missing its value")
            value, i = items[i], i + 1
        if flag.kind is int:
            try:
                values[name] = int(value)
            except ValueError:
                raise GFlagsError(f"{tool}: -{name}={value}: expected an integer") from None
        else:
            values[name] = value
    return values, positional


def caffe_tool(name: str, short: str, usage: str,
               flags: Sequence[GFlag] = ()) -> Callable[..., Any]:
    """A click command ``name`` whose arguments go to the decorated function as gflags reads
    them: ``fn(values, positional)``; ``short`` is its line in ``cpy --help``, ``usage``
    Caffe's usage line."""
    table = "\n".join(f"  -{f.name} ({f.kind.__name__}, default {f.default!r}): {f.help}"
                      for f in flags)

    def decorate(fn: Callable[[dict[str, Any], list[str]], None]) -> click.Command:
        def run(args: tuple[str, ...]) -> None:
            values, positional = parse_gflags(name, args, flags)
            fn(values, positional)
        doc = inspect.cleandoc(fn.__doc__ or "")
        text = f"{doc}\n\n\b\nUsage: cpy {usage}" + (f"\n\n\b\nFlags:\n{table}" if table else "")
        command = click.command(name, help=text, context_settings={
            "ignore_unknown_options": True, "help_option_names": ["--help", "-h"]})(
            click.argument("args", nargs=-1, type=click.UNPROCESSED)(run))
        command.short_help = short
        return command
    return decorate


def need(tool: str, usage: str, positional: list[str], least: int, most: int) -> None:
    """Between ``least`` and ``most`` positional arguments, else Caffe's usage in one line."""
    if not least <= len(positional) <= most:
        raise GFlagsError(f"{tool}: expected {least if least == most else f'{least} to {most}'} "
                          f"arguments, got {len(positional)}; usage: cpy {usage}")


UPGRADE_USAGE = "upgrade_net_proto_text v0_net_proto_file_in net_proto_file_out"


@caffe_tool("upgrade_net_proto_text", "Caffe's tool: a V0/V1 net prototxt upgraded",
            UPGRADE_USAGE)
def upgrade_net_proto_text(_flags: dict[str, Any], positional: list[str]) -> None:
    """Upgrade a V0 or V1 net prototxt to the current format (Caffe's
    upgrade_net_proto_text): OUT.prototxt in Caffe's text format, OUT.yaml as caffe-py's
    spec (what cpy import-prototxt writes)."""
    need("upgrade_net_proto_text", UPGRADE_USAGE, positional, 2, 2)
    from ..tools.to_prototxt import upgrade_net_file

    upgrade_net_file(*positional)


COMMANDS = [upgrade_net_proto_text]
