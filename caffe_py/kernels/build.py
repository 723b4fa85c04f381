"""Build (once) and load the CUDA extension with torch.utils.cpp_extension.

The first use compiles csrc/ with nvcc and ninja into the cache directory
(``$TORCH_EXTENSIONS_DIR/caffe_py`` when that is set, else ``~/.cache/caffe_py/torch_extensions``,
one subdirectory per PyTorch and CUDA version) and says so in the log; later uses load the built
module, and cpp_extension rebuilds it when a source or flag changes. ``cpy build-ext`` builds
ahead of time. Set TORCH_CUDA_ARCH_LIST (e.g. "9.0") to build for fewer GPU architectures.

:func:`load` raises :class:`BuildError` (one line) when the build fails; :func:`available`
turns that into False with one logged warning per process, so layers fall back to PyTorch's
ops. Both messages go through the ``caffe_py`` logger, as every line of the package does.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from pathlib import Path
from types import ModuleType

import torch

from ..errors import CaffePyError

NAME = "caffe_py_kernels"
SOURCES = ("bindings.cpp", "elementwise.cu", "channel.cu", "bias_grad.cu", "batchnorm.cu",
           "softmax_loss.cu", "transform.cu", "sgd_update.cu", "peer_sum.cu", "max_pool.cu")
CSRC = Path(__file__).resolve().parent / "csrc"
NVCC_FLAGS = ("-O3", "--expt-relaxed-constexpr", "-lineinfo")


class BuildError(CaffePyError):
    """The CUDA extension did not build or load."""


log = logging.getLogger(__name__)

_module: ModuleType | None = None
_failure: BuildError | None = None
_warned = False
_lock = threading.Lock()  # nets built by several replica threads share one build


def build_dir() -> Path:
    """Where the extension is built and cached for this PyTorch and CUDA."""
    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    base = Path(root) / "caffe_py" if root else Path.home() / ".cache" / "caffe_py" / \
        "torch_extensions"
    tag = re.sub(r"[^A-Za-z0-9_.]", "_", f"torch{torch.__version__}_cu{torch.version.cuda}")
    return base / tag


def _built_library(directory: Path) -> Path | None:
    libs = sorted(directory.glob(f"{NAME}*.so"))
    return libs[0] if libs else None


def _needs_compile(directory: Path) -> bool:
    lib = _built_library(directory)
    if lib is None:
        return True
    newest = max((CSRC / s).stat().st_mtime for s in (*SOURCES, "common.cuh", "unary.cuh"))
    return newest > lib.stat().st_mtime


def _compile(verbose: bool) -> ModuleType:
    """Run cpp_extension.load; every failure becomes a one-line BuildError."""
    if torch.version.cuda is None:
        raise BuildError(f"this PyTorch ({torch.__version__}) was built without CUDA")
    from torch.utils import cpp_extension

    if cpp_extension.CUDA_HOME is None:
        raise BuildError("no CUDA toolkit found (nvcc); set CUDA_HOME to the toolkit's "
                         "directory")
    directory = build_dir()
    directory.mkdir(parents=True, exist_ok=True)
    if _needs_compile(directory):
        arch = os.environ.get("TORCH_CUDA_ARCH_LIST", "the visible GPUs")
        log.info("Compiling the CUDA kernels for %s in %s (first use only; about a minute)",
                 arch, directory)
    try:
        module = cpp_extension.load(
            name=NAME, sources=[str(CSRC / s) for s in SOURCES],
            extra_cflags=["-O3"], extra_cuda_cflags=list(NVCC_FLAGS),
            build_directory=str(directory), verbose=verbose)
    except Exception as exc:  # compiler errors, a missing ninja, a bad .so: all one line
        raise BuildError(f"building the CUDA kernels in {directory} failed: "
                         f"{_first_error(exc)}; run `cpy build-ext --verbose` for the "
                         "compiler's output") from None
    _smoke_test(module)
    return module


def _smoke_test(module: ModuleType) -> None:
    """Run one tiny kernel: a build for another GPU architecture fails here, not mid-training."""
    if not torch.cuda.is_available():
        return
    x = torch.tensor([-1.0, 2.0], device="cuda")
    try:
        module.act_forward(x, x, 0, 0.0)
        ok = x.tolist() == [0.0, 2.0]
    except RuntimeError as exc:
        raise BuildError(f"the built CUDA kernels do not run on {torch.cuda.get_device_name()}: "
                         f"{_first_error(exc)}; set TORCH_CUDA_ARCH_LIST to this GPU's "
                         "compute capability and run `cpy build-ext`") from None
    if not ok:
        raise BuildError(f"the built CUDA kernels give wrong results on "
                         f"{torch.cuda.get_device_name()}; rebuild with `cpy build-ext`")


def _first_error(exc: BaseException) -> str:
    text = str(exc)
    for line in text.splitlines():
        if re.search(r"\berror\b", line, re.IGNORECASE) and "Error building" not in line:
            return line.strip()[:240]
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:240]


def load(verbose: bool = False) -> ModuleType:
    """The built extension module; builds it on first use. Raises BuildError."""
    global _module, _failure
    with _lock:
        if _module is not None:
            return _module
        if _failure is not None:
            raise _failure
        try:
            _module = _compile(verbose)
        except BuildError as exc:
            _failure = exc
            raise
        return _module


def build(verbose: bool = False) -> tuple[Path, float]:
    """Build (or load the cached build) now: (build directory, seconds taken)."""
    start = time.perf_counter()
    load(verbose)
    return build_dir(), time.perf_counter() - start


def available() -> bool:
    """Whether the kernels can be used; a failed build logs a warning once per process."""
    global _warned
    try:
        load()
        return True
    except BuildError as exc:
        with _lock:
            first, _warned = not _warned, True
        if first:
            log.warning("The CUDA activation kernels are unavailable (%s); the activation "
                        "layers use PyTorch's ops instead", exc)
        return False


def reset() -> None:
    """Forget the loaded module, the failure and the warning (tests)."""
    global _module, _failure, _warned
    _module, _failure, _warned = None, None, False
