"""The blocks of the detection layers of Caffe's forks, under the forks' names.

SSD (weiliu89/caffe, branch ssd): PriorBox, Permute, Normalize (``norm_param``),
DetectionOutput, MultiBoxLoss, DetectionEvaluate and AnnotatedData, whose ``transform_param``
carries the fork's resize, distortion, expansion and emit fields. Faster R-CNN
(rbgirshick/caffe-fast-rcnn) and R-FCN (daijifeng001/caffe-rfcn): ROIPooling, SmoothL1Loss
and PSROIPooling. Field names, defaults and documented meanings are the forks' caffe.proto.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..schema import Check, Message, field
from .data import DataParameter, TransformationParameter
from .shared import FillerParameter

CODE_TYPES = ("CORNER", "CENTER_SIZE", "CORNER_SIZE")


# --- PriorBox, Permute, Normalize -----------------------------------------------------------
@dataclass
class PriorBoxParameter(Message):
    """Default boxes of one feature map (SSD's PriorBoxParameter)."""

    min_size: list[float] = field([], "box sizes in pixels, one prior each (required; read as "
                                      "integers, as the fork does)")
    max_size: list[float] = field([], "per min_size: adds a square prior of side "
                                      "sqrt(min_size * max_size)")
    aspect_ratio: list[float] = field([], "extra aspect ratios (1 is always there; repeats are "
                                          "dropped)")
    flip: bool = field(True, "also add 1/r for every aspect ratio r")
    clip: bool = field(False, "clip the priors to [0, 1]")
    variance: list[float] = field([], "the variances written beside the priors: none (0.1), "
                                      "one, or four")
    img_size: int | None = field(None, "the image size (default: bottom 1's)", min=1)
    img_h: int | None = field(None, "the image height (with img_w; default: bottom 1's)", min=1)
    img_w: int | None = field(None, "the image width (with img_h; default: bottom 1's)", min=1)
    step: float | None = field(None, "the step between prior centres in pixels (default: image "
                                     "size / feature map size)")
    step_h: float | None = field(None, "the vertical step (with step_w)")
    step_w: float | None = field(None, "the horizontal step (with step_h)")
    offset: float = field(0.5, "where in its cell a prior's centre lies")

    def check(self, v: Check) -> None:
        if not self.min_size:
            v.fail(None, "prior_box_param.min_size is not set", "give one or more min_size")
        if any(s <= 0 for s in self.min_size):
            v.fail("min_size", "min_size must be positive", "give sizes > 0")
        if self.max_size:
            if len(self.max_size) != len(self.min_size):
                v.fail("max_size", f"{len(self.max_size)} max_size for {len(self.min_size)} "
                                   "min_size", "give one max_size per min_size")
            for lo, hi in zip(self.min_size, self.max_size, strict=True):
                if hi <= lo:
                    v.fail("max_size", f"max_size {hi:g} is not greater than min_size {lo:g}",
                           "give max_size > min_size")
        if any(not (math.isfinite(r) and r > 0) for r in self.aspect_ratio):
            bad = next(r for r in self.aspect_ratio if not (math.isfinite(r) and r > 0))
            v.fail("aspect_ratio", f"aspect ratio {bad:g} is not a positive finite number "
                                   "(a prior's width over its height)", "give ratios > 0")
        if len(self.variance) not in (0, 1, 4):
            v.fail("variance", f"{len(self.variance)} variances", "give none, one or four")
        if any(x <= 0 for x in self.variance):
            v.fail("variance", "variances must be positive", "give values > 0")
        if (self.img_h is not None or self.img_w is not None) and self.img_size is not None:
            v.fail("img_size", "img_size and img_h/img_w are both set", "keep one of them")
        if (self.img_h is None) != (self.img_w is None):
            v.fail("img_h" if self.img_h is None else "img_w",
                   "img_h and img_w go together", "give both")
        if (self.step_h is not None or self.step_w is not None) and self.step is not None:
            v.fail("step", "step and step_h/step_w are both set", "keep one of them")
        if (self.step_h is None) != (self.step_w is None):
            v.fail("step_h" if self.step_h is None else "step_w",
                   "step_h and step_w go together", "give both")
        for key in ("step", "step_h", "step_w"):
            value = getattr(self, key)
            if value is not None and value <= 0:
                v.fail(key, f"{key} must be positive", f"give {key} > 0")


@dataclass
class PermuteParameter(Message):
    """A new order of the axes (SSD's PermuteParameter)."""

    order: list[int] = field([], "the new order of the axes, e.g. [0, 2, 3, 1]; axes left out "
                                 "follow in their own order", min=0)

    def check(self, v: Check) -> None:
        if len(set(self.order)) != len(self.order):
            v.fail("order", f"order {self.order} repeats an axis", "name each axis once")


@dataclass
class NormalizeParameter(Message):
    """L2 normalization with a learned scale (SSD's NormalizeParameter, ``norm_param``)."""

    across_spatial: bool = field(True, "one norm per sample over C x H x W (else one per "
                                       "position, over C)")
    scale_filler: FillerParameter | None = field(None, "the scale's initial values (none: "
                                                       "constant 1)")
    channel_shared: bool = field(True, "one scale for every channel (else one per channel)")
    eps: float = field(1e-10, "added to the sum of squares before the square root")


# --- DetectionOutput, DetectionEvaluate -----------------------------------------------------
@dataclass
class NonMaximumSuppressionParameter(Message):
    """Caffe's NonMaximumSuppressionParameter (SSD)."""

    nms_threshold: float = field(0.3, "a box overlapping a kept one by more than this is "
                                      "dropped", min=0)
    top_k: int | None = field(None, "the most candidates per class that NMS considers (none: "
                                    "all)")
    eta: float = field(1.0, "adaptive NMS: after each kept box the threshold is multiplied by "
                            "eta while it is above 0.5 (1: fixed)")

    def check(self, v: Check) -> None:
        if not 0 < self.eta <= 1:
            v.fail("eta", f"eta {self.eta:g} is outside (0, 1]", "give 0 < eta <= 1")


@dataclass
class ResizeParameter(Message):
    """How an image is resized (SSD's ResizeParameter)."""

    prob: float = field(1.0, "the probability of this resize policy")
    resize_mode: str = field("WARP", "WARP (to height x width), FIT_SMALL_SIZE (the smaller "
                                     "side to fit, aspect kept) or FIT_LARGE_SIZE_AND_PAD",
                             choices=("WARP", "FIT_SMALL_SIZE", "FIT_LARGE_SIZE_AND_PAD"))
    height: int = field(0, "the new height", min=0)
    width: int = field(0, "the new width", min=0)
    height_scale: int = field(0, "FIT_SMALL_SIZE: the height boxes are scaled to", min=0)
    width_scale: int = field(0, "FIT_SMALL_SIZE: the width boxes are scaled to", min=0)
    pad_mode: str = field("CONSTANT", "FIT_LARGE_SIZE_AND_PAD: how the border is filled",
                          choices=("CONSTANT", "MIRRORED", "REPEAT_NEAREST"))
    pad_value: list[float] = field([], "CONSTANT padding: one value, or one per channel")
    interp_mode: list[str] = field([], "interpolations to pick from at random (none: LINEAR)",
                                   choices=("LINEAR", "AREA", "NEAREST", "CUBIC", "LANCZOS4"))


@dataclass
class SaveOutputParameter(Message):
    """Where DetectionOutput writes its detections as result files (SSD's
    SaveOutputParameter): VOC's per-class text files or one COCO/ILSVRC JSON file, every
    ``num_test_image`` images."""

    output_directory: str = field("", "the folder of the result files (empty: none written)",
                                  path=True)
    output_name_prefix: str = field("", "the start of each file name, e.g. comp4_det_test_")
    output_format: str = field("", "VOC, COCO or ILSVRC")
    label_map_file: str = field("", "the label map (a LabelMap prototxt) naming the classes",
                                path=True)
    name_size_file: str = field("", "'name height width' per test image, in database order",
                                path=True)
    num_test_image: int | None = field(None, "images per pass (default: the lines of "
                                             "name_size_file)", min=1)
    resize_param: ResizeParameter | None = field(None, "how the test images were resized, to "
                                                       "map boxes back")


@dataclass
class DetectionOutputParameter(Message):
    """Decode, NMS and keep the best detections (SSD's DetectionOutputParameter)."""

    num_classes: int | None = field(None, "classes predicted, background included (required)",
                                    min=1)
    share_location: bool = field(True, "one box per prior for every class (else per class)")
    background_label_id: int = field(0, "the background class (-1: none)")
    nms_param: NonMaximumSuppressionParameter = field(NonMaximumSuppressionParameter(),
                                                      "non-maximum suppression")
    save_output_param: SaveOutputParameter = field(SaveOutputParameter(),
                                                   "result files (optional)")
    code_type: str = field("CORNER", "how box offsets are encoded", choices=CODE_TYPES)
    variance_encoded_in_target: bool = field(False, "the offsets already hold the variance")
    keep_top_k: int = field(-1, "detections kept per image after NMS (-1: all)")
    confidence_threshold: float | None = field(None, "only boxes scoring above this are "
                                                     "considered (none: all)")
    visualize: bool = field(False, "draw the detections (the fork's OpenCV window; not in "
                                   "caffe-py)")
    visualize_threshold: float | None = field(None, "the score drawn from (with visualize)")
    save_file: str = field("", "a video file of the drawings (with visualize)")

    def check(self, v: Check) -> None:
        if self.num_classes is None:
            v.fail(None, "detection_output_param.num_classes is not set",
                   "give the number of classes, background included")
        if self.share_location and self.background_label_id == -1:
            v.fail("background_label_id", "background_label_id -1 with share_location: true "
                                          "decodes no box in SSD's fork (it stops with 'Could "
                                          "not find location predictions for label -1')",
                   "set share_location: false, or give the background class")


@dataclass
class DetectionEvaluateParameter(Message):
    """True and false positives per detection, for mAP (SSD's DetectionEvaluateParameter)."""

    num_classes: int | None = field(None, "classes, background included (required)", min=1)
    background_label_id: int = field(0, "the background class (-1: none)")
    overlap_threshold: float = field(0.5, "a detection is a true positive from this IoU with an "
                                          "unmatched ground-truth box")
    evaluate_difficult_gt: bool = field(True, "count difficult ground truth too")
    name_size_file: str = field("", "'name height width' per test image: boxes are compared "
                                    "in pixels of the original image", path=True)
    resize_param: ResizeParameter | None = field(None, "how the test images were resized")

    def check(self, v: Check) -> None:
        if self.num_classes is None:
            v.fail(None, "detection_evaluate_param.num_classes is not set",
                   "give the number of classes, background included")
        if self.overlap_threshold <= 0:
            v.fail("overlap_threshold", "overlap_threshold must be positive", "give e.g. 0.5")


# --- MultiBoxLoss ---------------------------------------------------------------------------
@dataclass
class MultiBoxLossParameter(Message):
    """Match priors to ground truth, mine negatives, and sum the box and class losses (SSD's
    MultiBoxLossParameter)."""

    loc_loss_type: str = field("SMOOTH_L1", "the box loss", choices=("L2", "SMOOTH_L1"))
    conf_loss_type: str = field("SOFTMAX", "the class loss", choices=("SOFTMAX", "LOGISTIC"))
    loc_weight: float = field(1.0, "the box loss's weight")
    num_classes: int | None = field(None, "classes, background included (required)", min=1)
    share_location: bool = field(True, "one box per prior for every class (else per class)")
    match_type: str = field("PER_PREDICTION", "BIPARTITE (each ground truth its best prior) or "
                                              "PER_PREDICTION (also every prior overlapping a "
                                              "ground truth by overlap_threshold)",
                            choices=("BIPARTITE", "PER_PREDICTION"))
    overlap_threshold: float = field(0.5, "PER_PREDICTION: the IoU that matches a prior")
    use_prior_for_matching: bool = field(True, "match the priors (else the decoded predictions)")
    background_label_id: int = field(0, "the background class")
    use_difficult_gt: bool = field(True, "match difficult ground truth too")
    do_neg_mining: bool | None = field(None, "deprecated: use mining_type")
    neg_pos_ratio: float = field(3.0, "MAX_NEGATIVE: negatives per positive")
    neg_overlap: float = field(0.5, "MAX_NEGATIVE: a negative overlaps every ground truth by "
                                    "less than this")
    code_type: str = field("CORNER", "how box offsets are encoded", choices=CODE_TYPES)
    encode_variance_in_target: bool = field(False, "put the variance in the target instead "
                                                   "of the box")
    map_object_to_agnostic: bool = field(False, "one object class for every class")
    ignore_cross_boundary_bbox: bool = field(False, "never match a prior crossing the image "
                                                    "border")
    bp_inside: bool = field(False, "back-propagate only the corners inside the image")
    mining_type: str = field("MAX_NEGATIVE", "NONE (every prior), MAX_NEGATIVE (the highest-"
                                             "loss negatives) or HARD_EXAMPLE (OHEM)",
                             choices=("NONE", "MAX_NEGATIVE", "HARD_EXAMPLE"))
    nms_param: NonMaximumSuppressionParameter | None = field(
        None, "NMS over the candidates before the hard examples are taken")
    sample_size: int = field(64, "HARD_EXAMPLE: examples kept per image")
    use_prior_for_nms: bool = field(False, "that NMS uses the priors (else decoded boxes)")

    def check(self, v: Check) -> None:
        if self.num_classes is None:
            v.fail(None, "multibox_loss_param.num_classes is not set",
                   "give the number of classes, background included")
        if self.do_neg_mining is not None and self.do_neg_mining != (self.mining_type != "NONE"):
            v.fail("do_neg_mining", f"do_neg_mining: {str(self.do_neg_mining).lower()} "
                                    f"contradicts mining_type: {self.mining_type}",
                   "drop the deprecated do_neg_mining and keep mining_type")
        if self.mining_type != "NONE" and not self.share_location:
            v.fail("mining_type", "negative mining needs share_location: true (as in the fork)",
                   "set mining_type: NONE or share_location: true")
        if self.conf_loss_type == "SOFTMAX" and self.num_classes is not None and \
                not 0 <= self.background_label_id < self.num_classes:
            v.fail("background_label_id", f"background_label_id {self.background_label_id} is "
                                          f"outside [0, {self.num_classes}) for SOFTMAX",
                   "give a class of the softmax")
        if self.map_object_to_agnostic and self.num_classes is not None and \
                self.num_classes != (2 if self.background_label_id >= 0 else 1):
            v.fail("map_object_to_agnostic", "map_object_to_agnostic needs num_classes 2 (1 "
                                             "without background)", "set num_classes: 2")


# --- AnnotatedData --------------------------------------------------------------------------
@dataclass
class Sampler(Message):
    """The box a batch sampler draws, in the normalized image (SSD's Sampler)."""

    min_scale: float = field(1.0, "smallest scale of the sampled box", min=0)
    max_scale: float = field(1.0, "largest scale, <= 1", max=1)
    min_aspect_ratio: float = field(1.0, "smallest aspect ratio", min=0)
    max_aspect_ratio: float = field(1.0, "largest aspect ratio")

    def check(self, v: Check) -> None:
        if self.max_scale < self.min_scale or self.min_scale <= 0:
            v.fail("min_scale", "need 0 < min_scale <= max_scale <= 1", "fix the scales")
        if self.max_aspect_ratio < self.min_aspect_ratio or self.min_aspect_ratio <= 0:
            v.fail("min_aspect_ratio", "need 0 < min_aspect_ratio <= max_aspect_ratio",
                   "fix the aspect ratios")


@dataclass
class SampleConstraint(Message):
    """When a sampled box counts (SSD's SampleConstraint): against any one ground-truth box."""

    min_jaccard_overlap: float | None = field(None, "IoU with the box at least this")
    max_jaccard_overlap: float | None = field(None, "IoU at most this")
    min_sample_coverage: float | None = field(None, "the share of the sample the box covers, "
                                                    "at least")
    max_sample_coverage: float | None = field(None, "... at most")
    min_object_coverage: float | None = field(None, "the share of the box the sample covers, "
                                                    "at least")
    max_object_coverage: float | None = field(None, "... at most")


@dataclass
class BatchSampler(Message):
    """One way to sample crops (SSD's BatchSampler)."""

    use_original_image: bool = field(True, "sample in the whole image")
    sampler: Sampler = field(Sampler(), "the sampled box's scale and aspect ratio")
    sample_constraint: SampleConstraint = field(SampleConstraint(), "which samples count")
    max_sample: int | None = field(None, "stop after this many samples that count", min=0)
    max_trials: int = field(100, "tries", min=0)


@dataclass
class AnnotatedDataParameter(Message):
    """SSD's AnnotatedDataParameter."""

    batch_sampler: list[BatchSampler] = field([], "samplers; one of the crops they find is "
                                                  "taken at random (none: no crop)")
    label_map_file: str = field("", "the label map (kept for the fork's tools)", path=True)
    anno_type: str | None = field(None, "overrides the records' annotation type",
                                  choices=("BBOX",))


@dataclass
class EmitConstraint(Message):
    """Which boxes survive a crop (SSD's EmitConstraint)."""

    emit_type: str = field("CENTER", "CENTER (the box's centre in the crop) or MIN_OVERLAP",
                           choices=("CENTER", "MIN_OVERLAP"))
    emit_overlap: float = field(0.0, "MIN_OVERLAP: the share of the box the crop must cover")


@dataclass
class DistortionParameter(Message):
    """Photometric distortions, each with its probability (SSD's DistortionParameter)."""

    brightness_prob: float = field(0.0, "probability of a brightness change")
    brightness_delta: float = field(0.0, "added to the pixels, within [-delta, delta]", min=0)
    contrast_prob: float = field(0.0, "probability of a contrast change")
    contrast_lower: float = field(0.0, "lowest contrast factor", min=0)
    contrast_upper: float = field(0.0, "highest contrast factor")
    hue_prob: float = field(0.0, "probability of a hue change")
    hue_delta: float = field(0.0, "added to the hue (OpenCV's 0..180), within [-delta, delta]",
                             min=0)
    saturation_prob: float = field(0.0, "probability of a saturation change")
    saturation_lower: float = field(0.0, "lowest saturation factor", min=0)
    saturation_upper: float = field(0.0, "highest saturation factor")
    random_order_prob: float = field(0.0, "probability of shuffling the channels")


@dataclass
class ExpansionParameter(Message):
    """Zoom out: the image placed at random on a larger canvas of the mean (SSD's
    ExpansionParameter)."""

    prob: float = field(1.0, "the probability of expanding")
    max_expand_ratio: float = field(1.0, "the largest canvas side / image side (> 1)")


@dataclass
class NoiseParameter(Message):
    """The fork's noise policy (SSD's NoiseParameter); caffe-py reads it but applies none of
    its effects (a spec that sets prob > 0 is refused)."""

    prob: float = field(0.0, "probability of adding noise")
    hist_eq: bool = field(False, "histogram equalization")
    inverse: bool = field(False, "colour inversion")
    decolorize: bool = field(False, "grayscale")
    gauss_blur: bool = field(False, "Gaussian blur")
    jpeg: float = field(-1.0, "JPEG quality (-1: none)")
    posterize: bool = field(False, "posterization")
    erode: bool = field(False, "erosion")
    saltpepper: bool = field(False, "salt-and-pepper noise")
    clahe: bool = field(False, "local histogram equalization")
    convert_to_hsv: bool = field(False, "HSV colour space")
    convert_to_lab: bool = field(False, "Lab colour space")


@dataclass
class AnnotatedTransformationParameter(TransformationParameter):
    """transform_param of AnnotatedData and DetectionOutput: Caffe's fields plus SSD's."""

    crop_h: int = field(0, "crop height (with crop_w; crop_size overrides)", min=0)
    crop_w: int = field(0, "crop width (with crop_h)", min=0)
    resize_param: ResizeParameter | None = field(None, "resize every image (after the crop "
                                                       "sampling)")
    noise_param: NoiseParameter | None = field(None, "the fork's noise policy (not applied)")
    distort_param: DistortionParameter | None = field(None, "photometric distortion (encoded "
                                                            "records)")
    expand_param: ExpansionParameter | None = field(None, "zoom out before sampling")
    emit_constraint: EmitConstraint | None = field(None, "which boxes a crop keeps (none: any "
                                                         "box overlapping the crop)")

    def check(self, v: Check) -> None:
        super().check(v)
        r = self.resize_param
        if r is not None and (r.height <= 0 or r.width <= 0):
            v.fail("resize_param", "resize_param needs height and width > 0",
                   "give resize_param.height and width")
        if self.expand_param is not None and self.expand_param.max_expand_ratio <= 1:
            v.fail("expand_param", "expand_param.max_expand_ratio must be > 1",
                   "give e.g. max_expand_ratio: 4")
        if self.noise_param is not None and self.noise_param.prob > 0:
            v.fail("noise_param", "noise_param is not applied by caffe-py",
                   "remove noise_param (SSD's own nets do not use it)")


# --- Faster R-CNN and R-FCN -----------------------------------------------------------------
@dataclass
class ROIPoolingParameter(Message):
    """Max pooling of each region of interest to a fixed grid (Fast R-CNN's
    ROIPoolingParameter)."""

    pooled_h: int = field(0, "the output height (> 0)", min=0)
    pooled_w: int = field(0, "the output width (> 0)", min=0)
    spatial_scale: float = field(1.0, "image coordinates x spatial_scale = feature map "
                                      "coordinates, e.g. 1/16")

    def check(self, v: Check) -> None:
        if self.pooled_h <= 0 or self.pooled_w <= 0:
            v.fail("pooled_h" if self.pooled_h <= 0 else "pooled_w",
                   "pooled_h and pooled_w must be > 0", "give the output grid, e.g. 7 x 7")
        positive_scale(v, self.spatial_scale)


def positive_scale(v: Check, scale: float | None) -> None:
    """spatial_scale maps image coordinates onto the feature map: 0, a negative or a
    non-finite value pooled every region from one pixel, or failed converting NaN."""
    if scale is not None and not (math.isfinite(scale) and scale > 0):
        v.fail("spatial_scale", f"spatial_scale {scale:g} is not a positive finite number",
               "give the feature map's scale, e.g. 0.0625 (1/16)")


@dataclass
class PSROIPoolingParameter(Message):
    """Position-sensitive average pooling of each region (R-FCN's PSROIPoolingParameter)."""

    spatial_scale: float | None = field(None, "image coordinates x spatial_scale = feature map "
                                              "coordinates (required)")
    output_dim: int | None = field(None, "output channels (required)", min=1)
    group_size: int | None = field(None, "the k of the k x k grid, also the output size "
                                         "(required)", min=1)

    def check(self, v: Check) -> None:
        for key in ("spatial_scale", "output_dim", "group_size"):
            if getattr(self, key) is None:
                v.fail(key, f"psroi_pooling_param.{key} is not set (required)",
                       f"give {key}")
        positive_scale(v, self.spatial_scale)


@dataclass
class SmoothL1LossParameter(Message):
    """Faster R-CNN's SmoothL1LossParameter."""

    sigma: float = field(1.0, "0.5 (sigma x)^2 where |x| < 1 / sigma^2, else |x| - 0.5 / "
                              "sigma^2")

    def check(self, v: Check) -> None:
        if not (math.isfinite(self.sigma) and self.sigma > 0):   # 1 / sigma^2 divides by it
            v.fail("sigma", f"sigma {self.sigma:g} is not a positive finite number",
                   "give sigma > 0 (Faster R-CNN's RPN uses 3, its head 1)")


# AnnotatedData reads data_param as Data does.
ANNOTATED_DATA_BLOCKS = {"annotated_data_param": AnnotatedDataParameter,
                         "data_param": DataParameter,
                         "transform_param": AnnotatedTransformationParameter}
