"""Where the library's log lines go when a command runs, and the terminal progress bar.

The library logs through ``logging.getLogger("caffe_py")`` and its children and installs no
handler. A command installs :class:`LineHandler` for its run: each record's message becomes one
line, Caffe's bare text, on stdout (stderr for a command whose stdout is data, e.g. ``cpy test
--json``). On a terminal, a command may also supply a progress bar; while one is shown the
lines are written above it.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import click

LOGGER = "caffe_py"


class LineHandler(logging.Handler):
    """Writes each record's message as one line, above the progress bar when one is shown."""

    def __init__(self, err: bool = False):
        super().__init__(logging.INFO)
        self.err = err
        """Write to stderr instead of stdout."""
        self.bar: Any = None
        """The tqdm bar being shown, if any."""
        self.closed = False
        """Set once the stream's reader has gone (a broken pipe): nothing more is written."""

    def emit(self, record: logging.LogRecord) -> None:
        if self.closed:
            return
        try:
            message = self.format(record)
            if self.bar is not None:
                self.bar.write(message, file=sys.stderr if self.err else sys.stdout)
            else:
                click.echo(message, err=self.err)
        except BrokenPipeError:  # the reader went away (`cpy train | head`): go on quietly
            self.closed = True
            _silence(sys.stderr if self.err else sys.stdout)
        except Exception:  # noqa: BLE001 - logging's own convention for a failing handler
            self.handleError(record)


def _silence(stream: Any) -> None:
    """Point a broken stream's descriptor at /dev/null, so that its buffered rest and every
    later write (the interpreter's flush at exit included) go nowhere instead of failing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no descriptor (a test's captured stream): nothing to do
        pass


@contextlib.contextmanager
def logging_to_console(err: bool = False) -> Iterator[LineHandler]:
    """Show the library's INFO lines for the duration of a command; restored afterwards."""
    logger = logging.getLogger(LOGGER)
    handler = LineHandler(err)
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def console_handler() -> LineHandler | None:
    """The handler the running command installed (None outside a command)."""
    return next((h for h in logging.getLogger(LOGGER).handlers if isinstance(h, LineHandler)),
                None)


def terminal_progress() -> Any:
    """A progress factory ``(total, initial) -> context manager`` for the Solver: a tqdm bar
    when stdout is a terminal, None (plain lines) when it is a file or a pipe."""
    if not sys.stdout.isatty():
        return None
    return _bar


@contextlib.contextmanager
def _bar(total: int, initial: int) -> Iterator[Any]:
    from tqdm import tqdm

    bar = tqdm(total=total, initial=initial, unit="it", dynamic_ncols=True, leave=False)
    handler = console_handler()
    if handler is not None:
        handler.bar = bar
    try:
        yield bar
    finally:
        if handler is not None:
            handler.bar = None
        bar.close()
