"""caffe-py: Caffe's workflow and numbers, with PyTorch underneath."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .errors import CaffePyError

if TYPE_CHECKING:  # what mypy and IDEs see; at run time __getattr__ imports them on first use
    from .api import deploy_spec, load_net, predict, train_solver

__version__ = "0.1.0"


def configs_dir() -> Path:
    """The directory of the shipped net and solver specs (lenet.yaml, mnist.yaml, ...).

    An installed wheel carries them as ``caffe_py/configs``; a source checkout (or an editable
    install) has them in ``configs/`` beside the package.
    """
    package = Path(__file__).resolve().parent
    for candidate in (package / "configs", package.parent / "configs"):
        if (candidate / "lenet.yaml").is_file():
            return candidate
    raise CaffePyError(f"no shipped configs in {package / 'configs'}: reinstall caffe-py")


_API = ("load_net", "deploy_spec", "predict", "train_solver")
__all__ = ["CaffePyError", "__version__", "configs_dir", "load_net", "deploy_spec", "predict",
           "train_solver"]


def __getattr__(name: str) -> object:
    """The Python API (caffe_py.api), imported on first use: `import caffe_py` stays free of
    torch, as the command line's --help is."""
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'caffe_py' has no attribute '{name}'")


def __dir__() -> list[str]:
    """The module's names with the API's, which load on first use."""
    return sorted(set(globals()) | set(_API))
