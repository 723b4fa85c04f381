"""Where the library's log lines go when a command runs, and the terminal progress bar.

The library logs through ``logging.getLogger("caffe_py")`` and its children and installs no
handler. A command installs :class:`LineHandler` for its run: each record's message becomes one
line on stdout (stderr for a command whose stdout is data, e.g. ``cpy test --json``). On a
terminal a line is Caffe's bare text; written to a file or a pipe (a log, CI, ``| tee``) it
carries glog's prefix, as Caffe's own logs do (``I1123 18:00:16.653208 27376 solver.py:239]
Iteration 100, lr = 0.00992565``), so that Caffe's tools/extra scripts (parse_log.py,
parse_log.sh, plot_training_log.py) read it unchanged; ``--log-format`` chooses, and
``--log-file`` writes the prefixed lines to a file as well. On a terminal, a command may also
supply a progress bar; while one is shown the lines are written above it. User errors are not
log lines: they stay one unprefixed line, ``Error: ...``, on stderr.
"""
from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

import click

LOGGER = "caffe_py"
LOG_FORMATS = ("auto", "plain", "caffe")
GLOG_PREFIX = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ \S+:\d+\] ")
"""glog's line prefix: severity, MMDD, time to the microsecond, thread id, file:line]."""


def caffe_line(record: logging.LogRecord, message: str) -> str:
    """``message`` with glog's prefix for ``record`` (every line of it, if several)."""
    when = datetime.datetime.fromtimestamp(record.created).strftime("%m%d %H:%M:%S.%f")
    prefix = (f"{record.levelname[0]}{when} {threading.get_native_id():>5} "
              f"{record.module}.py:{record.lineno}] ")
    return "\n".join(prefix + line for line in message.split("\n"))


class CaffeFormatter(logging.Formatter):
    """Formats a record as Caffe's glog lines."""

    def format(self, record: logging.LogRecord) -> str:
        return caffe_line(record, super().format(record))


class LineHandler(logging.Handler):
    """Writes each record's message as one line, above the progress bar when one is shown."""

    def __init__(self, err: bool = False, log_format: str = "auto"):
        super().__init__(logging.INFO)
        self.err = err
        """Write to stderr instead of stdout."""
        self.prefixed = False
        self.set_format(log_format)
        self.bar: Any = None
        """The tqdm bar being shown, if any."""
        self.closed = False
        """Set once the stream's reader has gone (a broken pipe): nothing more is written."""

    def set_format(self, log_format: str) -> None:
        """plain, caffe (glog's prefix), or auto: caffe unless the stream is a terminal."""
        stream = sys.stderr if self.err else sys.stdout
        self.prefixed = log_format == "caffe" or (log_format == "auto" and _is_log(stream))

    def emit(self, record: logging.LogRecord) -> None:
        if self.closed:
            return
        try:
            message = self.format(record)
            if self.prefixed:
                message = caffe_line(record, message)
            if self.bar is not None:
                self.bar.write(message, file=sys.stderr if self.err else sys.stdout)
            else:
                click.echo(message, err=self.err)
        except BrokenPipeError:  # the reader went away (`cpy train | head`): go on quietly
            self.closed = True
            _silence(sys.stderr if self.err else sys.stdout)
        except Exception:  # noqa: BLE001 - logging's own convention for a failing handler
            self.handleError(record)


def _is_log(stream: Any) -> bool:
    """A file or a pipe (not a terminal, not an in-memory capture)."""
    try:
        return not os.isatty(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False


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


def log_options(command: Any) -> Any:
    """The --log-format and --log-file options of the commands that train or evaluate."""
    command = click.option(
        "--log-file", type=click.Path(dir_okay=False, writable=True), default=None,
        expose_value=False, callback=_log_to_file,
        help="also write the log, with Caffe's glog prefix, to this file")(command)
    return click.option(
        "--log-format", type=click.Choice(LOG_FORMATS), default="auto", show_default=True,
        expose_value=False, callback=_set_format,
        help="glog's line prefix (caffe) or none (plain); auto: caffe unless on a terminal")(
        command)


def _set_format(ctx: click.Context, _param: click.Parameter, value: str) -> None:
    handler = console_handler()
    if handler is not None and not ctx.resilient_parsing:
        handler.set_format(value)


def _log_to_file(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is None or ctx.resilient_parsing:
        return
    from ..errors import WriteError

    try:
        handler = LogFile(value)
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise click.ClickException(str(WriteError(value, f"cannot write the log file {value} "
                                                  f"({reason}); check the path"))) from None
    handler.setLevel(logging.INFO)
    handler.setFormatter(CaffeFormatter())
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)

    def close() -> None:
        logger.removeHandler(handler)
        handler.close()

    ctx.call_on_close(close)


class LogFile(logging.FileHandler):
    """``--log-file``: a write that fails (a full disk, an I/O error) stops the command with
    one line, as a full snapshot disk does, instead of logging's report of every record that
    no longer fits. The error is raised into the main thread's next log call (the solver's
    lines come from there); the file takes nothing more."""

    def __init__(self, path: str):
        super().__init__(path, mode="a", encoding="utf-8")
        self.failed: BaseException | None = None
        self.raised = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed is None:
            try:
                stream = self.stream if self.stream is not None else self._open()
                stream.write(self.format(record) + self.terminator)
                stream.flush()
            except OSError as exc:
                self.failed = _log_write_error(self.baseFilename, exc)
        if self.failed is not None and not self.raised and \
                threading.current_thread() is threading.main_thread():
            self.raised = True
            raise self.failed

    def close(self) -> None:
        try:
            super().close()
        except OSError:  # the buffered rest of a failed file: the error was said already
            pass


def _log_write_error(path: str, exc: OSError) -> BaseException:
    from ..errors import WriteError
    from ..fileio import FULL

    if exc.errno in FULL:
        return WriteError(path, f"no space left on device writing the log file {path}; free "
                          "space or give --log-file a place with room", disk_full=True)
    reason = (exc.strerror or type(exc).__name__).lower()
    return WriteError(path, f"cannot write the log file {path} ({reason}); check the disk, "
                      "or give --log-file another place")
