"""pycaffe's ``caffe.proto``: ``from caffe.proto import caffe_pb2`` (see :mod:`.caffe_pb2`)."""
