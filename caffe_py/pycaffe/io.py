"""pycaffe's ``caffe.io``: images in, arrays out, and Caffe's BlobProto / Datum messages.

``load_image`` decodes with Pillow (the decoder scikit-image uses for JPEG and PNG) into
float32 in [0, 1], RGB (H x W x 3) or intensity (H x W x 1) as pycaffe gives them;
``resize_image`` interpolates with scikit-image (needed for it, as pycaffe needs it) or, for
other channel counts, with scipy's ``zoom``. The messages are :mod:`.proto.caffe_pb2`'s,
encoded and decoded with caffe-py's own codecs (:mod:`caffe_py.io.formats.blobproto`,
:mod:`caffe_py.io.formats.datum`).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import CaffePyError
from ..io.formats.blobproto import blob_from_array, encode_blob
from ..io.formats.datum import datum_from_array, decode_datum, encode_datum
from ..io.formats.datum import datum_to_array as _datum_pixels


class IoError(CaffePyError):
    """caffe.io given what it cannot use (the message names the function and the fix)."""


def _pb2() -> Any:
    from .proto import caffe_pb2

    return caffe_pb2


# --- messages --------------------------------------------------------------------------------
def blobproto_to_array(blob: Any, return_diff: bool = False) -> np.ndarray:
    """A BlobProto's data (or diff) as an array of its shape (the legacy num/channels/height/
    width when those are set)."""
    values = np.array(blob.diff if return_diff else blob.data)
    legacy = ("num", "channels", "height", "width")
    if any(blob.HasField(f) for f in legacy):
        return values.reshape(blob.num, blob.channels, blob.height, blob.width)
    return values.reshape(tuple(blob.shape.dim))


def array_to_blobproto(arr: np.ndarray, diff: np.ndarray | None = None) -> Any:
    """A BlobProto of ``arr`` (float32 data and its shape; ``diff`` too when given)."""
    proto = blob_from_array(np.asarray(arr))
    if diff is not None:
        proto.diff = np.ascontiguousarray(diff, dtype=np.float32).ravel()
    return _pb2().BlobProto.FromString(encode_blob(proto))


def arraylist_to_blobprotovector_str(arraylist: Iterable[np.ndarray]) -> bytes:
    """A serialized BlobProtoVector of the arrays."""
    vec = _pb2().BlobProtoVector()
    vec.blobs.extend([array_to_blobproto(a) for a in arraylist])
    return vec.SerializeToString()


def blobprotovector_str_to_arraylist(data: bytes) -> list[np.ndarray]:
    """The arrays of a serialized BlobProtoVector."""
    vec = _pb2().BlobProtoVector()
    vec.ParseFromString(data)
    return [blobproto_to_array(blob) for blob in vec.blobs]


def array_to_datum(arr: np.ndarray, label: int | None = None) -> Any:
    """A Datum of a (C, H, W) array: uint8 pixels in ``data``, anything else in
    ``float_data``."""
    if np.ndim(arr) != 3:
        raise ValueError("Incorrect array shape.")
    record = datum_from_array(np.asarray(arr), int(label) if label is not None else 0)
    datum = _pb2().Datum.FromString(encode_datum(record))
    if label is None:
        datum.ClearField("label")
    return datum


def datum_to_array(datum: Any) -> np.ndarray:
    """A Datum's pixels as (C, H, W): uint8 from ``data``, float64 from ``float_data`` (the
    label is ``datum.label``)."""
    pixels = _datum_pixels(decode_datum(datum.SerializeToString()))
    return pixels if pixels.dtype == np.uint8 else pixels.astype(float)


# --- preprocessing ---------------------------------------------------------------------------
class Transformer:
    """Input preprocessing for a net, per input blob: transpose, channel swap, raw scale,
    mean, input scale (``preprocess``), and their inverse (``deprocess``)."""

    def __init__(self, inputs: Mapping[str, Sequence[int]]):
        self.inputs = dict(inputs)
        self.transpose: dict[str, Any] = {}
        self.channel_swap: dict[str, Any] = {}
        self.raw_scale: dict[str, float] = {}
        self.mean: dict[str, np.ndarray] = {}
        self.input_scale: dict[str, float] = {}

    def _check(self, in_: str) -> None:
        if in_ not in self.inputs:
            raise IoError(f"{in_} is not one of the net inputs: {self.inputs}")

    def preprocess(self, in_: str, data: np.ndarray) -> np.ndarray:
        """(H' x W' x K) data -> (K x H x W) net input: float32, resized to the input's
        size, transposed, channels swapped, times raw_scale, minus the mean, times
        input_scale."""
        self._check(in_)
        out = data.astype(np.float32, copy=False)
        size = tuple(self.inputs[in_][2:])
        if out.shape[:2] != size:
            out = resize_image(out, size)
        if in_ in self.transpose:
            out = out.transpose(self.transpose[in_])
        if in_ in self.channel_swap:
            out = out[self.channel_swap[in_], :, :]
        if in_ in self.raw_scale:
            out *= self.raw_scale[in_]
        if in_ in self.mean:
            out -= self.mean[in_]
        if in_ in self.input_scale:
            out *= self.input_scale[in_]
        return out

    def deprocess(self, in_: str, data: np.ndarray) -> np.ndarray:
        """A net input back to image form (the inverse of :meth:`preprocess`, no resize)."""
        self._check(in_)
        out = data.copy().squeeze()
        if in_ in self.input_scale:
            out /= self.input_scale[in_]
        if in_ in self.mean:
            out += self.mean[in_]
        if in_ in self.raw_scale:
            out /= self.raw_scale[in_]
        if in_ in self.channel_swap:
            out = out[np.argsort(self.channel_swap[in_]), :, :]
        if in_ in self.transpose:
            out = out.transpose(np.argsort(self.transpose[in_]))
        return out

    def set_transpose(self, in_: str, order: Sequence[int]) -> None:
        """The axis order taking the data to K x H x W, e.g. (2, 0, 1) for H x W x K."""
        self._check(in_)
        if len(order) != len(self.inputs[in_]) - 1:
            raise IoError("Transpose order needs to have the same number of dimensions as "
                          "the input.")
        self.transpose[in_] = order

    def set_channel_swap(self, in_: str, order: Sequence[int]) -> None:
        """The channel order after the transpose, e.g. (2, 1, 0): RGB to BGR."""
        self._check(in_)
        if len(order) != self.inputs[in_][1]:
            raise IoError("Channel swap needs to have the same number of dimensions as the "
                          "input channels.")
        self.channel_swap[in_] = order

    def set_raw_scale(self, in_: str, scale: float) -> None:
        """The scale taking the raw input to the net's range (255 for [0, 1] images)."""
        self._check(in_)
        self.raw_scale[in_] = scale

    def set_mean(self, in_: str, mean: np.ndarray) -> None:
        """The mean to subtract: one value per channel, or an image (resized to the input
        when its size differs)."""
        self._check(in_)
        shape = mean.shape
        if mean.ndim == 1:
            if shape[0] != self.inputs[in_][1]:
                raise ValueError("Mean channels incompatible with input.")
            mean = mean[:, np.newaxis, np.newaxis]
        else:
            if len(shape) == 2:
                shape = (1,) + shape
            if len(shape) != 3:
                raise ValueError("Mean shape invalid")
            if shape != tuple(self.inputs[in_][1:]):
                size = tuple(self.inputs[in_][2:])
                low, high = mean.min(), mean.max()
                unit = (mean - low) / (high - low)
                mean = resize_image(unit.transpose((1, 2, 0)), size).transpose((2, 0, 1)) * \
                    (high - low) + low
        self.mean[in_] = mean

    def set_input_scale(self, in_: str, scale: float) -> None:
        """The scale applied last, after the mean is subtracted."""
        self._check(in_)
        self.input_scale[in_] = scale


