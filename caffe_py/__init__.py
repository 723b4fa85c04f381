"""caffe-py: Caffe's workflow and numbers, with PyTorch underneath."""

__version__ = "0.1.0"
