"""The project's error types, and the one formatter of their messages.

Every error a user can cause is a :class:`CaffePyError`: the command line prints its one-line
message and exits non-zero, with no traceback. Anything else that escapes is a bug.
:func:`one_line` writes every message that points into a file, so that all of them read
``file:line: key.path: problem; fix`` and an editor can jump to the place.
"""
from __future__ import annotations

import sys


def one_line(problem: str, fix: str | None = None, *, file: str | None = None,
             line: int | None = None, column: int | None = None, path: str = "",
             layer: tuple[str, str] | None = None) -> str:
    """``file:line[:column]: key.path: layer 'name' (Type): problem; fix``.

    Each part is left out when it is unknown (a spec built in code has no file or line);
    ``layer`` is the (name, type) of the layer the problem is about.
    """
    where = ""
    if file:
        where = f"{file}:{line}" if line else file
        where += f":{column}: " if line and column is not None else ": "
    key = f"{path}: " if path else ""
    named = f"layer '{layer[0]}' ({layer[1]}): " if layer else ""
    tail = f"; {fix}" if fix else ""
    return f"{where}{key}{named}{problem}{tail}"


REASON_CHARS = 120
"""The most characters of another library's message that an error line quotes by default."""


def one_line_reason(exc: BaseException, limit: int = REASON_CHARS) -> str:
    """Another library's exception as a reason inside one error line: its message on one line,
    whole when it fits ``limit`` characters, else its first sentence (torch's zip reader, for
    one, appends a paragraph of advice), else cut at a word with an ellipsis; the exception's
    type where it has no message."""
    text = " ".join(str(exc).split())
    if not text:
        return type(exc).__name__
    if len(text) <= limit:
        return text
    first = text.split(". ", 1)[0]
    if len(first) <= limit:
        return first
    cut = text.rfind(" ", 0, limit - 2)
    return text[:cut if cut > 0 else limit - 3] + "..."


DEVICE_FAULT_STARTS = ("CUDA error", "CUDA driver error", "NCCL error", "NCCL Error",
                       "cuDNN error", "CUBLAS_STATUS", "CUDNN_STATUS")
"""How the first line of a GPU's or NCCL's failure starts, as torch raises it."""

DEVICE_FAULT_FIX = ("this process's CUDA context is lost, so the run stops here; resume from "
                    "the last snapshot with --snapshot, and if it happens again check the GPUs "
                    "with nvidia-smi and rerun with CUDA_LAUNCH_BLOCKING=1 to name the kernel")


def device_fault(exc: BaseException) -> str | None:
    """A GPU's or NCCL's failure (torch's AcceleratorError, or a RuntimeError whose message
    starts as one: a faulting kernel, a peer sum that waited too long for another GPU, a lost
    device, an NCCL error) as one line, what the device said and the fix; None for any other
    exception. torch's message goes on with lines of debugging advice; only its first is
    kept."""
    accelerator = getattr(sys.modules.get("torch"), "AcceleratorError", None)
    lines = str(exc).strip().splitlines()
    first = " ".join(lines[0].split()) if lines else ""
    if not (accelerator is not None and isinstance(exc, accelerator)) and \
            not (isinstance(exc, RuntimeError) and first.startswith(DEVICE_FAULT_STARTS)):
        return None
    return f"the GPU failed: {first or type(exc).__name__}; {DEVICE_FAULT_FIX}"


class CaffePyError(Exception):
    """An error caused by the user's input or environment, shown as one line."""


class SpecError(CaffePyError):
    """A YAML spec (or a prototxt) that does not load or validate; see :func:`one_line`."""

    def __init__(self, problem: str, *, file: str | None = None, line: int | None = None,
                 path: str = "", fix: str | None = None, column: int | None = None):
        self.problem, self.file, self.line, self.path, self.fix = problem, file, line, path, fix
        self.column = column
        super().__init__(one_line(problem, fix, file=file, line=line, column=column, path=path))


class NetError(CaffePyError):
    """A net that cannot be built: a missing bottom, a bad shape, a cycle..."""


class SolverError(CaffePyError):
    """A training run that cannot go on (bad state file, NaN loss, unwritable snapshot dir)."""


class DataError(CaffePyError):
    """A database or record that cannot be read or written."""


class WriteError(CaffePyError):
    """A file that cannot be written: no space left, a read-only or missing place, no
    permission. Nothing was replaced: the target keeps its previous contents, if any."""

    def __init__(self, path: str, message: str, *, disk_full: bool = False):
        self.path, self.disk_full = path, disk_full
        super().__init__(message)