# --- images ----------------------------------------------------------------------------------
def input_transformer(net: Any, mean: np.ndarray | None, input_scale: float | None,
                      raw_scale: float | None, channel_swap: Any) -> Transformer:
    """The Transformer of a net's first input as pycaffe's Classifier and Detector make it:
    (H, W, K) images to (K, H, W), with each preprocessing step that is given."""
    in_ = net.inputs[0]
    transformer = Transformer({in_: net.blobs[in_].data.shape})
    transformer.set_transpose(in_, (2, 0, 1))
    if mean is not None:
        transformer.set_mean(in_, mean)
    if input_scale is not None:
        transformer.set_input_scale(in_, input_scale)
    if raw_scale is not None:
        transformer.set_raw_scale(in_, raw_scale)
    if channel_swap is not None:
        transformer.set_channel_swap(in_, channel_swap)
    return transformer


def load_image(filename: str, color: bool = True) -> np.ndarray:
    """An image file as float32 in [0, 1]: H x W x 3 RGB (``color``), else H x W x 1
    intensity (a colour file made gray with ITU-R 709 luma, as scikit-image does); alpha is
    dropped."""
    from PIL import Image

    try:
        with Image.open(filename) as image:
            image.load()
            kept: Any = image
            if image.mode not in _KEPT_MODES:  # palette, CMYK...: as imageio gives them
                has_alpha = "A" in image.getbands() or "transparency" in image.info
                kept = image.convert("RGBA" if has_alpha else "RGB")
            pixels = np.asarray(kept)
    except FileNotFoundError:
        raise IoError(f"caffe.io.load_image: {filename}: no such file") from None
    except OSError as exc:
        raise IoError(f"caffe.io.load_image: {filename}: not an image ({exc})") from None
    img = _as_float(pixels)
    if not color and img.ndim == 3:
        if img.shape[2] == 4:  # scikit-image's rgba2rgb: over a white background
            alpha = img[:, :, 3:]
            img = (1 - alpha) * 1.0 + alpha * img[:, :, :3]
        img = img @ np.array([0.2125, 0.7154, 0.0721])
    img = img.astype(np.float32)
    if img.ndim == 2:
        img = img[:, :, np.newaxis]
        if color:
            img = np.tile(img, (1, 1, 3))
    elif img.shape[2] == 4:
        img = img[:, :, :3]
    return img


