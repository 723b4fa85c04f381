"""Pieces of the fusion passes' test nets, as Caffe's ResNets write them (YAML flow text)."""
from __future__ import annotations

AFFINE = ("scale_param: {bias_term: true, filler: {type: uniform, min: 0.5, max: 1.5}, "
          "bias_filler: {type: gaussian, std: 0.2}}")
"""A Scale with a bias and blobs away from 1 and 0, so that folding it in shows."""


def conv(name: str, bottom: str, out: int = 4, kernel: int = 3) -> str:
    """A Convolution without bias (a BatchNorm follows it), top named after the layer."""
    return (f"\n  - {{name: {name}, type: Convolution, bottom: {bottom}, top: {name}, "
            f"convolution_param: {{num_output: {out}, kernel_size: {kernel}, "
            f"pad: {kernel // 2}, bias_term: false, weight_filler: {{type: msra}}}}}}")
