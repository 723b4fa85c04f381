"""Custom CUDA kernels for the activation layers, their build, and the torch reference.

``reference`` holds plain PyTorch versions (the CPU path and the test oracle), ``functions``
the CUDA kernels as autograd Functions, and ``build`` the JIT build and its cache. The package
is a leaf: it knows tensors, not layers or nets (the pass that folds a bias into an activation
kernel is caffe_py/passes.py).
"""
from .build import BuildError, available, build_dir
from .reference import ELU, KIND_NAMES, RELU, SIGMOID, TANH

__all__ = ["BuildError", "available", "build_dir", "RELU", "ELU", "SIGMOID", "TANH",
           "KIND_NAMES"]