_KEPT_MODES = ("1", "L", "I;16", "I", "F", "RGB", "RGBA")


def _as_float(pixels: np.ndarray) -> np.ndarray:
    """scikit-image's img_as_float: integers scaled to [0, 1] by their type's range."""
    if pixels.dtype == np.bool_:
        return pixels.astype(np.float64)
    if np.issubdtype(pixels.dtype, np.integer):
        info = np.iinfo(pixels.dtype)
        if info.min < 0:
            return np.maximum(pixels.astype(np.float64) / info.max, -1.0)
        return pixels.astype(np.float64) / info.max
    return pixels.astype(np.float64)


def resize_image(im: np.ndarray, new_dims: Sequence[int], interp_order: int = 1) -> np.ndarray:
    """``im`` (H x W x K) resized to ``new_dims`` (height, width), as float32: scikit-image's
    resize for 1 or 3 channels (scaled to [0, 1] around it), scipy's zoom otherwise."""
    if im.shape[-1] in (1, 3):
        low, high = im.min(), im.max()
        if high > low:
            try:
                from skimage.transform import resize
            except ImportError:
                raise IoError("caffe.io.resize_image needs scikit-image, as pycaffe does: pip "
                              "install scikit-image (or caffe-py[pycaffe])") from None
            unit = (im - low) / (high - low)
            resized = resize(unit, new_dims, order=interp_order, mode="constant")
            out = resized * (high - low) + low
        else:  # a constant image
            return np.full((new_dims[0], new_dims[1], im.shape[-1]), low, dtype=np.float32)
    else:
        from scipy.ndimage import zoom

        scale = tuple(np.array(new_dims, dtype=float) / np.array(im.shape[:2]))
        out = zoom(im, scale + (1,), order=interp_order)
    return out.astype(np.float32)


def oversample(images: Any, crop_dims: Any) -> np.ndarray:
    """The 10 crops of each image (four corners and centre, and their mirrors):
    (10 N) x H x W x K."""
    im_shape = np.array(images[0].shape)
    crop = np.array(crop_dims)
    center = im_shape[:2] / 2.0
    boxes = np.empty((5, 4), dtype=int)
    k = 0
    for top in (0, im_shape[0] - crop[0]):
        for left in (0, im_shape[1] - crop[1]):
            boxes[k] = (top, left, top + crop[0], left + crop[1])
            k += 1
    boxes[4] = np.tile(center, (1, 2)) + np.concatenate([-crop / 2.0, crop / 2.0])
    boxes = np.tile(boxes, (2, 1))
    crops = np.empty((10 * len(images), crop[0], crop[1], im_shape[-1]), dtype=np.float32)
    ix = 0
    for im in images:
        for box in boxes:
            crops[ix] = im[box[0]:box[2], box[1]:box[3], :]
            ix += 1
        crops[ix - 5:ix] = crops[ix - 5:ix, :, ::-1, :]  # the mirrors
    return crops


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    from .errors import missing

    raise missing("caffe.io", name, [n for n in globals() if not n.startswith("_")])
