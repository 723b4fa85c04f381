"""A deploy net as a TorchScript module, an exported program (torch.export, ``.pt2``) or an
ONNX graph, checked against the Net on the same input before it is written.

The net's inputs are its Input layers (a train/test spec gets its deploy form first, see
:func:`caffe_py.api.deploy_spec`, from the shapes given). Caffe's nets have fixed shapes: the
exported forms take inputs of exactly those shapes, and return the net's outputs in their
printed order (by name).
"""
from __future__ import annotations

import io
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CaffePyError
from ..fileio import atomic_write_bytes
from ..net import Net

FORMATS = ("torchscript", "pt2", "onnx")
TOLERANCE = 1e-5


class ExportError(CaffePyError):
    """A net that cannot be exported, or whose export does not compute what the Net does."""


class _Forward(nn.Module):
    """The Net as a module of positional inputs and a tuple of outputs (what exporters take)."""

    def __init__(self, net: Net):
        super().__init__()
        self.net, self.inputs, self.outputs = net, list(net.input_names), list(net.output_names)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.net(dict(zip(self.inputs, inputs, strict=True))).outputs
        return tuple(out[name] for name in self.outputs)


def export(spec: Any, weights: str | Path | None, fmt: str, out: str | Path, *,
           input_shapes: Mapping[str, Sequence[int]] | None = None) -> list[float]:
    """Export ``spec`` with ``weights`` as ``fmt`` into ``out``; returns the largest absolute
    difference of each output from the Net's on a random input."""
    from ..api import DATA_TYPES, deploy_spec, load_net, net_spec

    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt}: one of {', '.join(FORMATS)}")
    spec = net_spec(spec)
    if input_shapes:
        spec = deploy_spec(spec, input_shapes)
    readers = [layer.name for layer in spec.layer if layer.type in DATA_TYPES - {"Input"}]
    if readers:
        raise ExportError(f"{spec.name}: layer '{readers[0]}' reads data; give --input-shape "
                          "NAME=N,C,H,W for each data top (e.g. data=1,3,224,224) to export "
                          "the deploy form")
    net = load_net(spec, weights)
    module = _Forward(net).eval()
    example = tuple(torch.randn(net.blobs[name], generator=torch.Generator().manual_seed(0))
                    for name in net.input_names)
    with torch.no_grad():
        expected = module(*example)
    payload, got = _exported(module, example, fmt, net)
    diffs = [float((a - b).abs().max()) if a.numel() else 0.0
             for a, b in zip(got, expected, strict=True)]
    if max(diffs, default=0.0) > TOLERANCE:
        raise ExportError(f"the {fmt} export differs from the net by {max(diffs):.3g} (more "
                          f"than {TOLERANCE:g}); nothing was written")
    atomic_write_bytes(out, payload)
    return diffs


def _exported(module: nn.Module, example: tuple, fmt: str,
              net: Net) -> tuple[bytes, Sequence[torch.Tensor]]:
    """The file's bytes, and what the exported form computes on ``example``."""
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracing's notes on Python-side shape arithmetic
            if fmt == "torchscript":
                traced = torch.jit.trace(module, example, check_trace=False)
                torch.jit.save(traced, buffer)
                buffer.seek(0)
                return buffer.getvalue(), torch.jit.load(buffer)(*example)
            if fmt == "pt2":
                program = torch.export.export(module, example)
                torch.export.save(program, buffer)
                buffer.seek(0)
                return buffer.getvalue(), torch.export.load(buffer).module()(*example)
            return _onnx(module, example, net, buffer)
    except CaffePyError:
        raise
    except Exception as exc:  # noqa: BLE001 (an exporter's refusal names an op, not a file)
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise ExportError(f"the net does not export as {fmt}: {reason}") from None


def _onnx(module: nn.Module, example: tuple, net: Net,
          buffer: io.BytesIO) -> tuple[bytes, Sequence[torch.Tensor]]:
    try:
        import onnxruntime
    except ImportError:
        raise ExportError("--format onnx needs onnx and onnxruntime: pip install "
                          "'caffe-py[export]'") from None
    torch.onnx.export(module, example, buffer,  # type: ignore[arg-type]  # (takes a file)
                      input_names=list(net.input_names),
                      output_names=list(net.output_names), dynamo=False)
    session = onnxruntime.InferenceSession(buffer.getvalue())
    outputs = session.run(None, {n: t.numpy() for n, t in zip(net.input_names, example,
                                                              strict=True)})
    return buffer.getvalue(), [torch.from_numpy(o) for o in outputs]
