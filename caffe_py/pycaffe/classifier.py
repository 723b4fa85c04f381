"""pycaffe's ``caffe.Classifier``: a Net that resizes, crops (or oversamples) and
preprocesses images, and returns class probabilities."""
from __future__ import annotations

from typing import Any

import numpy as np

from . import io as caffe_io
from .net import TEST, Net


class Classifier(Net):
    """Net for image class prediction: images scaled to ``image_dims``, then the centre
    crop (or the 10 oversampled crops, averaged) of the net's input size."""

    def __init__(self, model_file: str, pretrained_file: str, image_dims: Any = None,
                 mean: np.ndarray | None = None, input_scale: float | None = None,
                 raw_scale: float | None = None, channel_swap: Any = None):
        Net.__init__(self, model_file, TEST, weights=pretrained_file)
        in_ = self.inputs[0]
        self.transformer = caffe_io.input_transformer(self, mean, input_scale, raw_scale,
                                                      channel_swap)
        self.crop_dims = np.array(self.blobs[in_].data.shape[2:])
        if not image_dims:
            image_dims = self.crop_dims
        self.image_dims = image_dims

    def predict(self, inputs: Any, oversample: bool = True) -> np.ndarray:
        """(N, C) class probabilities of the N images (H x W x K arrays)."""
        input_ = np.zeros((len(inputs), self.image_dims[0], self.image_dims[1],
                           inputs[0].shape[2]), dtype=np.float32)
        for ix, in_ in enumerate(inputs):
            input_[ix] = caffe_io.resize_image(in_, self.image_dims)
        if oversample:
            input_ = caffe_io.oversample(input_, self.crop_dims)
        else:
            center = np.array(self.image_dims) / 2.0
            crop = np.tile(center, (1, 2))[0] + np.concatenate(
                [-self.crop_dims / 2.0, self.crop_dims / 2.0])
            crop = crop.astype(int)
            input_ = input_[:, crop[0]:crop[2], crop[1]:crop[3], :]
        caffe_in = np.zeros(np.array(input_.shape)[[0, 3, 1, 2]], dtype=np.float32)
        for ix, in_ in enumerate(input_):
            caffe_in[ix] = self.transformer.preprocess(self.inputs[0], in_)
        feed: dict[str, Any] = {self.inputs[0]: caffe_in}
        out = self.forward_all(**feed)
        predictions = out[self.outputs[0]]
        if oversample:
            predictions = predictions.reshape((len(predictions) // 10, 10, -1)).mean(1)
        return predictions
