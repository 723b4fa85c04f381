"""SSD's AnnotatedDatum records, label maps, VOC annotations and `cpy convert annoset`: the
wire format both ways, what the converter reads from an XML file, and its errors.
(tests/golden/forks/test_annotated_golden.py holds the bytes to the fork's converter.)"""
from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from caffe_py.cli import cli
from caffe_py.errors import DataError
from caffe_py.io.db.lmdb_store import open_db
from caffe_py.io.formats.annotated import (
    BBOX,
    AnnotatedDatum,
    Annotation,
    AnnotationGroup,
    NormalizedBBox,
    decode_annotated,
    decode_annotated_record,
    encode_annotated,
)
from caffe_py.io.formats.datum import Datum, encode_datum
from caffe_py.io.formats.labelmap import (
    LabelMapItem,
    name_to_label,
    read_label_map,
    write_label_map,
)
from caffe_py.tools.annoset import AnnosetOptions, convert_annoset, read_voc_xml

LABELS = {"cat": 1, "dog": 2}


def test_annotated_datum_round_trip_keeps_every_field():
    record = AnnotatedDatum(Datum(3, 2, 2, bytes(range(12)), -1, encoded=False), BBOX, [
        AnnotationGroup(2, [Annotation(0, NormalizedBBox(0.1, 0.2, 0.5, 0.75, difficult=True)),
                            Annotation(1, NormalizedBBox(0.0, 0.0, 1.0, 1.0, label=2,
                                                         score=0.5, size=1.0))]),
        AnnotationGroup(1, [Annotation(0, NormalizedBBox(0.3, 0.3, 0.4, 0.4, difficult=False))])])
    back = decode_annotated(encode_annotated(record))
    assert back == AnnotatedDatum(back.datum, BBOX, back.annotation_group)
    assert back.datum.label == -1 and back.datum.data == bytes(range(12))
    assert back.annotation_group[0].annotation[1].bbox == NormalizedBBox(
        0.0, 0.0, 1.0, 1.0, label=2, score=0.5, size=1.0)
    np.testing.assert_allclose(back.boxes(), [[2, 0, .1, .2, .5, .75, 1], [2, 1, 0, 0, 1, 1, 0],
                                              [1, 0, .3, .3, .4, .4, 0]], rtol=1e-7)


def test_a_plain_datum_is_not_an_annotated_datum():
    plain = encode_datum(Datum(1, 1, 2, b"\x01\x02", 3))
    with pytest.raises(DataError, match="holds no image: not an AnnotatedDatum"):
        decode_annotated_record(plain, source="db", key=b"00000000")
    with pytest.raises(DataError, match="record '7' is not an AnnotatedDatum"):
        decode_annotated_record(b"\x0a\xff", source="db", key=b"7")


def test_label_map_read_write(tmp_path):
    path = tmp_path / "map.prototxt"
    write_label_map(path, [LabelMapItem("bg", 0, "background"), LabelMapItem("cat", 1, "Cat")])
    items = read_label_map(path)
    assert items == [LabelMapItem("bg", 0, "background"), LabelMapItem("cat", 1, "Cat")]
    twice = items + [LabelMapItem("cat", 5, "cat")]
    assert name_to_label(twice) == {"bg": 0, "cat": 5}
    with pytest.raises(DataError, match="the name 'cat' appears twice"):
        name_to_label(twice, strict=True, source="map")
    (tmp_path / "bad.prototxt").write_text('item { name: "x" }\n')
    with pytest.raises(DataError, match="bad.prototxt:1: a label map item needs a name and a "
                                        "label"):
        read_label_map(tmp_path / "bad.prototxt")
    with pytest.raises(DataError, match="cannot read the label map"):
        read_label_map(tmp_path / "missing.prototxt")


def voc(objects: str, size: str = "<size><width>40</width><height>20</height></size>") -> str:
    return f"<annotation>{size}{objects}</annotation>"


def obj(name: str, box: tuple[int, int, int, int], difficult: int = 0) -> str:
    x0, y0, x1, y1 = box
    return (f"<object><name>{name}</name><difficult>{difficult}</difficult><bndbox>"
            f"<xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox>"
            "</object>")


