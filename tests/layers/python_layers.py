"""Python layers for the tests, written as Caffe users write them (pycaffe's interface) and
in caffe-py's torch-native form. Imported by module name from python_param, like a user's."""
import caffe
import numpy as np
import torch

from caffe_py.layers.python import TorchLayer


class EuclideanLossLayer(caffe.Layer):
    """BVLC's examples/pycaffe/layers/pyloss.py, unchanged but for this docstring."""

    def setup(self, bottom, top):
        if len(bottom) != 2:
            raise Exception("Need two inputs to compute distance.")

    def reshape(self, bottom, top):
        if bottom[0].count != bottom[1].count:
            raise Exception("Inputs must have the same dimension.")
        self.diff = np.zeros_like(bottom[0].data, dtype=np.float32)
        top[0].reshape(1)

    def forward(self, bottom, top):
        self.diff[...] = bottom[0].data - bottom[1].data
        top[0].data[...] = np.sum(self.diff**2) / bottom[0].num / 2.

    def backward(self, top, propagate_down, bottom):
        for i in range(2):
            if not propagate_down[i]:
                continue
            if i == 0:
                sign = 1
            else:
                sign = -1
            bottom[i].diff[...] = sign * self.diff / bottom[i].num


class SimpleLayer(caffe.Layer):
    """Multiplies by ten (BVLC's python/caffe/test/test_python_layer.py)."""

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = 10 * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        bottom[0].diff[...] = 10 * top[0].diff


class ScaledByBlob(caffe.Layer):
    """y = x * w + param_str's offset, w a learnable blob of one value per channel; the
    gradient of w accumulates (+=) into its diff, as Caffe layers do."""

    def setup(self, bottom, top):
        self.offset = float(self.param_str or 0)
        self.blobs.add_blob(bottom[0].channels)
        self.blobs[0].data[...] = np.arange(1, bottom[0].channels + 1)

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        w = self.blobs[0].data.reshape(1, -1, *([1] * (bottom[0].data.ndim - 2)))
        top[0].data[...] = bottom[0].data * w + self.offset

    def backward(self, top, propagate_down, bottom):
        w = self.blobs[0].data.reshape(1, -1, *([1] * (bottom[0].data.ndim - 2)))
        axes = (0,) + tuple(range(2, top[0].diff.ndim))
        self.blobs[0].diff[...] += (top[0].diff * bottom[0].data).sum(axis=axes)
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff * w


class SetsDiff(caffe.Layer):
    """BVLC's ParameterLayer test: backward sets (not adds) its blob's diff to 1."""

    def setup(self, bottom, top):
        self.blobs.add_blob(1)
        self.blobs[0].data[0] = 0

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data

    def backward(self, top, propagate_down, bottom):
        self.blobs[0].diff[0] = 1


class PhaseLayer(caffe.Layer):
    """Outputs self.phase (BVLC's test)."""

    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape()

    def forward(self, bottom, top):
        top[0].data[()] = self.phase

    def backward(self, top, propagate_down, bottom):
        pass


class RaisesInSetup(caffe.Layer):
    def setup(self, bottom, top):
        raise RuntimeError("bad param_str")


class RaisesInForward(SimpleLayer):
    def forward(self, bottom, top):
        raise ValueError("no data\nhere")


class ChannelScale(TorchLayer):
    """The torch-native form: y = x * w, w (C,) learnable, initialised from param_str."""

    def setup(self, bottom_shapes):
        value = float(self.param_str or 1)
        self.add_blob((bottom_shapes[0][1],), {"type": "constant", "value": value})
        return [bottom_shapes[0]]

    def forward(self, x):
        return x * self.blobs[0].view(1, -1, *([1] * (x.dim() - 2)))


class TwoTops(TorchLayer):
    """Tops: x + 1 and the phase as a number (1 in TEST)."""

    def setup(self, bottom_shapes):
        return [bottom_shapes[0], ()]

    def forward(self, x):
        return x + 1, torch.tensor(float(self.phase == "TEST"))
