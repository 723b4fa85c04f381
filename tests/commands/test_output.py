"""The console side of the one logger: lines as Caffe prints them (on stderr), restored after a
command, above a progress bar, and quiet once the reader of the stream has gone."""
from __future__ import annotations

import logging

from caffe_py.commands import output


def test_lines_go_to_stderr_or_stdout_and_the_logger_is_restored(capsys):
    logger = logging.getLogger("caffe_py")
    before = (logger.level, logger.propagate, list(logger.handlers))
    with output.logging_to_console() as handler:
        logging.getLogger("caffe_py.x").info("to stderr")
        handler.err = False
        logging.getLogger("caffe_py.solver.solver").info("Iteration 0, lr = 0.01")
        logging.getLogger("caffe_py.x").debug("not shown")
        assert output.console_handler() is handler
    assert (logger.level, logger.propagate, list(logger.handlers)) == before
    assert output.console_handler() is None
    out, err = capsys.readouterr()
    assert (out, err) == ("Iteration 0, lr = 0.01\n", "to stderr\n")


def test_lines_go_above_a_bar_while_one_is_shown():
    written = []

    class Bar:
        def write(self, message, file=None):
            written.append(message)

    with output.logging_to_console() as handler:
        handler.set_format("plain")  # a bar is shown on a terminal, where lines are bare
        handler.bar = Bar()
        logging.getLogger("caffe_py").info("Snapshotting to s_iter_2.pt")
    assert written == ["Snapshotting to s_iter_2.pt"]


def test_a_broken_pipe_silences_the_handler_instead_of_raising(monkeypatch):
    class Gone:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            pass

        def fileno(self):
            raise ValueError("no descriptor")

    with output.logging_to_console() as handler:
        monkeypatch.setattr("sys.stderr", Gone())
        logging.getLogger("caffe_py").info("first")
        logging.getLogger("caffe_py").info("second")
        assert handler.closed is True


def test_no_bar_when_stdout_is_not_a_terminal(capsys):
    assert output.terminal_progress() is None
