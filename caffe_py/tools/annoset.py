"""``cpy convert annoset``: images and their Pascal-VOC XML annotations into an LMDB (or
LevelDB) of SSD's AnnotatedDatum records, as SSD's convert_annoset (and create_annoset.py,
which calls it) writes them.

The list file has one ``image annotation`` line per record (both relative to ROOT, split at
the last space); keys are ``%08d_<image>``. The image is stored as convert_imageset stores it
(BGR pixels, or with --encoded the file itself, re-encoded only when resized or another
encode type is asked for), with label -1; its boxes are read from the XML: per ``object``
its ``name`` (looked up in the label map), ``difficult`` and ``bndbox`` (integer pixels,
divided by the ``size`` the XML gives, else by the image's), grouped by label in order of
appearance with instance ids 0, 1, ... per label. An annotation file that does not exist gives
a record without boxes, as in the fork.
"""
from __future__ import annotations

import logging
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import DataError
from ..io.db.db import open_db
from ..io.db.image_list import last_space_lines
from ..io.formats.annotated import (
    BBOX,
    AnnotatedDatum,
    Annotation,
    AnnotationGroup,
    NormalizedBBox,
    encode_annotated,
)
from ..io.formats.datum import Datum
from ..io.formats.images import (
    ENCODE_TYPES,
    check_image_file,
    encode_image,
    extension_type,
    load_image,
    resize_linear,
)
from ..io.formats.labelmap import name_to_label, read_label_map
from .convert import (
    ConvertResult,
    ProgressFactory,
    check_image_options,
    list_in_order,
    list_key,
    no_progress,
    write_source,
)

log = logging.getLogger(__name__)
F32 = np.float32


@dataclass
class AnnosetOptions:
    """convert_annoset's flags (detection annotations, label_type xml)."""

    label_map_file: str = ""
    gray: bool = False
    shuffle: bool = False
    seed: int = 0
    resize_width: int = 0
    resize_height: int = 0
    check_size: bool = False
    check_label: bool = False
    encoded: bool = False
    encode_type: str = ""

    def check(self) -> None:
        if not self.label_map_file:
            raise DataError("--label-map-file is required: the LabelMap prototxt that gives "
                            "each class name its label")
        check_image_options(self.resize_width, self.resize_height, self.encode_type)


@dataclass
class AnnosetEntry:
    image: str
    annotation: str
    line: int


def read_annoset_list(listfile: str | Path) -> list[AnnosetEntry]:
    """``image annotation`` lines (split at the last space); blank lines skipped."""
    return [AnnosetEntry(image.strip(), anno, number)
            for number, image, anno in last_space_lines(
                Path(listfile), form="image annotation.xml", missing="names no annotation",
                strip=True)]


def read_voc_xml(path: Path, height: int, width: int, labels: dict[str, int]
                 ) -> list[AnnotationGroup]:
    """The boxes of a VOC annotation file, as the fork's ReadXMLToAnnotatedDatum reads them
    (``height`` x ``width``: the image's size, used when the XML gives none)."""
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise DataError(f"{path}: not a readable XML annotation ({exc})") from None
    size = root.find("size")
    if size is not None and size.findtext("height") and size.findtext("width"):
        try:
            height, width = int(size.findtext("height", "")), int(size.findtext("width", ""))
        except ValueError:
            raise DataError(f"{path}: size/height and size/width must be integers") from None
    if height <= 0 or width <= 0:
        raise DataError(f"{path}: no valid image width/height")
    groups: list[AnnotationGroup] = []
    for obj in root.iter("object"):
        anno: Annotation | None = None
        difficult = False
        for child in obj:
            if child.tag == "name":
                name = (child.text or "").strip()
                if name not in labels:
                    raise DataError(f"{path}: unknown class name '{name}' (not in the label "
                                    "map); add it to the label map file")
                group = next((g for g in groups if g.group_label == labels[name]), None)
                if group is None:
                    group = AnnotationGroup(labels[name])
                    groups.append(group)
                instance = (group.annotation[-1].instance_id or 0) + 1 if group.annotation \
                    else 0
                anno = Annotation(instance)
                group.annotation.append(anno)
            elif child.tag == "difficult":
                difficult = (child.text or "").strip() == "1"
            elif child.tag == "bndbox":
                if anno is None:
                    raise DataError(f"{path}: an object's bndbox comes before its name")
                corners = []
                for key in ("xmin", "ymin", "xmax", "ymax"):
                    text = (child.findtext(key) or "0").strip()
                    try:
                        corners.append(int(text))
                    except ValueError:
                        raise DataError(f"{path}: bndbox/{key} {text!r} is not an integer "
                                        "(SSD's convert_annoset reads it as 0); round the "
                                        "coordinates") from None
                x0, y0, x1, y1 = corners
                anno.bbox = NormalizedBBox(float(F32(x0) / F32(width)),
                                           float(F32(y0) / F32(height)),
                                           float(F32(x1) / F32(width)),
                                           float(F32(y1) / F32(height)), difficult=difficult)
    return groups


