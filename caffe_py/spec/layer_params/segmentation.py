"""The blocks of the segmentation forks' layers: BN (SegNet's and PSPNet's), Upsample (SegNet's
max-unpooling and the YOLOv3 ports' nearest-neighbour), Interp (PSPNet / DeepLab), SegAccuracy
(PSPNet / DeepLab), and the data layers DenseImageData (SegNet / ENet) and ImageSegData
(DeepLab / PSPNet), under each fork's field names and defaults (its caffe.proto).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Check, Message, field, is_set
from .data import ImageDataParameter, TransformationParameter
from .shared import ENGINE_NUMBERS, FillerParameter

SEGNET = "SegNet/ENet's BN (alexgkendall/caffe-segnet)"
PSPNET = "PSPNet's BN (hszhao/PSPNet, also TSN's)"
_SEGNET_BN = ("bn_mode", "scale_filler", "shift_filler")
_PSPNET_BN = ("slope_filler", "bias_filler", "momentum", "eps", "frozen", "engine")


@dataclass
class BNParameter(Message):
    """Two forks' BN under one name: SegNet's (bn_mode, scale_filler, shift_filler: batch
    statistics, or a plain scale and shift in INFERENCE) and PSPNet's (slope_filler,
    bias_filler, momentum, eps, frozen: running statistics). The fields written say which;
    :meth:`variant` names it."""

    bn_mode: str | None = field(None, "SegNet: LEARN normalises by the batch's statistics (in "
                                      "TRAIN and TEST); INFERENCE is scale * x + shift",
                                choices={"LEARN": 0, "INFERENCE": 1})
    scale_filler: FillerParameter | None = field(None, "SegNet: the scale's filler (none: 0)")
    shift_filler: FillerParameter | None = field(None, "SegNet: the shift's filler (none: 0)")
    slope_filler: FillerParameter | None = field(None, "PSPNet: the slope's filler (none: 0)")
    bias_filler: FillerParameter | None = field(None, "PSPNet: the bias's filler (none: 0)")
    momentum: float | None = field(None, "PSPNet: running = momentum * running + (1 - momentum) "
                                         "* batch (default 0.9)", min=0, max=1)
    eps: float | None = field(None, "PSPNet: added to the variance (default 1e-5)", min=0)
    frozen: bool | None = field(None, "PSPNet: normalise by the running statistics in TRAIN "
                                      "too, and learn nothing (default false)")
    engine: str | None = field(None, "PSPNet: implementation (one here)", choices=ENGINE_NUMBERS)

    def written(self, keys: tuple[str, ...]) -> list[str]:
        return [key for key in keys if getattr(self, key) is not None]

    def variant(self) -> str | None:
        """'SegNet', 'PSPNet', or None when no field of either is written."""
        if self.written(_SEGNET_BN):
            return "SegNet"
        return "PSPNet" if self.written(_PSPNET_BN) else None

    def check(self, v: Check) -> None:
        segnet, pspnet = self.written(_SEGNET_BN), self.written(_PSPNET_BN)
        if segnet and pspnet:
            v.fail(pspnet[0], f"bn_param mixes {SEGNET} field {segnet[0]} with {PSPNET} field "
                              f"{pspnet[0]}", "keep the fields of one of the two layers")


@dataclass
class UpsampleParameter(Message):
    """Two forks' Upsample: SegNet's max-unpooling (two bottoms: the values and the pooling
    mask; the output size from upsample_h/upsample_w, else scale with pad_out) and the
    YOLOv3 ports' nearest-neighbour upsampling (one bottom, ``scale``)."""

    scale: int | None = field(None, "the factor on both axes (SegNet's default 2; YOLOv3's "
                                    "nearest-neighbour: required)", min=1)
    scale_h: int | None = field(None, "SegNet: the factor along H (with scale_w)", min=1)
    scale_w: int | None = field(None, "SegNet: the factor along W (with scale_h)", min=1)
    pad_out_h: bool = field(False, "SegNet: the output is one row short (scale 2 only)")
    pad_out_w: bool = field(False, "SegNet: the output is one column short (scale 2 only)")
    upsample_h: int | None = field(None, "SegNet: the output height (with upsample_w)", min=1)
    upsample_w: int | None = field(None, "SegNet: the output width (with upsample_h)", min=1)


@dataclass
class InterpParameter(Message):
    """PSPNet's (and DeepLab v2's) Interp: bilinear resizing with corners aligned. The output
    size comes from, in the fork's order: shrink_factor alone, zoom_factor alone, height and
    width, or shrink_factor then zoom_factor."""

    height: int = field(0, "the output height (with width)", min=0)
    width: int = field(0, "the output width (with height)", min=0)
    zoom_factor: int = field(1, "out = in + (in - 1) * (zoom - 1)", min=1)
    shrink_factor: int = field(1, "out = (in - 1) / shrink + 1", min=1)
    pad_beg: int = field(0, "crop this many rows and columns at the start (<= 0)", max=0)
    pad_end: int = field(0, "crop this many rows and columns at the end (<= 0)", max=0)


