"""compute-mean: the mean image's values, the file Caffe writes, the per-channel means."""
from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from support import write_db

from caffe_py.errors import DataError
from caffe_py.io.formats.blobproto import read_blob_file, read_mean_file
from caffe_py.io.formats.datum import Datum, datum_from_array
from caffe_py.tools.mean import compute_mean


def _db(path, datums):
    write_db(path, datums)
    return path


def test_mean_values_and_channel_means(tmp_path):
    arrays = [np.array([[[0, 10]], [[200, 255]]], dtype=np.uint8),  # (2, 1, 2)
              np.array([[[3, 20]], [[100, 0]]], dtype=np.uint8),
              np.array([[[6, 30]], [[0, 1]]], dtype=np.uint8)]
    db = _db(tmp_path / "db", [datum_from_array(a, i) for i, a in enumerate(arrays)])
    result = compute_mean(db, tmp_path / "mean.binaryproto")
    expected = np.array([[[3, 20]], [[100, 256 / 3]]], dtype=np.float32)
    np.testing.assert_allclose(result.mean, expected, rtol=1e-7)
    np.testing.assert_allclose(result.channel_means, [11.5, (100 + 256 / 3) / 2], rtol=1e-6)
    np.testing.assert_allclose(read_mean_file(tmp_path / "mean.binaryproto"), expected)
    assert read_blob_file(tmp_path / "mean.binaryproto").legacy == (1, 2, 1, 2)
    assert result.lines()[1:] == ["mean_value channel [0]: 11.5",
                                  "mean_value channel [1]: 92.6667"]
    assert result.lines()[0].startswith(f"{tmp_path}/mean.binaryproto: mean of 3 records, "
                                        "2 x 1 x 2, ")


def test_encoded_records_are_decoded(tmp_path):
    buffer = io.BytesIO()
    Image.fromarray(np.full((2, 2), 40, dtype=np.uint8), mode="L").save(buffer, format="PNG")
    datums = [Datum(data=buffer.getvalue(), label=0, encoded=True),
              datum_from_array(np.full((1, 2, 2), 60, dtype=np.uint8), 1)]
    result = compute_mean(_db(tmp_path / "db", datums), tmp_path / "m.binaryproto")
    np.testing.assert_array_equal(result.mean, np.full((1, 2, 2), 50.0))


def test_shape_mismatch_names_the_key(tmp_path):
    datums = [datum_from_array(np.zeros((1, 2, 2), np.uint8), 0),
              datum_from_array(np.zeros((1, 2, 3), np.uint8), 0)]
    db = _db(tmp_path / "db", datums)
    with pytest.raises(DataError) as info:
        compute_mean(db, tmp_path / "m.binaryproto")
    assert str(info.value) == (f"{db}: record '00000001' is 1 x 2 x 3 but the first record "
                               "('00000000') is 1 x 2 x 2; every record of a database needs "
                               "one shape: convert with --resize-width/--resize-height or "
                               "--check-size")
    assert not (tmp_path / "m.binaryproto").exists()


def test_empty_database(tmp_path):
    db = _db(tmp_path / "db", [])
    with pytest.raises(DataError) as info:
        compute_mean(db, tmp_path / "m.binaryproto")
    assert str(info.value) == f"{db}: the database is empty; there is no mean to compute"


def test_a_non_finite_float_record_is_named_and_nothing_written(tmp_path):
    datums = [datum_from_array(np.ones((1, 1, 2), np.float32), 0),
              Datum(1, 1, 2, b"", 1, [float("nan"), 1.0])]
    db = _db(tmp_path / "db", datums)
    with pytest.raises(DataError) as info:
        compute_mean(db, tmp_path / "m.binaryproto")
    assert str(info.value) == (f"{db}: record '00000001' holds a non-finite value (nan) in its "
                               "float_data, which would make the whole mean non-finite; fix or "
                               "drop that record (nothing was written)")
    assert not (tmp_path / "m.binaryproto").exists()