class AnnosetSource:
    """The records of a list of images and VOC annotations."""

    def __init__(self, root: str | Path, listfile: str | Path, options: AnnosetOptions):
        options.check()
        self.root, self.listfile, self.options = Path(root), Path(listfile), options
        self.inputs = [self.listfile, Path(options.label_map_file)]
        self.labels = name_to_label(read_label_map(options.label_map_file),
                                    strict=options.check_label,
                                    source=options.label_map_file)
        self.entries = list_in_order(read_annoset_list(listfile), lambda e: e.image,
                                     lambda e: e.line, self.listfile, options.shuffle,
                                     options.seed)
        self.count = len(self.entries)

    def key(self, index: int) -> bytes:
        return list_key(index, self.entries[index].image)

    def records(self, start: int) -> Iterator[tuple[bytes, AnnotatedDatum]]:
        reference = None
        for index in range(start, self.count):
            entry = self.entries[index]
            record, shape = self.record(entry)
            if self.options.check_size:
                if reference is None:
                    reference = shape
                elif shape != reference:
                    raise DataError(f"{self.listfile}:{entry.line}: {entry.image} is "
                                    f"{'x'.join(map(str, shape))} but the first image is "
                                    f"{'x'.join(map(str, reference))}; resize or drop "
                                    "--check-size")
            yield self.key(index), record

    def record(self, entry: AnnosetEntry) -> tuple[AnnotatedDatum, tuple[int, ...]]:
        opts = self.options
        file = self.root / entry.image
        try:
            check_image_file(file)
            original = load_image(file, color=not opts.gray)
        except DataError as exc:
            raise DataError(f"{self.listfile}:{entry.line}: {exc}") from None
        array = original
        resized = opts.resize_height > 0
        if resized:
            array = resize_linear(array, opts.resize_height, opts.resize_width)
        c, h, w = array.shape
        if not opts.encoded:
            datum = Datum(c, h, w, array.tobytes(), -1, encoded=False)
        else:
            wanted = opts.encode_type or extension_type(entry.image)
            if not resized and opts.encode_type and extension_type(entry.image) == wanted:
                data = file.read_bytes()  # the fork's ReadFileToDatum: the file as it is
            else:
                data = encode_image(array, wanted if wanted in ENCODE_TYPES else "png")
            datum = Datum(c, h, w, data, -1, encoded=True)
        record = AnnotatedDatum(datum, BBOX)
        anno = self.root / entry.annotation
        if anno.exists():
            color = load_image(file, color=True) if opts.gray else original
            record.annotation_group = read_voc_xml(anno, color.shape[1], color.shape[2],
                                                   self.labels)
        return record, array.shape


def convert_annoset(root: str | Path, listfile: str | Path, db: str | Path,
                    options: AnnosetOptions, *, resume: bool = False,
                    progress: ProgressFactory = no_progress,
                    backend: str = "lmdb") -> ConvertResult:
    """Write the AnnotatedDatum database (through ``db.partial``, as the other converters)."""
    return write_source(AnnosetSource(root, listfile, options), db, resume=resume,
                        progress=progress, backend=backend, encode=encode_annotated)