@dataclass
class SegAccuracyParameter(Message):
    """PSPNet's (and DeepLab v2's) SegAccuracy: the top holds pixel accuracy, mean class
    accuracy and mean IoU over the pixels whose label is not ignored."""

    metric: str = field("PixelAccuracy", "read but unused by the fork: the top always holds "
                                         "all three", choices={"PixelAccuracy": 0,
                                                               "ClassAccuracy": 1,
                                                               "PixelIOU": 2})
    ignore_label: list[int] = field([], "labels whose pixels are not counted")
    reset: bool = field(True, "start the counts afresh every forward (false: accumulate over "
                              "every forward of the net, e.g. a whole test phase)")


@dataclass
class DenseImageDataParameter(Message):
    """SegNet's (and ENet's) DenseImageData: a list file of ``image label_image`` pairs."""

    source: str = field("", "the list file: 'image label_image' per line", path=True)
    batch_size: int = field(0, "images per batch (per replica)", min=1)
    rand_skip: int = field(0, "skip up to this many pairs at the start (random)", min=0)
    shuffle: bool = field(False, "shuffle the list at the start and after every pass")
    new_height: int = field(0, "resize to this height (images INTER_LINEAR, labels "
                               "INTER_NEAREST; with new_width)", min=0)
    new_width: int = field(0, "resize to this width (with new_height)", min=0)
    is_color: bool = field(True, "read 3 channels (BGR); false: 1 gray channel")
    mean_file: str = field("", "read but unused by the fork (transform_param's mean applies)",
                           path=True)
    root_folder: str = field("", "the folder the list's paths are relative to", path=True)
    mirror: bool = field(False, "flip image and label together at random (TRAIN and TEST, as "
                                "the fork)")
    crop_width: int = field(0, "random crop of image and label together (with crop_height; "
                               "TRAIN and TEST, as the fork)", min=0)
    crop_height: int = field(0, "random crop height (with crop_width)", min=0)
    label_divide_factor: int = field(1, "ENet's fork: the label image is resized to "
                                        "new_height / factor x new_width / factor", min=1)

    def check(self, v: Check) -> None:
        if not self.source:
            v.fail(None, "dense_image_data_param.source is not set",
                   "name the list file of 'image label_image' lines")
        for a, b in (("new_height", "new_width"), ("crop_height", "crop_width")):
            if (getattr(self, a) > 0) != (getattr(self, b) > 0):
                v.fail(a if getattr(self, a) else b, f"{a} and {b} go together",
                       "set both (or neither)")


@dataclass
class ImageSegDataParameter(ImageDataParameter):
    """DeepLab's and PSPNet's image_data_param for ImageSegData: ImageData's fields plus the
    label image's kind and the label that marks padding."""

    ignore_label: int = field(255, "the label of padded pixels (and of every pixel with "
                                   "label_type NONE)")
    label_type: str = field("IMAGE", "PIXEL: the list's second column is a label image; IMAGE: "
                                     "a class number for the whole image; NONE: no label",
                            choices={"NONE": 0, "IMAGE": 1, "PIXEL": 2})


@dataclass
class SegTransformationParameter(TransformationParameter):
    """DeepLab's and PSPNet's transform_param: BVLC's fields plus a rectangular crop and random
    rescaling."""

    scale_factors: list[float] = field([], "rescale by one of these, drawn per image "
                                           "(image INTER_LINEAR, label INTER_NEAREST)")
    crop_width: int = field(0, "crop width (with crop_height, instead of crop_size)", min=0)
    crop_height: int = field(0, "crop height (with crop_width)", min=0)

    def check(self, v: Check) -> None:
        super().check(v)
        if is_set(self, "crop_size") and (is_set(self, "crop_height") or
                                          is_set(self, "crop_width")):
            v.fail("crop_height" if is_set(self, "crop_height") else "crop_width",
                   "crop_size and crop_height/crop_width are both set",
                   "give crop_size, or crop_height and crop_width")
        if is_set(self, "crop_height") != is_set(self, "crop_width"):
            v.fail("crop_height" if is_set(self, "crop_height") else "crop_width",
                   "crop_height and crop_width go together", "set both")


@dataclass
class MatWriteParameter(Message):
    """DeepLab's (and PSPNet's) MatWrite: each forward's bottoms saved as MATLAB files."""

    prefix: str = field("", "the start of every file name (joined as text, as the fork: end a "
                            "folder with '/'; relative to where caffe-py runs, as Caffe)")
    source: str = field("", "a list whose lines' first words name the files of forward 0, "
                            "1, ... (else iter_<n>)", path=True)
    strip: int = field(0, "characters cut from the end of each listed name", min=0)
    period: int = field(1, "write every period-th forward", min=1)

    def check(self, v: Check) -> None:
        if not self.prefix:
            v.fail(None, "mat_write_param.prefix is not set (the fork requires it)",
                   "give the folder and start of the file names, e.g. prefix: features/fc8/")