def test_voc_xml_groups_by_label_with_instance_ids(tmp_path):
    path = tmp_path / "a.xml"
    path.write_text(voc(obj("dog", (4, 2, 20, 10)) + obj("cat", (0, 0, 40, 20), 1)
                        + obj("dog", (10, 5, 30, 15))))
    groups = read_voc_xml(path, 99, 99, LABELS)
    assert [g.group_label for g in groups] == [2, 1]
    dogs = groups[0].annotation
    assert [a.instance_id for a in dogs] == [0, 1]
    b = dogs[0].bbox
    assert (b.xmin, b.ymin, b.xmax, b.ymax, b.difficult) == (
        pytest.approx(0.1), pytest.approx(0.1), pytest.approx(0.5), pytest.approx(0.5), False)
    assert groups[1].annotation[0].bbox.difficult is True


def test_voc_xml_without_a_size_uses_the_image(tmp_path):
    path = tmp_path / "a.xml"
    path.write_text(voc(obj("cat", (5, 5, 10, 10)), size=""))
    assert read_voc_xml(path, 10, 20, LABELS)[0].annotation[0].bbox.xmax == pytest.approx(0.5)


@pytest.mark.parametrize(("objects", "message"), [
    (obj("bird", (0, 0, 1, 1)), "unknown class name 'bird'"),
    (obj("cat", (0, 0, 1, 1)).replace("<xmax>1</xmax>", "<xmax>1.5</xmax>"),
     r"bndbox/xmax '1.5' is not an integer"),
    ("<object><bndbox><xmin>0</xmin></bndbox><name>cat</name></object>",
     "bndbox comes before its name"),
])
def test_voc_xml_errors(tmp_path, objects, message):
    path = tmp_path / "a.xml"
    path.write_text(voc(objects))
    with pytest.raises(DataError, match=message):
        read_voc_xml(path, 20, 40, LABELS)


def small_set(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "img").mkdir()
    (tmp_path / "xml").mkdir()
    lines = []
    for i, (h, w) in enumerate([(20, 40), (30, 30), (16, 24)]):
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(
            tmp_path / "img" / f"{i}.png")
        if i != 2:  # image 2 has no annotation file: a record without boxes
            (tmp_path / "xml" / f"{i}.xml").write_text(voc(obj("cat", (1, 2, 10, 12)), ""))
        lines.append(f"img/{i}.png xml/{i}.xml")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    write_label_map(tmp_path / "map.prototxt", [LabelMapItem("bg", 0, "bg"),
                                                LabelMapItem("cat", 1, "cat")])
    return tmp_path


def records(path):
    with open_db(path) as db:
        keys, values = db.cursor().read(len(db))
        return [(bytes(k), decode_annotated(bytes(v))) for k, v in zip(keys, values,
                                                                      strict=True)]


def test_convert_annoset_raw_and_resized(tmp_path):
    root = small_set(tmp_path)
    options = AnnosetOptions(label_map_file=str(root / "map.prototxt"), resize_width=8,
                             resize_height=6)
    result = convert_annoset(root, root / "list.txt", tmp_path / "db", options)
    assert result.records == 3
    got = records(tmp_path / "db")
    assert [k for k, _ in got] == [b"00000000_img/0.png", b"00000001_img/1.png",
                                   b"00000002_img/2.png"]
    first = got[0][1]
    assert (first.datum.channels, first.datum.height, first.datum.width) == (3, 6, 8)
    assert first.datum.encoded is False and first.datum.label == -1 and first.type == BBOX
    assert first.annotation_group[0].annotation[0].bbox.xmax == pytest.approx(10 / 40)
    assert got[2][1].annotation_group == []


def test_convert_annoset_cli_and_db_info(tmp_path):
    root = small_set(tmp_path)
    runner = CliRunner()
    done = runner.invoke(cli, ["convert", "annoset", f"{root}/", str(root / "list.txt"),
                               str(tmp_path / "db"), "--label-map-file",
                               str(root / "map.prototxt"), "--encoded", "--encode-type", "png"])
    assert done.exit_code == 0, done.output
    assert "3 records" in done.output
    stored = records(tmp_path / "db")[1][1].datum
    assert stored.encoded and stored.data == (root / "img" / "1.png").read_bytes()
    info = runner.invoke(cli, ["db-info", str(tmp_path / "db")])
    assert info.exit_code == 0, info.output
    assert "(AnnotatedDatum, lmdb)" in info.output
    assert "boxes     2 (+ 0 difficult); 1 records without a box" in info.output


