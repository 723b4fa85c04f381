"""Custom CUDA kernels for the activation layers, their build, and the torch reference.

``reference`` holds plain PyTorch versions (the CPU path and the test oracle), ``functions``
the CUDA kernels as autograd Functions, ``build`` the JIT build and its cache, and ``fusion``
the net-level pass that folds a Convolution/InnerProduct bias into a following ReLU.
"""
from .build import BuildError, KernelFallbackWarning, available, build_dir
from .reference import ELU, KIND_NAMES, RELU, SIGMOID, TANH

__all__ = ["BuildError", "KernelFallbackWarning", "available", "build_dir", "RELU", "ELU",
           "SIGMOID", "TANH", "KIND_NAMES"]
