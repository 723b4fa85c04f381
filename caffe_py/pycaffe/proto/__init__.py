"""pycaffe's ``caffe.proto``: ``from caffe.proto import caffe_pb2`` (see :mod:`.caffe_pb2`)."""


def __getattr__(name: str) -> object:
    """``caffe.proto.caffe_pb2`` after a plain ``import caffe``, as pycaffe's own package
    imports it (its module is loaded on first use)."""
    if name == "caffe_pb2":
        import importlib

        return importlib.import_module(f"{__name__}.caffe_pb2")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
