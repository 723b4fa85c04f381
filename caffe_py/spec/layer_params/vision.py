"""The blocks of the vision layers: Convolution (and Deconvolution), Pooling, LRN."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from ...errors import one_line
from ..schema import Check, Message, field, is_set
from .shared import ENGINE_NUMBERS, POOL_METHODS, FillerParameter

log = logging.getLogger(__name__)


@dataclass
class ConvolutionParameter(Message):
    """Convolution and Deconvolution settings (Caffe's ConvolutionParameter)."""

    num_output: int = field(0, "the number of output channels", min=0)
    bias_term: bool = field(True, "add a learnable bias of shape (num_output,)")
    pad: list[int] = field([], "zero padding: once, or once per spatial axis (default 0)", min=0)
    kernel_size: list[int] = field([], "kernel size: once, or once per spatial axis", min=0)
    stride: list[int] = field([], "stride: once, or once per spatial axis (default 1)", min=0)
    dilation: list[int] = field([], "kernel dilation: once, or once per spatial axis "
                                    "(default 1)", min=0)
    pad_h: int = field(0, "2-D only: padding along H (instead of pad)", min=0)
    pad_w: int = field(0, "2-D only: padding along W (instead of pad)", min=0)
    kernel_h: int = field(0, "2-D only: kernel height (instead of kernel_size)", min=0)
    kernel_w: int = field(0, "2-D only: kernel width (instead of kernel_size)", min=0)
    stride_h: int = field(0, "2-D only: stride along H (instead of stride)", min=0)
    stride_w: int = field(0, "2-D only: stride along W (instead of stride)", min=0)
    group: int = field(1, "split channels and outputs into this many independent groups", min=1)
    weight_filler: FillerParameter | None = field(None, "weight init (none: zeros, as Caffe)")
    bias_filler: FillerParameter | None = field(None, "bias init (none: zeros, as Caffe)")
    engine: str = field("DEFAULT", "implementation (all map to torch's convolution)",
                        choices=ENGINE_NUMBERS)
    axis: int = field(1, "the channel axis; the axes after it are spatial")
    force_nd_im2col: bool = field(False, "accepted for compatibility; has no effect")
    hole: int | None = field(None, "DeepLab v1's fork: the kernel's dilation on both axes (its "
                                   "atrous 'hole'); read as dilation", min=1)
    hole_h: int | None = field(None, "DeepLab v1's fork: dilation along H", min=1)
    hole_w: int | None = field(None, "DeepLab v1's fork: dilation along W", min=1)

    def check(self, v: Check) -> None:
        holes = [key for key in ("hole", "hole_h", "hole_w") if getattr(self, key) is not None]
        if not holes:
            return
        if is_set(self, "dilation"):
            v.fail(holes[0], f"{holes[0]} (DeepLab v1's dilation) and dilation are both set",
                   "keep dilation (Caffe 1.0's field)")
        if self.hole is not None and len(holes) > 1:
            v.fail(holes[1], f"hole and {holes[1]} are both set", "give hole, or hole_h and "
                                                                  "hole_w")
        if self.hole is not None:
            self.dilation = [self.hole]
        else:
            self.dilation = [self.hole_h or 1, self.hole_w or 1]
        log.info("note: " + one_line(
            f"{', '.join(holes)} (DeepLab v1's fork) read as dilation: {self.dilation}",
            file=v.src.file, line=v.node.line_of(holes[0]),
            path=f"{v.path}.{holes[0]}" if v.path else holes[0]))


@dataclass
class PoolingParameter(Message):
    """Pooling settings (Caffe's PoolingParameter)."""

    pool: str = field("MAX", "pooling method", choices=POOL_METHODS)
    pad: int = field(0, "padding on each side (MAX and AVE only)", min=0)
    pad_h: int = field(0, "padding along H (instead of pad)", min=0)
    pad_w: int = field(0, "padding along W (instead of pad)", min=0)
    kernel_size: int = field(0, "square window size", min=0)
    kernel_h: int = field(0, "window height (instead of kernel_size)", min=0)
    kernel_w: int = field(0, "window width (instead of kernel_size)", min=0)
    stride: int = field(1, "step between windows", min=0)
    stride_h: int = field(0, "step along H (instead of stride)", min=0)
    stride_w: int = field(0, "step along W (instead of stride)", min=0)
    engine: str = field("DEFAULT", "implementation (all map to torch's pooling)",
                        choices=ENGINE_NUMBERS)
    global_pooling: bool = field(False, "pool over the whole H x W (no kernel, pad 0, stride 1)")
    round_mode: str = field("CEIL", "how the output size (H + 2 pad - kernel) / stride + 1 is "
                                    "rounded", choices={"CEIL": 0, "FLOOR": 1})
    ceil_mode: bool | None = field(
        None, "a fork's older spelling of round_mode (BVLC pull request 3057): true is CEIL, "
              "false is FLOOR")

    def check(self, v: Check) -> None:
        if self.ceil_mode is None:
            return
        if is_set(self, "round_mode"):
            v.fail("ceil_mode", "ceil_mode and round_mode are both set",
                   "keep round_mode (Caffe 1.0's field)")
        mode = "CEIL" if self.ceil_mode else "FLOOR"
        log.info("note: " + one_line(
            f"ceil_mode: {str(self.ceil_mode).lower()} (a fork's field) is read as "
            f"round_mode: {mode}", file=v.src.file, line=v.node.line_of("ceil_mode"),
            path=f"{v.path}.ceil_mode" if v.path else "ceil_mode"))
        self.round_mode = mode


@dataclass
class LRNParameter(Message):
    """Local response normalisation (Caffe's LRNParameter)."""

    local_size: int = field(5, "channels summed (ACROSS_CHANNELS) or the side of the square "
                               "window (WITHIN_CHANNEL); odd", min=1)
    alpha: float = field(1.0, "scale of the sum of squares")
    beta: float = field(0.75, "exponent")
    norm_region: str = field("ACROSS_CHANNELS", "normalise over nearby channels or a spatial "
                                                "window", choices={"ACROSS_CHANNELS": 0,
                                                                   "WITHIN_CHANNEL": 1})
    k: float = field(1.0, "ACROSS_CHANNELS: the constant added (WITHIN_CHANNEL uses 1)")
    engine: str = field("DEFAULT", "implementation (all map to torch)",
                        choices=ENGINE_NUMBERS)
