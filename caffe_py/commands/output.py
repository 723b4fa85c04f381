"""Where the library's log lines go when a command runs, and the terminal progress bar.

The library logs through ``logging.getLogger("caffe_py")`` and its children and installs no
handler. A command installs :class:`LineHandler` for its run: each record's message becomes one
line on stderr, as Caffe's tools log (``caffe train ... 2> train.log`` is how Caffe's docs keep
a log), so stdout carries only a command's data (``cpy test --json``, ``cpy net``'s table). On
a terminal a line is Caffe's bare text; written to a file or a pipe it carries glog's prefix, as
Caffe's own logs do (``I1123 18:00:16.653208 27376 solver.py:239] Iteration 100, lr =
0.00992565``), so that Caffe's tools/extra scripts (parse_log.py, parse_log.sh,
plot_training_log.py) read it unchanged; ``--log-format`` chooses, and ``--log-file`` writes the
prefixed lines to a file as well. On a terminal, a command may also supply a progress bar;
while one is shown the lines are written above it. A user error stays one unprefixed line,
``Error: ...``, on stderr, and goes into the log files as an ``E`` line.

glog's environment variables act as on Caffe's tools: ``GLOG_minloglevel`` (0 INFO, 1 WARNING,
2 ERROR, 3 FATAL) drops the lines below that severity everywhere; ``GLOG_log_dir=DIR`` also
writes glog's log files into DIR (``cpy.<host>.<user>.log.<SEVERITY>.<yyyymmdd-hhmmss>.<pid>``,
one per severity holding that severity and above, with glog's header and a ``cpy.<SEVERITY>``
link to the newest), unless ``GLOG_logtostderr`` is set (true: the lines go to stderr only).
Caffe's glog also writes those files into /tmp when GLOG_log_dir is unset; caffe-py writes
them only where GLOG_log_dir says.
"""
from __future__ import annotations

import contextlib
import datetime
import getpass
import logging
import os
import re
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import click

from ..errors import CaffePyError

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


