"""db-info: the report's text, and records that do not decode or differ in shape."""
from __future__ import annotations

import numpy as np
import pytest
from support import write_db

from caffe_py.errors import DataError
from caffe_py.io.formats.datum import datum_from_array, encode_datum
from caffe_py.tools.dbinfo import db_info


def _db(path, values):
    write_db(path, values, key=b"%05d")
    return path


def test_report_text(tmp_path):
    labels = [3, 1, 3, 3, 12]
    values = [encode_datum(datum_from_array(np.full((3, 2, 4), i, np.uint8), label))
              for i, label in enumerate(labels)]
    info = db_info(_db(tmp_path / "db", values))
    lines = info.lines()
    assert lines[:-1] == [
        f"database  {tmp_path}/db (LMDB)",
        "records   5",
        "shape     3 x 2 x 4 (C x H x W), uint8, raw",
        "keys      '00000' .. '00004'",
        "labels    3 distinct",
        "   1         1   20.0%",
        "   3         3   60.0%",
        "  12         1   20.0%",
    ]
    assert lines[-1].startswith("checked   every record decodes, ")


def test_empty_database(tmp_path):
    assert db_info(_db(tmp_path / "db", [])).lines() == [
        f"database  {tmp_path}/db (LMDB)", "records   0", "(empty)"]


def test_record_that_does_not_parse_names_the_key(tmp_path):
    good = encode_datum(datum_from_array(np.zeros((1, 2, 2), np.uint8), 0))
    db = _db(tmp_path / "db", [good, good, good[:-3]])
    with pytest.raises(DataError) as info:
        db_info(db)
    assert str(info.value) == (f"{db}: record '00002' is not a Caffe Datum (field 4 runs past "
                               "the end (12 > 11 bytes)); rebuild the database with "
                               "`cpy convert`")


def test_record_with_wrong_data_size_names_the_key(tmp_path):
    good = datum_from_array(np.zeros((1, 2, 2), np.uint8), 0)
    bad = datum_from_array(np.zeros((1, 2, 2), np.uint8), 0)
    bad.data = bad.data[:3]
    db = _db(tmp_path / "db", [encode_datum(good), encode_datum(bad)])
    with pytest.raises(DataError) as info:
        db_info(db)
    assert str(info.value) == (f"{db}: record '00001': data holds 3 bytes but channels x "
                               "height x width = 1 x 2 x 2 = 4; rebuild the database with "
                               "`cpy convert`")


def test_different_shape_names_the_key(tmp_path):
    values = [encode_datum(datum_from_array(np.zeros(shape, np.uint8), 0))
              for shape in [(1, 2, 2), (1, 2, 2), (3, 2, 2)]]
    db = _db(tmp_path / "db", values)
    with pytest.raises(DataError, match=r"record '00002' is 3 x 2 x 2 but the first record "
                                        r"\('00000'\) is 1 x 2 x 2"):
        db_info(db)
