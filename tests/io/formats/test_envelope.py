"""The image file inside an encoded Datum, found by byte comparisons; other layouts are left to
the full decoder (and the chunk decoder's results are the same either way)."""
from __future__ import annotations

import numpy as np
import pytest

from caffe_py.errors import DataError
from caffe_py.io.db.lmdb_store import StoredFiles
from caffe_py.io.formats.datum import Datum, datum_from_array, encode_datum
from caffe_py.io.formats.envelope import file_span, image_file, is_jpeg
from caffe_py.io.reader.decode import ChunkDecoder, PartialChunk

FILE = b"\xff\xd8" + bytes(range(200)) + b"\xff\xd9"


@pytest.mark.parametrize("label", [0, 5, 127, 128, 999, 2**31 - 1])
def test_caffe_layout_gives_a_view_of_the_file_and_the_label(label):
    value = encode_datum(Datum(data=FILE, label=label, encoded=True))
    view, got = image_file(value)
    assert bytes(view) == FILE and got == label
    assert view.obj is value  # a view, no copy


@pytest.mark.parametrize("datum", [
    Datum(3, 4, 5, FILE, 1, encoded=True),  # dimensions written too
    Datum(data=FILE, label=-1, encoded=True),  # a 10-byte varint
    Datum(data=FILE, label=1, encoded=False),
    Datum(data=FILE, label=1),  # no encoded field
])
def test_other_layouts_are_left_to_the_full_decoder(datum):
    assert image_file(encode_datum(datum)) is None


def test_truncated_values_are_left_to_the_full_decoder():
    value = encode_datum(Datum(data=FILE, label=300, encoded=True))
    for cut in (1, 2, len(value) - 4, len(value) - 3, len(value) - 1):
        assert image_file(value[:cut]) is None
    assert image_file(b"") is None


def test_is_jpeg():
    assert is_jpeg(memoryview(FILE)[:10]) and not is_jpeg(b"\x89PNG\r\n") and not is_jpeg(b"")


def test_chunk_decoder_hands_over_files_in_order_by_either_way():
    values = [encode_datum(Datum(data=FILE + bytes([i]), label=i, encoded=True)) for i in range(3)]
    values.append(encode_datum(Datum(1, 2, 3, FILE + b"\x03", -4, encoded=True)))  # full way
    decoder = ChunkDecoder("db", (3, 8, 8), np.dtype(np.uint8), None, encoded=True)
    decoder.keep_encoded = True
    files, labels = decoder.decode([b"k%d" % i for i in range(4)], values)
    assert [bytes(f) for f in files] == [FILE + bytes([i]) for i in range(4)]
    assert labels.tolist() == [0, 1, 2, -4]
    wanted = np.array([False, True, False, True])
    files, labels = decoder.decode([b"k%d" % i for i in range(4)], values, wanted)
    assert files[0] is None and bytes(files[1]) == FILE + b"\x01" and labels[3] == -4


def test_a_raw_or_broken_record_in_an_encoded_stream_stops_at_its_key():
    good = encode_datum(Datum(data=FILE, label=1, encoded=True))
    raw = encode_datum(datum_from_array(np.zeros((3, 8, 8), np.uint8), 2, encoded=False))
    decoder = ChunkDecoder("db", (3, 8, 8), np.dtype(np.uint8), None, encoded=True)
    decoder.keep_encoded = True
    with pytest.raises(PartialChunk) as partial:
        decoder.decode([b"a", b"b", b"c"], [good, raw, good])
    (files, labels), error = partial.value.done, partial.value.error
    assert len(files) == 1 and labels.tolist() == [1]
    assert str(error) == ("db: record 'b' holds raw pixels but the first record is an encoded "
                          "image; a Data layer reads records of one kind (convert the database "
                          "again)")
    with pytest.raises(PartialChunk) as partial:
        decoder.decode([b"a", b"z"], [good, b"\x0a\xff"])
    assert isinstance(partial.value.error, DataError)
    assert str(partial.value.error).startswith("db: record 'z' is not a Caffe Datum")


def test_a_view_of_the_map_gives_the_same_file_and_label():
    value = encode_datum(Datum(data=FILE, label=300, encoded=True))
    assert file_span(memoryview(value)) == file_span(value) == (3, 3 + len(FILE), 300)


def test_files_left_in_an_lmdb_go_over_as_their_places_in_the_records():
    """With ``stored_in`` (the feeds decode in processes that read the LMDB themselves) a chunk
    of Caffe-layout records is handed over as keys and spans, nothing copied; a chunk holding
    any other layout goes the full decoder's way, as files."""
    values = [encode_datum(Datum(data=FILE + bytes(i), label=i, encoded=True)) for i in range(3)]
    keys = [b"k%d" % i for i in range(3)]
    decoder = ChunkDecoder("db", (3, 8, 8), np.dtype(np.uint8), None, encoded=True)
    decoder.keep_encoded, decoder.stored_in = True, "/data/db"
    files, labels = decoder.decode(keys, [memoryview(v) for v in values])
    assert isinstance(files, StoredFiles) and files.database == "/data/db"
    assert files.keys == tuple(keys) and labels.tolist() == [0, 1, 2]
    assert files.spans.tolist() == [[3, 3 + len(FILE) + i, len(values[i])] for i in range(3)]
    for i, (start, stop, size) in enumerate(files.spans.tolist()):
        assert values[i][start:stop] == FILE + bytes(i) and len(values[i]) == size
    with pytest.raises(TypeError, match=r"^stored files are read with read\(\), not one by "
                                        r"one$"):
        files[0]
    picked, labels = decoder.decode(keys, values, np.array([False, True, False]))
    assert picked.spans.tolist()[1] == files.spans.tolist()[1] and labels.tolist()[1] == 1
    odd = values[:2] + [encode_datum(Datum(1, 2, 3, FILE, 5, encoded=True))]
    files, labels = decoder.decode(keys, odd)
    assert files == (FILE, FILE + b"\0", FILE) and labels.tolist() == [0, 1, 5]
