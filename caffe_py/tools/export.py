"""A deploy net as a TorchScript module, an exported program (torch.export, ``.pt2``) or an
ONNX graph, checked against the Net before it is written.

The net's inputs are its Input layers (a train/test spec gets its deploy form first, see
:func:`caffe_py.api.deploy_spec`, from the shapes given). The batch dimension (axis 0 of every
input and output) is free by default: the exported form takes any batch size, and the check
runs it at a second batch size as well as at the declared one; ``static_batch`` keeps every
shape exactly as declared. The exported forms return the net's output tensor, or a dict of
its outputs by name when it has several (ONNX: the outputs named after the net's blobs).
"""
from __future__ import annotations

import io
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import CaffePyError, one_line_reason
from ..fileio import atomic_write_bytes
from ..net import Net

FORMATS = ("torchscript", "pt2", "onnx")
SUFFIXES = {".onnx": "onnx", ".pt2": "pt2", ".pt": "torchscript", ".ts": "torchscript",
            ".torchscript": "torchscript", ".jit": "torchscript"}
"""The format an output file's suffix names."""
TOLERANCE = 1e-5


class ExportError(CaffePyError):
    """A net that cannot be exported, or whose export does not compute what the Net does."""


class _Forward(nn.Module):
    """The Net as a module of positional inputs returning its output tensor, or its outputs
    by name when it has several (what exporters take)."""

    def __init__(self, net: Net):
        super().__init__()
        self.net, self.inputs, self.outputs = net, list(net.input_names), list(net.output_names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor | dict[str, torch.Tensor]:
        out = self.net(dict(zip(self.inputs, inputs, strict=True))).outputs
        if len(self.outputs) == 1:
            return out[self.outputs[0]]
        return {name: out[name] for name in self.outputs}


def format_of(out: str | Path, fmt: str | None = None) -> str:
    """``fmt`` when given, else the format the suffix of ``out`` names."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ExportError(f"--format {fmt}: one of {', '.join(FORMATS)}")
        return fmt
    suffix = Path(out).suffix.lower()
    if suffix not in SUFFIXES:
        raise ExportError(f"{out}: the suffix '{suffix}' names no format; end the file name in "
                          ".onnx, .pt2 or .pt (TorchScript), or give --format")
    return SUFFIXES[suffix]


def export(spec: Any, weights: str | Path | None, fmt: str | None, out: str | Path, *,
           input_shapes: Mapping[str, Sequence[int]] | None = None,
           static_batch: bool = False) -> list[float]:
    """Export ``spec`` with ``weights`` as ``fmt`` (None: from the suffix of ``out``) into
    ``out``; returns the largest absolute difference of each output from the Net's on random
    inputs (at the declared batch size and, unless ``static_batch``, at another)."""
    from ..api import DATA_TYPES, deploy_spec, load_net, net_spec

    fmt = format_of(out, fmt)
    spec = net_spec(spec)
    if input_shapes:
        spec = deploy_spec(spec, input_shapes)
    readers = [layer.name for layer in spec.layer if layer.type in DATA_TYPES - {"Input"}]
    if readers:
        raise ExportError(f"{spec.name}: layer '{readers[0]}' reads data; give --input-shape "
                          "NAME=N,C,H,W for each data top (e.g. data=1,3,224,224) to export "
                          "the deploy form")
    try:
        net = load_net(spec, weights)
    except CaffePyError as exc:
        if not input_shapes:
            raise
        given = " ".join(f"{name}={','.join(map(str, dims))}"
                         for name, dims in input_shapes.items())
        raise ExportError(f"{exc} (with --input-shape {given}: the net was built for those "
                          "shapes; check them)") from None
    if not net.output_names:
        raise ExportError(f"{spec.name}: the net has no output blob (every top is a later "
                          "layer's bottom, or Silence's); there is nothing to export: leave the "
                          "blob to export unconsumed")
    module = _Forward(net).eval()
    declared = [tuple(net.blobs[name]) for name in net.input_names]
    # torch.export takes a batch of one for a constant: trace a free batch at two or more
    batch = declared[0][0] if declared and declared[0] else 1
    traced_at = batch if static_batch or batch > 1 else 2
    checks = [_inputs(declared, traced_at, seed=0)]
    if not static_batch:
        checks.append(_inputs(declared, traced_at + 1, seed=1))
    expected = [_try(lambda x=inputs: _listed(module(*x), net), "net", batch, inputs)
                for inputs in checks]
    payload, run = _exported(module, checks[0], fmt, net, static_batch)
    diffs = [0.0] * len(net.output_names)
    for inputs, want in zip(checks, expected, strict=True):
        got = _try(lambda x=inputs: run(x), f"{fmt} export", batch, inputs)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            if tuple(a.shape) != tuple(b.shape):
                raise ExportError(f"the {fmt} export gives output '{net.output_names[i]}' shape "
                                  f"{list(a.shape)} at batch {len(inputs[0])}, the net "
                                  f"{list(b.shape)}; export with --static-batch")
            diffs[i] = max(diffs[i], float((a - b).abs().max()) if a.numel() else 0.0)
    if max(diffs, default=0.0) > TOLERANCE:
        raise ExportError(f"the {fmt} export differs from the net by {max(diffs):.3g} (more "
                          f"than {TOLERANCE:g}); nothing was written")
    atomic_write_bytes(out, payload)
    return diffs


def _inputs(shapes: Sequence[tuple[int, ...]], batch: int, seed: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn((batch, *shape[1:]) if shape else shape, generator=generator)
                 for shape in shapes)


def _listed(out: Any, net: Net) -> list[torch.Tensor]:
    """The outputs in the net's order, from a tensor, a dict by name or a sequence."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Mapping):
        return [out[name] for name in net.output_names]
    return [torch.as_tensor(o) for o in out]


def _try(run: Any, what: str, declared: int,
         inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """``run()``; a net or an exported form that fails at another batch size than the
    declared one says so in one line."""
    try:
        with torch.no_grad():
            return run()
    except Exception as exc:  # noqa: BLE001 (a runtime's refusal names an op, not a file)
        if isinstance(exc, CaffePyError) and (not inputs or len(inputs[0]) == declared):
            raise
        reason = one_line_reason(exc, 200)
        raise ExportError(f"the {what} does not run at batch {len(inputs[0])} (declared "
                          f"{declared}): {reason}; export with --static-batch") from None


def _exported(module: _Forward, example: tuple[torch.Tensor, ...], fmt: str, net: Net,
              static_batch: bool) -> tuple[bytes, Any]:
    """The file's bytes, and a function running the exported form on inputs (its outputs in
    the net's order)."""
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # tracing's notes on Python-side shape arithmetic
            if fmt == "torchscript":
                traced = torch.jit.trace(module, example, check_trace=False, strict=False)
                torch.jit.save(traced, buffer)
                loaded = torch.jit.load(io.BytesIO(buffer.getvalue()))
                return buffer.getvalue(), lambda x: _listed(loaded(*x), net)
            if fmt == "pt2":
                dims = None
                if not static_batch:
                    dim = torch.export.Dim("batch", min=1)
                    dims = tuple({0: dim} if t.dim() else {} for t in example)
                program = torch.export.export(module, example,
                                                 dynamic_shapes=None if dims is None else (dims,))
                torch.export.save(program, buffer)
                runnable = torch.export.load(io.BytesIO(buffer.getvalue())).module()
                return buffer.getvalue(), lambda x: _listed(runnable(*x), net)
            return _onnx(module, example, net, buffer, static_batch)
    except CaffePyError:
        raise
    except Exception as exc:  # noqa: BLE001 (an exporter's refusal names an op, not a file)
        reason = one_line_reason(exc, 200)
        hint = "" if static_batch else " (with a free batch size; --static-batch fixes it)"
        raise ExportError(f"the net does not export as {fmt}{hint}: {reason}") from None


def _onnx(module: _Forward, example: tuple[torch.Tensor, ...], net: Net, buffer: io.BytesIO,
          static_batch: bool) -> tuple[bytes, Any]:
    try:
        import onnx  # noqa: F401 (torch's exporter needs it)
        import onnxruntime
    except ImportError:
        raise ExportError("--format onnx needs onnx and onnxruntime: pip install "
                          "'caffe-py[export]'") from None
    axes = None
    if not static_batch:
        axes = {name: {0: "batch"} for name, t in zip(net.input_names, example, strict=True)
                if t.dim()}
        axes.update({name: {0: "batch"} for name in net.output_names if net.blobs[name]})
    torch.onnx.export(module, example, buffer,  # type: ignore[arg-type]  # (takes a file)
                      input_names=list(net.input_names), output_names=list(net.output_names),
                      dynamic_axes=axes, dynamo=False)
    session = onnxruntime.InferenceSession(buffer.getvalue())

    def run(inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
        outputs = session.run(None, {n: t.numpy() for n, t in zip(net.input_names, inputs,
                                                                  strict=True)})
        return [torch.from_numpy(o) for o in outputs]
    return buffer.getvalue(), run