def test_image_sizes_as_get_image_size_writes_them(tmp_path):
    root = small_set(tmp_path)
    done = CliRunner().invoke(cli, ["convert", "image-sizes", str(root), str(root / "list.txt"),
                                    str(tmp_path / "sizes.txt")])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "sizes.txt").read_text() == "0 20 40\n1 30 30\n2 16 24\n"
    (root / "img" / "1.png").unlink()
    done = CliRunner().invoke(cli, ["convert", "image-sizes", str(root), str(root / "list.txt"),
                                    str(tmp_path / "sizes.txt")])
    assert done.exit_code == 1 and "list.txt:2: image" in done.output


def test_convert_annoset_errors(tmp_path):
    root = small_set(tmp_path)
    runner = CliRunner()
    done = runner.invoke(cli, ["convert", "annoset", str(root), str(root / "list.txt"),
                               str(tmp_path / "db")])
    assert done.exit_code == 1 and "Missing option '--label-map-file'" in done.output
    (root / "list.txt").write_text("img/0.png\n")
    done = runner.invoke(cli, ["convert", "annoset", str(root), str(root / "list.txt"),
                               str(tmp_path / "db"), "--label-map-file",
                               str(root / "map.prototxt")])
    assert done.exit_code == 1
    assert "list.txt:1: 'img/0.png' names no annotation" in done.output


def test_convert_annoset_resumes_only_the_list_it_began(tmp_path):
    root = small_set(tmp_path)
    listfile = root / "list.txt"
    options = AnnosetOptions(label_map_file=str(root / "map.prototxt"))

    class Stop(Exception):
        pass

    class StopAfterOne:
        def __init__(self):
            self.seen = 0

        def update(self, k):
            self.seen += k
            if self.seen >= 1:  # the first record is put (and kept) before this
                raise Stop

        def close(self):
            pass

    with pytest.raises(Stop):
        convert_annoset(root, listfile, tmp_path / "db", options,
                        progress=lambda total, what: StopAfterOne())
    assert len(records(tmp_path / "db.partial")) == 1
    # the same list file, its last two images swapped: record 0's key still matches
    first, second, third = listfile.read_text().splitlines()
    listfile.write_text("\n".join([first, third, second]) + "\n")
    with pytest.raises(DataError) as caught:
        convert_annoset(root, listfile, tmp_path / "db", options, resume=True)
    size = listfile.stat().st_size
    assert str(caught.value) == (
        f"{tmp_path / 'db.partial'}: cannot resume: it was begun from {listfile} ({size:,} "
        "bytes) as it was then (its first bytes have changed since); delete it and convert "
        "again, or resume with the inputs it was begun from")
    listfile.write_text("\n".join([first, second, third]) + "\n")
    result = convert_annoset(root, listfile, tmp_path / "db", options, resume=True)
    assert (result.records, result.written) == (3, 2)
    assert [k for k, _ in records(tmp_path / "db")] == [
        b"00000000_img/0.png", b"00000001_img/1.png", b"00000002_img/2.png"]


def test_annoset_options_are_checked_as_imageset_options_are():
    with pytest.raises(DataError, match="^--resize-width and --resize-height must be positive$"):
        AnnosetOptions(label_map_file="map.prototxt", resize_width=-8, resize_height=-6).check()
    with pytest.raises(DataError, match="^--resize-width and --resize-height go together"):
        AnnosetOptions(label_map_file="map.prototxt", resize_width=8).check()


def test_a_key_past_lmdbs_size_names_the_list_line(tmp_path):
    root = small_set(tmp_path)
    name = "img/" + "x" * 520 + ".png"
    (root / "list.txt").write_text(f"img/0.png xml/0.xml\n{name} xml/1.xml\n")
    with pytest.raises(DataError) as caught:
        convert_annoset(root, root / "list.txt", tmp_path / "db",
                        AnnosetOptions(label_map_file=str(root / "map.prototxt")))
    assert str(caught.value) == (f"{root / 'list.txt'}:2: the key for {name!r} is longer than "
                                 "LMDB's 511 bytes; shorten the path")
    assert not (tmp_path / "db").exists() and not (tmp_path / "db.partial").exists()
