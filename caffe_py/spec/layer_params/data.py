"""The blocks of the data layers: Input, DummyData and Data (with its transform_param)."""
from __future__ import annotations

from dataclasses import dataclass

from ..schema import Check, Message, field
from .shared import BlobShape, FillerParameter


@dataclass
class InputParameter(Message):
    """The shapes of a net's inputs (Caffe's InputParameter)."""

    shape: list[BlobShape] = field([], "one shape per top, or one shape for every top")


@dataclass
class DummyDataParameter(Message):
    """Tops made by fillers (Caffe's DummyDataParameter)."""

    data_filler: list[FillerParameter] = field(
        [], "one filler for every top, or one per top (none: constant 0)")
    shape: list[BlobShape] = field([], "one shape for every top, or one per top")
    num: list[int] = field([], "legacy shape: N per top (or one for all)")
    channels: list[int] = field([], "legacy shape: C per top (or one for all)")
    height: list[int] = field([], "legacy shape: H per top (or one for all)")
    width: list[int] = field([], "legacy shape: W per top (or one for all)")

    def check(self, v: Check) -> None:
        legacy = any((self.num, self.channels, self.height, self.width))
        if legacy and self.shape:
            v.fail("shape", "both shape and the legacy num/channels/height/width are set",
                   "keep one of them")


@dataclass
class TransformationParameter(Message):
    """Data-layer preprocessing, in Caffe's order: crop -> mirror -> (x - mean) * scale."""

    scale: float = field(1.0, "multiply after the mean is subtracted")
    mirror: bool = field(False, "flip horizontally at random (TRAIN and TEST, as Caffe does)")
    crop_size: int = field(0, "square crop: random in TRAIN, centre in TEST (0: none)", min=0)
    mean_file: str = field("", "a BlobProto mean image (cpy compute-mean)", path=True)
    mean_value: list[float] = field([], "one mean, or one per channel")
    force_color: bool = field(False, "decode encoded images as 3 channels")
    force_gray: bool = field(False, "decode encoded images as 1 channel")

    def check(self, v: Check) -> None:
        if self.mean_file and self.mean_value:
            v.fail("mean_value", "mean_file and mean_value are both set", "keep one of them")
        if self.force_color and self.force_gray:
            v.fail("force_gray", "force_color and force_gray are both set", "keep one of them")


@dataclass
class DataParameter(Message):
    """Where a Data layer reads from."""

    source: str = field("", "the database directory", path=True)
    batch_size: int = field(0, "records per batch (per replica)", min=1)
    backend: str = field("LMDB", "database kind", choices=("LMDB",))
    prefetch: int = field(4, "batches buffered ahead per replica", min=1)
    rand_skip: int = field(0, "skip up to this many records at the start (random)", min=0)
    mean_file: str = field("", "deprecated; use transform_param.mean_file", path=True)
    scale: float = field(1.0, "deprecated; use transform_param.scale")
    crop_size: int = field(0, "deprecated; use transform_param.crop_size", min=0)
    mirror: bool = field(False, "deprecated; use transform_param.mirror")
    force_encoded_color: bool = field(False, "decode encoded images as colour")

    def check(self, v: Check) -> None:
        if not self.source:
            v.fail(None, "data_param.source is not set", "name the LMDB directory to read")