GLOG_LEVELS = (logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
"""glog's severities 0..3 (INFO, WARNING, ERROR, FATAL) as logging's levels."""
GLOG_NAMES = {logging.INFO: "INFO", logging.WARNING: "WARNING", logging.ERROR: "ERROR",
              logging.CRITICAL: "FATAL"}
USER_ERROR = "user_error"
"""A record attribute: the record is a command's ``Error: ...`` line, which the console shows
by itself (click prints it), so only the log files write it."""


class GlogError(CaffePyError):
    """A GLOG_* environment variable that does not parse (the command line says so in one
    line)."""


def glog_min_level(environ: Any = None) -> int:
    """logging's level below which nothing is logged: ``GLOG_minloglevel`` (0..3, default 0)."""
    raw = (os.environ if environ is None else environ).get("GLOG_minloglevel", "").strip()
    if not raw:
        return logging.INFO
    try:
        value = int(raw)
    except ValueError:
        raise GlogError(f"GLOG_minloglevel '{raw}' is not a number; use 0 (INFO), 1 (WARNING), "
                        "2 (ERROR) or 3 (FATAL)") from None
    return GLOG_LEVELS[min(max(value, 0), 3)] if value < 4 else logging.CRITICAL + 10


def glog_flag(name: str, environ: Any = None) -> bool:
    """A boolean GLOG_<name> as glog reads it: set, and empty or starting t, T, y, Y or 1."""
    raw = (os.environ if environ is None else environ).get(f"GLOG_{name}")
    return raw is not None and (raw == "" or raw[0] in "tTyY1")


class LineHandler(logging.Handler):
    """Writes each record's message as one line, above the progress bar when one is shown."""

    def __init__(self, err: bool = True, log_format: str = "auto", level: int = logging.INFO):
        super().__init__(level)
        self.err = err
        """Write to stderr (Caffe's log stream; the default) instead of stdout."""
        self.prefixed = False
        self.set_format(log_format)
        self.bar: Any = None
        """The tqdm bar being shown, if any."""
        self.closed = False
        """Set once the stream's reader has gone (a broken pipe): nothing more is written."""
        self.companions: list[logging.Handler] = []
        """Handlers that live as long as this one (log files), removed with it."""

    def set_format(self, log_format: str) -> None:
        """plain, caffe (glog's prefix), or auto: caffe unless the stream is a terminal."""
        stream = sys.stderr if self.err else sys.stdout
        self.prefixed = log_format == "caffe" or (log_format == "auto" and _is_log(stream))

    def emit(self, record: logging.LogRecord) -> None:
        if self.closed or getattr(record, USER_ERROR, False):
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


class GlogFiles(logging.Handler):
    """glog's log files in a directory: one per severity, opened at its first line, each
    holding that severity and above, with glog's header and a ``<program>.<SEVERITY>`` link
    to the newest file of that severity (logging.cc's LogFileObject)."""

    def __init__(self, directory: str | Path, program: str = "cpy", level: int = logging.INFO):
        super().__init__(level)
        self.directory, self.program = Path(directory), program
        self.files: dict[int, IO[str]] = {}
        self.stamp = datetime.datetime.now()
        self.failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.failed:
            return
        try:
            line = caffe_line(record, record.getMessage()) + "\n"
            for level in GLOG_LEVELS:
                if record.levelno >= level and level >= self.level:
                    self._file(level).write(line)
            for f in self.files.values():
                f.flush()
        except OSError as exc:  # an unwritable directory: said once, then the run goes on
            self.failed = True
            print(f"Warning: GLOG_log_dir {self.directory}: cannot write the log file "
                  f"({(exc.strerror or type(exc).__name__).lower()}); logging to stderr only",
                  file=sys.stderr)

    def _file(self, level: int) -> IO[str]:
        if level in self.files:
            return self.files[level]
        severity = GLOG_NAMES[level]
        name = (f"{self.program}.{socket.gethostname()}.{_user()}.log.{severity}."
                f"{self.stamp:%Y%m%d-%H%M%S}.{os.getpid()}")
        self.directory.mkdir(parents=True, exist_ok=True)
        f = (self.directory / name).open("a", encoding="utf-8")
        f.write(f"Log file created at: {self.stamp:%Y/%m/%d %H:%M:%S}\n"
                f"Running on machine: {socket.gethostname()}\n"
                "Log line format: [IWEF]mmdd hh:mm:ss.uuuuuu threadid file:line] msg\n")
        link = self.directory / f"{self.program}.{severity}"
        try:
            link.unlink(missing_ok=True)
            link.symlink_to(name)
        except OSError:  # a file system without links: the files are still there
            pass
        self.files[level] = f
        return f

    def close(self) -> None:
        for f in self.files.values():
            f.close()
        self.files.clear()
        super().close()


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "invalid-user"


@contextlib.contextmanager
def logging_to_console(err: bool = True) -> Iterator[LineHandler]:
    """Show the library's INFO lines (on stderr) for the duration of a command, and write
    glog's files where GLOG_log_dir says (see the module docstring); restored afterwards.
    Handlers a command adds (``--log-file``) through :func:`add_log_handler` go with it."""
    logger = logging.getLogger(LOGGER)
    level = glog_min_level()
    handler = LineHandler(err, level=level)
    saved = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(min(level, logging.INFO))
    logger.propagate = False
    directory = os.environ.get("GLOG_log_dir")
    if directory and not glog_flag("logtostderr"):
        add_log_handler(GlogFiles(directory, level=level), handler)
    try:
        yield handler
    finally:
        for extra in handler.companions:
            logger.removeHandler(extra)
            extra.close()
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]


def add_log_handler(extra: logging.Handler, console: LineHandler | None = None) -> None:
    """Add a handler (a log file) to the library's logger for as long as the command's console
    handler is installed."""
    console = console or console_handler()
    logging.getLogger(LOGGER).addHandler(extra)
    if console is not None:
        console.companions.append(extra)


def log_user_error(message: str) -> None:
    """A command's one-line error into the log files (the console prints it by itself)."""
    logging.getLogger("caffe_py.commands").error(message, extra={USER_ERROR: True},
                                                 stacklevel=2)


def console_handler() -> LineHandler | None:
    """The handler the running command installed (None outside a command)."""
    return next((h for h in logging.getLogger(LOGGER).handlers if isinstance(h, LineHandler)),
                None)


def terminal_progress() -> Any:
    """A progress factory ``(total, initial) -> context manager`` for the Solver: a tqdm bar
    (on stderr, with the log lines) when stderr is a terminal, None (plain lines) when it is a
    file or a pipe."""
    if not sys.stderr.isatty():
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
        handler = logging.FileHandler(value, mode="a", encoding="utf-8")
    except OSError as exc:
        reason = (exc.strerror or type(exc).__name__).lower()
        raise click.ClickException(str(WriteError(value, f"cannot write the log file {value} "
                                                  f"({reason}); check the path"))) from None
    handler.setLevel(glog_min_level())
    handler.setFormatter(CaffeFormatter())
    console = console_handler()
    if console is not None:  # removed with the console's handler, after a user error's line
        add_log_handler(handler, console)
        return
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)

    def close() -> None:
        logger.removeHandler(handler)
        handler.close()

    ctx.call_on_close(close)
