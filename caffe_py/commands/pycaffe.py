"""`cpy pycaffe`: run a pycaffe script (or an exported notebook) unchanged on caffe-py."""
from __future__ import annotations

import logging
import os
import sys

import click

from .output import console_handler


@click.command("pycaffe", context_settings={"ignore_unknown_options": True,
                                            "allow_interspersed_args": False})
@click.argument("script", type=click.Path(dir_okay=False))
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def pycaffe_command(script: str, args: tuple[str, ...]) -> None:
    """Run SCRIPT with ARGS, `import caffe` resolved to caffe-py's pycaffe (for this process
    only); as `python -m caffe_py.pycaffe SCRIPT ARGS`. The log goes to stderr, as Caffe's."""
    from ..pycaffe.runner import run_script

    handler = console_handler()
    if handler is not None:  # stdout is the script's; the log goes where glog's goes
        handler.err = True
        handler.set_format("auto")
        if os.environ.get("GLOG_minloglevel", "0").strip() not in ("", "0"):
            handler.setLevel(logging.WARNING)
    code = run_script(script, list(args))
    sys.stdout.flush()
    if code:
        sys.exit(code)


COMMANDS = [pycaffe_command]
