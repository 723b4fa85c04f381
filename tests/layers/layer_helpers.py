"""Building one layer outside a net, seeded inputs, and gradcheck over inputs and blobs."""
from __future__ import annotations

import torch

from caffe_py.layers import BuildContext, Layer, lookup
from caffe_py.spec.net_spec import parse_layer
from caffe_py.spec.schema import Source
from caffe_py.spec.yamlio import loads


def build(text: str, bottom_shapes, phase: str = "TRAIN", seed: int = 0, **options) -> Layer:
    """A layer from YAML (one layer mapping, or a net snippet whose first layer is used),
    built on ``bottom_shapes`` with fillers seeded by ``seed`` and net ``options``."""
    node = loads(text)
    if "layer" in node:
        node = node["layer"][0]
    spec = parse_layer(node, Source(), "layer[0]")
    ctx = BuildContext(phase=phase, generator=torch.Generator().manual_seed(seed),
                       options=options)
    return lookup(spec.type)(spec, [tuple(s) for s in bottom_shapes], ctx)


def rand(*shape, seed=0, dtype=torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def gradcheck(layer, *inputs) -> bool:
    """gradcheck in float64 over the inputs and the layer's learnable blobs."""
    layer = layer.double()
    names = [n for n, _ in layer.named_parameters()]
    params = tuple(p.detach().clone().requires_grad_(True) for p in layer.parameters())
    inputs = tuple(x.detach().double().requires_grad_(True) for x in inputs)

    def run(*args):
        blobs = dict(zip(names, args[len(inputs):], strict=True))
        return torch.func.functional_call(layer, blobs, args[:len(inputs)])

    return torch.autograd.gradcheck(run, inputs + params, eps=1e-6, atol=1e-5)
