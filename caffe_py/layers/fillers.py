"""Caffe's weight fillers (filler.hpp), drawn from a seeded generator on its own device (a
net's weights from the CPU generator of its seed; DummyData's tops on the layer's device).

fan_in = count / shape[0] and fan_out = count / shape[1] as Caffe's ``num()`` and
``channels()`` give them. With no filler at all a blob starts at zero, as Caffe's default
``constant`` filler with value 0 does.
"""
from __future__ import annotations

import math

import torch

from ..spec.layer_params.shared import FillerParameter


class FillerError(ValueError):
    """A filler that cannot fill its blob: (problem, fix); the layer names itself."""


def check(spec: FillerParameter, shape: tuple[int, ...]) -> None:
    """A FillerError where ``spec`` cannot fill a blob of ``shape``: a gaussian filler's sparse
    above the blob's outputs (Caffe's CHECK in its Bernoulli draw)."""
    if spec.type == "gaussian" and spec.sparse >= 0 and shape and spec.sparse > shape[0]:
        raise FillerError(f"gaussian filler's sparse {spec.sparse} is more than the blob's "
                          f"{shape[0]} outputs (sparse / outputs is the chance a weight is "
                          "kept)", f"use sparse <= {shape[0]}")


def fill(spec: FillerParameter | None, shape: tuple[int, ...],
         gen: torch.Generator) -> torch.Tensor:
    """A new float32 tensor of ``shape`` on ``gen``'s device, filled as ``spec`` says."""
    out = torch.zeros(shape, dtype=torch.float32, device=gen.device)
    if spec is not None and out.numel():
        fill_(spec, out, gen)
    return out


def fill_(spec: FillerParameter, out: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Fill ``out`` (float32, on ``gen``'s device) in place as ``spec`` says."""
    shape = tuple(out.shape)
    kind = spec.type
    if kind == "constant":
        out.fill_(spec.value)
    elif kind == "uniform":
        out.uniform_(spec.min, spec.max, generator=gen)
    elif kind == "gaussian":
        out.normal_(spec.mean, spec.std, generator=gen)
        if spec.sparse >= 0:
            check(spec, shape)
            keep = torch.empty(shape, device=gen.device).bernoulli_(spec.sparse / shape[0],
                                                                    generator=gen)
            out.mul_(keep)
    elif kind == "positive_unitball":
        out.uniform_(0, 1, generator=gen)
        rows = out.view(shape[0], -1)
        rows.div_(rows.sum(dim=1, keepdim=True))
    elif kind == "xavier":
        scale = math.sqrt(3.0 / _fan(spec, shape))
        out.uniform_(-scale, scale, generator=gen)
    elif kind == "msra":
        out.normal_(0.0, math.sqrt(2.0 / _fan(spec, shape)), generator=gen)
    elif kind == "bilinear":
        out.copy_(_bilinear(shape).to(out.device))
    else:  # the schema's choices make this unreachable from a spec
        raise ValueError(f"unknown filler type {kind!r}")
    return out


def _fan(spec: FillerParameter, shape: tuple[int, ...]) -> float:
    numel = math.prod(shape)
    fan_in = numel / shape[0]
    fan_out = numel / (shape[1] if len(shape) > 1 else 1)
    if spec.variance_norm == "FAN_OUT":
        return fan_out
    if spec.variance_norm == "AVERAGE":
        return (fan_in + fan_out) / 2.0
    return fan_in


def _bilinear(shape: tuple[int, ...]) -> torch.Tensor:
    """Upsampling weights for a Deconvolution: a tent over each (H, W) kernel."""
    height, width = shape[-2], shape[-1]
    f = math.ceil(width / 2.0)
    c = (2 * f - 1 - f % 2) / (2.0 * f)
    x = torch.arange(width, dtype=torch.float64)
    y = torch.arange(height, dtype=torch.float64)
    tent = (1 - (y[:, None] / f - c).abs()) * (1 - (x[None, :] / f - c).abs())
    return tent.to(torch.float32).expand(shape).clone()
