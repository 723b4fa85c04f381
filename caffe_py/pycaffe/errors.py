"""The errors of caffe_py.pycaffe: a pycaffe call that cannot do what it was asked, and the
one-line error a script gets for a name caffe-py's pycaffe does not have."""
from __future__ import annotations

import difflib
from collections.abc import Iterable

from ..errors import CaffePyError


class PycaffeError(CaffePyError):
    """A pycaffe call that cannot do what it was asked (the message names the call)."""


class PycaffeAttributeError(CaffePyError, AttributeError):
    """A pycaffe name caffe-py does not provide. An AttributeError too, so that ``hasattr``,
    ``getattr(obj, name, default)`` and ``from caffe import name`` behave as Python's own."""


def nearest(name: str, options: Iterable[str]) -> str:
    """The option closest to ``name`` (one is always named)."""
    options = sorted(set(options))
    lowered = {o.lower(): o for o in options}
    if name.lower() in lowered:
        return lowered[name.lower()]
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.0)
    return close[0] if close else options[0]


def missing(owner: str, name: str, supported: Iterable[str]) -> PycaffeAttributeError:
    """``owner.name`` is not covered: the error naming it and the nearest covered name."""
    near = nearest(name, [s for s in supported if not s.startswith("_")] or ["?"])
    return PycaffeAttributeError(
        f"{owner}.{name} is not covered by caffe-py's pycaffe; the nearest covered name is "
        f"{owner}.{near} (docs/pycaffe.md lists what is covered)")
