"""The project's error types.

Every error a user can cause is a :class:`CaffePyError`: the command line prints its one-line
message and exits non-zero, with no traceback. Anything else that escapes is a bug.
"""
from __future__ import annotations


class CaffePyError(Exception):
    """An error caused by the user's input or environment, shown as one line."""


class SpecError(CaffePyError):
    """A YAML spec that does not load or validate.

    The message reads ``file:line: key.path: problem; fix`` so that an editor can jump to it.
    """

    def __init__(self, problem: str, *, file: str | None = None, line: int | None = None,
                 path: str = "", fix: str | None = None):
        self.problem, self.file, self.line, self.path, self.fix = problem, file, line, path, fix
        super().__init__(self._format())

    def _format(self) -> str:
        where = ""
        if self.file:
            where = f"{self.file}:{self.line}: " if self.line else f"{self.file}: "
        key = f"{self.path}: " if self.path else ""
        fix = f"; {self.fix}" if self.fix else ""
        return f"{where}{key}{self.problem}{fix}"


class NetError(CaffePyError):
    """A net that cannot be built: a missing bottom, a bad shape, a cycle..."""


class SolverError(CaffePyError):
    """A training run that cannot go on (bad state file, NaN loss, unwritable snapshot dir)."""


class DataError(CaffePyError):
    """A database or record that cannot be read or written."""