def is_annotated(path: str | Path, backend: str = "lmdb") -> bool:
    """Whether the database's first record is an AnnotatedDatum (not a plain Datum)."""
    from ..io.formats.annotated import decode_annotated
    from ..io.formats.wire import WireError

    with open_db(path, backend) as db:
        _, value = db.first()
    try:
        record = decode_annotated(bytes(value))
    except WireError:
        return False
    return bool(record.datum.data or record.datum.float_data)


def annoset_info(path: str | Path, *, progress: ProgressFactory = no_progress,
                 backend: str = "lmdb") -> list[str]:
    """``cpy db-info`` of an AnnotatedDatum database: records, image sizes, boxes per label
    (difficult ones counted apart), after checking that every record parses."""
    from collections import Counter

    from ..io.formats.annotated import decode_annotated_record
    from ..io.formats.datum import datum_to_array, decode_image, format_key

    began = time.perf_counter()
    sizes: Counter = Counter()
    boxes: Counter = Counter()
    difficult: Counter = Counter()
    encoded = empty = 0
    first = last = b""
    with open_db(path, backend) as db:
        count = len(db)
        bar = progress(count, Path(path).name)
        try:
            for key, value in db:
                record = decode_annotated_record(value, source=str(path), key=key)
                datum = record.datum
                try:
                    shape = (decode_image(datum.data).shape if datum.encoded
                             else datum_to_array(datum).shape)
                except DataError as exc:
                    raise DataError(f"{path}: record {format_key(key)}: {exc}") from None
                sizes[shape] += 1
                encoded += bool(datum.encoded)
                rows = record.boxes()
                empty += len(rows) == 0
                for label, _, *_, hard in rows.tolist():
                    (difficult if hard else boxes)[int(label)] += 1
                first = first or bytes(key)
                last = bytes(key)
                bar.update(1)
        finally:
            bar.close()
    lines = [f"database  {path} (AnnotatedDatum, {backend})", f"records   {count}",
             f"images    {encoded} encoded, {count - encoded} raw; "
             + ", ".join(f"{'x'.join(map(str, s))} ({n})" for s, n in sizes.most_common(5))
             + (" ..." if len(sizes) > 5 else ""),
             f"keys      {format_key(first)} .. {format_key(last)}",
             f"boxes     {sum(boxes.values())} (+ {sum(difficult.values())} difficult); "
             f"{empty} records without a box"]
    for label in sorted(set(boxes) | set(difficult)):
        lines.append(f"  label {label:>3}  {boxes[label]:>8}  difficult {difficult[label]}")
    lines.append(f"checked   every record parses, {time.perf_counter() - began:.1f} s")
    return lines


def write_image_sizes(root: str | Path, listfile: str | Path, out: str | Path) -> int:
    """``cpy convert image-sizes``: one ``name height width`` line per list entry (the image's
    file name without its extension), as SSD's get_image_size writes the name_size_file that
    DetectionEvaluate and DetectionOutput's save_output_param read. The list is an annoset's
    (or any ``image label`` list). Returns the number of lines."""
    from PIL import Image, UnidentifiedImageError

    lines = []
    for entry in read_annoset_list(listfile):
        path = Path(root) / entry.image
        try:
            check_image_file(path)
            with Image.open(path) as image:  # reads the header only
                width, height = image.size
        except FileNotFoundError:
            raise DataError(f"{listfile}:{entry.line}: image {path} not found") from None
        except UnidentifiedImageError:
            raise DataError(f"{listfile}:{entry.line}: {path} is not an image") from None
        except DataError as exc:
            raise DataError(f"{listfile}:{entry.line}: {exc}") from None
        lines.append(f"{Path(entry.image).stem} {height} {width}\n")
    Path(out).write_text("".join(lines), encoding="utf-8")
    return len(lines)
