"""pycaffe's ``caffe.Detector``: a Net that classifies windows cropped from images, with
R-CNN's context padding."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from . import io as caffe_io
from .net import TEST, Net


class Detector(Net):
    """Windowed detection: each window (ymin, xmin, ymax, xmax) of an image is cropped (with
    ``context_pad`` pixels of context), warped to the net's input and classified."""

    def __init__(self, model_file: str, pretrained_file: str, mean: np.ndarray | None = None,
                 input_scale: float | None = None, raw_scale: float | None = None,
                 channel_swap: Any = None, context_pad: int | None = None):
        Net.__init__(self, model_file, TEST, weights=pretrained_file)
        self.transformer = caffe_io.input_transformer(self, mean, input_scale, raw_scale,
                                                      channel_swap)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows: Iterable[tuple[str, Sequence[Any]]]
                       ) -> list[dict[str, Any]]:
        """[{window, prediction, filename}] for every window of every (file, windows)."""
        pairs = [(name, list(windows)) for name, windows in images_windows]
        crops = []
        for name, windows in pairs:
            image = caffe_io.load_image(name).astype(np.float32)
            crops += [self.crop(image, window) for window in windows]
        in_ = self.inputs[0]
        caffe_in = np.zeros((len(crops), crops[0].shape[2]) + tuple(self.blobs[in_].data.shape[2:]),
                            dtype=np.float32)
        for ix, crop in enumerate(crops):
            caffe_in[ix] = self.transformer.preprocess(in_, crop)
        inputs: dict[str, Any] = {in_: caffe_in}
        predictions = self.forward_all(**inputs)[self.outputs[0]]
        detections, ix = [], 0
        for name, windows in pairs:
            for window in windows:
                detections.append({"window": window, "prediction": predictions[ix],
                                   "filename": name})
                ix += 1
        return detections

    def detect_selective_search(self, image_fnames: Sequence[str]) -> list[dict[str, Any]]:
        """Windows from R-CNN's selective search (its MATLAB module must be importable)."""
        import os

        import selective_search_ijcv_with_python as selective_search

        names = [os.path.abspath(f) for f in image_fnames]
        windows = selective_search.get_windows(names, cmd="selective_search_rcnn")
        return self.detect_windows(zip(names, windows, strict=True))

    def crop(self, im: np.ndarray, window: Any) -> np.ndarray:
        """The window of ``im`` (with context padding when configured: the box grown so that
        ``context_pad`` pixels of the warped input are context, the part outside the image
        filled with the mean)."""
        crop = im[window[0]:window[2], window[1]:window[3]]
        if not self.context_pad:
            return crop
        box = np.asarray(window, dtype=float).copy()
        size = self.blobs[self.inputs[0]].width  # square inputs
        scale = size / (1.0 * size - self.context_pad * 2)
        half_h = (box[2] - box[0] + 1) / 2.0
        half_w = (box[3] - box[1] + 1) / 2.0
        center = (box[0] + half_h, box[1] + half_w)
        box = np.round(np.tile(center, 2) + scale * np.array((-half_h, -half_w, half_h, half_w)))
        scale_h = size / (box[2] - box[0] + 1)
        scale_w = size / (box[3] - box[1] + 1)
        pad_y = round(max(0, -box[0]) * scale_h)
        pad_x = round(max(0, -box[1]) * scale_w)
        im_h, im_w = im.shape[:2]
        box = np.clip(box, 0.0, [im_h, im_w, im_h, im_w])
        clip_h = box[2] - box[0] + 1
        clip_w = box[3] - box[1] + 1
        crop_h = min(round(clip_h * scale_h), size - pad_y)
        crop_w = min(round(clip_w * scale_w), size - pad_x)
        b = box.astype(int)
        context = caffe_io.resize_image(im[b[0]:b[2], b[1]:b[3]], (crop_h, crop_w))
        out = np.ones(self.crop_dims, dtype=np.float32) * self.crop_mean
        out[pad_y:pad_y + crop_h, pad_x:pad_x + crop_w] = context
        return out

    def configure_crop(self, context_pad: int | None) -> None:
        """The crop size (the input's, in image axis order) and, with context padding, the
        mean in image space that fills what lies outside the image."""
        in_ = self.inputs[0]
        tpose = self.transformer.transpose[in_]
        inverse = [tpose[t] for t in tpose]
        self.crop_dims = np.array(self.blobs[in_].data.shape[1:])[inverse]
        self.context_pad = context_pad
        if not context_pad:
            return
        channel_order = self.transformer.channel_swap.get(in_)
        raw_scale = self.transformer.raw_scale.get(in_)
        mean = self.transformer.mean.get(in_)
        if mean is None:
            self.crop_mean = np.zeros(self.crop_dims, dtype=np.float32)
            return
        crop_mean = mean.copy().transpose(inverse)
        if channel_order is not None:
            crop_mean = crop_mean[:, :, [list(channel_order).index(i)
                                         for i in range(crop_mean.shape[2])]]
        if raw_scale is not None:
            crop_mean /= raw_scale
        self.crop_mean = crop_mean
