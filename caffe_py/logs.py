"""Where the library's log lines go when nothing else says.

The library logs through ``logging.getLogger("caffe_py")`` and installs no handler of its own
for library calls: a program that configures logging (``logging.basicConfig``, a handler on
"caffe_py") gets the lines its way. The Python API's long calls (``train_solver``) show them
as ``cpy train`` does, one bare line each on stderr, when nothing is configured.
"""
from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

LOGGER = "caffe_py"


def configured() -> bool:
    """Whether some handler would receive caffe_py's lines (its own, or the root's)."""
    logger = logging.getLogger(LOGGER)
    while logger is not None:
        if logger.handlers:
            return True
        if not logger.propagate:
            return False
        logger = logger.parent  # type: ignore[assignment]
    return False


@contextlib.contextmanager
def lines_to_stderr() -> Iterator[None]:
    """For the duration of a call: caffe_py's INFO lines on stderr, unless logging is
    configured already (then nothing changes)."""
    if configured():
        yield
        return
    logger = logging.getLogger(LOGGER)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)
