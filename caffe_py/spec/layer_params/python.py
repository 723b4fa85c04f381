"""The block of the Python layer."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Check, Message, field


@dataclass
class PythonParameter(Message):
    """Caffe's PythonParameter: which class of which module implements the layer."""

    module: str = field("", "the module to import, e.g. 'pyloss' or 'rpn.proposal_layer' "
                            "(found on PYTHONPATH, then beside the spec file)")
    layer: str = field("", "the class in that module")
    param_str: str = field("", "handed to the class as its param_str attribute before setup")
    share_in_parallel: bool = field(False, "deprecated in Caffe; accepted and ignored")

    def check(self, v: Check) -> None:
        for key in ("module", "layer"):
            if not getattr(self, key):
                v.fail(None, f"python_param.{key} is not set",
                       "name the module and the class: python_param: {module: m, layer: C}")
