"""The blocks of the data layers: Input, DummyData, Data (with its transform_param), ImageData,
HDF5Data, HDF5Output, MemoryData and WindowData."""
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
    backend: str = field("LMDB", "database kind: LMDB or LEVELDB (caffe-py's YAML defaults to "
                                 "LMDB; cpy import-prototxt writes LEVELDB, Caffe's default, "
                                 "where a prototxt leaves it out)",
                         choices={"LEVELDB": 0, "LMDB": 1})
    prefetch: int = field(4, "batches buffered ahead per replica", min=1)
    rand_skip: int = field(0, "skip up to this many records at the start (random)", min=0)
    mean_file: str = field("", "deprecated; use transform_param.mean_file", path=True)
    scale: float = field(1.0, "deprecated; use transform_param.scale")
    crop_size: int = field(0, "deprecated; use transform_param.crop_size", min=0)
    mirror: bool = field(False, "deprecated; use transform_param.mirror")
    force_encoded_color: bool = field(False, "decode encoded images as colour")

    def check(self, v: Check) -> None:
        if not self.source:
            v.fail(None, "data_param.source is not set", "name the database directory to read")


@dataclass
class ImageDataParameter(Message):
    """Images named by a list file of ``path label`` lines (Caffe's ImageDataParameter)."""

    source: str = field("", "the list file: one 'path label' per line (split at the last space)",
                        path=True)
    batch_size: int = field(1, "images per batch (per replica)", min=1)
    rand_skip: int = field(0, "skip up to this many images at the start (random)", min=0)
    shuffle: bool = field(False, "shuffle the list at the start and after every pass, as "
                                 "Caffe does (seeded by random_seed)")
    new_height: int = field(0, "resize to this height (with new_width; OpenCV INTER_LINEAR)",
                            min=0)
    new_width: int = field(0, "resize to this width (with new_height)", min=0)
    is_color: bool = field(True, "read 3 channels (BGR); false: 1 gray channel")
    root_folder: str = field("", "the folder the list's paths are relative to (default: the "
                                 "list file's folder, then the current directory)", path=True)
    scale: float = field(1.0, "deprecated; use transform_param.scale")
    mean_file: str = field("", "deprecated; use transform_param.mean_file", path=True)
    crop_size: int = field(0, "deprecated; use transform_param.crop_size", min=0)
    mirror: bool = field(False, "deprecated; use transform_param.mirror")

    def check(self, v: Check) -> None:
        if not self.source:
            v.fail(None, "image_data_param.source is not set", "name the list file to read")
        if (self.new_height > 0) != (self.new_width > 0):
            v.fail("new_height" if self.new_height else "new_width",
                   "new_height and new_width go together", "set both (or neither)")


@dataclass
class HDF5DataParameter(Message):
    """Rows of HDF5 files named by a list file (Caffe's HDF5DataParameter); each top reads
    the dataset of its own name."""

    source: str = field("", "a text file listing .h5 files, one per line", path=True)
    batch_size: int = field(0, "rows per batch (per replica)", min=1)
    shuffle: bool = field(False, "shuffle the files, and the rows within each file, on every "
                                 "pass, as Caffe does")

    def check(self, v: Check) -> None:
        if not self.source:
            v.fail(None, "hdf5_data_param.source is not set", "name the list of .h5 files")


@dataclass
class HDF5OutputParameter(Message):
    """Where an HDF5Output layer writes its bottoms (Caffe's HDF5OutputParameter)."""

    file_name: str = field("", "the .h5 file to write (datasets 'data' and 'label')",
                           path=True)

    def check(self, v: Check) -> None:
        if not self.file_name:
            v.fail(None, "hdf5_output_param.file_name is not set", "name the .h5 file to write")


@dataclass
class MemoryDataParameter(Message):
    """The shape of batches a MemoryData layer is given from Python (MemoryDataParameter)."""

    batch_size: int = field(0, "rows per batch", min=1)
    channels: int = field(0, "C of every row", min=1)
    height: int = field(0, "H of every row", min=1)
    width: int = field(0, "W of every row", min=1)


@dataclass
class WindowDataParameter(Message):
    """R-CNN windows (Caffe's WindowDataParameter): crops of object and background windows of
    images listed in a window file."""

    source: str = field("", "the window file", path=True)
    scale: float = field(1.0, "multiply after the mean is subtracted (WindowData reads this, "
                              "not transform_param.scale)")
    mean_file: str = field("", "deprecated; use transform_param.mean_file", path=True)
    batch_size: int = field(0, "windows per batch (per replica)", min=1)
    crop_size: int = field(0, "deprecated; use transform_param.crop_size", min=0)
    mirror: bool = field(False, "deprecated; use transform_param.mirror")
    fg_threshold: float = field(0.5, "a window with overlap >= this is foreground")
    bg_threshold: float = field(0.5, "a window with overlap < this is background")
    fg_fraction: float = field(0.25, "the fraction of each batch that is foreground", min=0,
                               max=1)
    context_pad: int = field(0, "pixels of context around each window after warping", min=0)
    crop_mode: str = field("warp", "warp: the window to crop_size x crop_size; square: the "
                                   "tightest square around it", choices=("warp", "square"))
    cache_images: bool = field(False, "keep the image files in memory")
    root_folder: str = field("", "prefixed to the window file's image paths (as a folder)",
                             path=True)

    def check(self, v: Check) -> None:
        if not self.source:
            v.fail(None, "window_data_param.source is not set", "name the window file to read")
