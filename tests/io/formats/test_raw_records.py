"""The chunk-wide fast path for raw Datum records against the full decoder."""
from __future__ import annotations

import numpy as np
import pytest

from caffe_py.io.formats.datum import datum_from_array, datum_to_array, decode_datum, encode_datum
from caffe_py.io.formats.raw_records import raw_chunk, raw_labels, raw_prefix

SHAPE = (2, 3, 4)


def record(i: int, label: int, **kw) -> bytes:
    return encode_datum(datum_from_array(np.full(SHAPE, i, np.uint8), label, **kw))


def test_a_chunk_of_raw_records_is_one_view_and_equals_the_decoder():
    values = [record(i, i * 7) for i in range(9)]
    pixels, labels, ok = raw_chunk(values, raw_prefix(SHAPE), SHAPE)
    assert ok is None and pixels.shape == (9, *SHAPE) and not pixels.flags.writeable
    for i, value in enumerate(values):
        datum = decode_datum(value)
        assert labels[i] == datum.label == 7 * i
        np.testing.assert_array_equal(pixels[i], np.full(SHAPE, i))


def test_mixed_lengths_are_grouped_and_other_records_are_left_out():
    values = [record(0, 5), record(1, 200), record(2, 70000, encoded=False),
              record(3, -1), b"\x0a\x02\xff\xff", record(5, 2**31 - 1),
              encode_datum(datum_from_array(np.zeros((2, 3, 5), np.uint8), 1))]
    pixels, labels, ok = raw_chunk(values, raw_prefix(SHAPE), SHAPE)
    assert ok.tolist() == [True, True, True, False, False, True, False]
    assert labels[ok].tolist() == [5, 200, 70000, 2**31 - 1]
    assert [int(p.max()) for p in pixels[ok]] == [0, 1, 2, 5]


def test_raw_labels_reads_heads_and_tails_only_and_agrees_with_the_chunk():
    """The check the decode processes' raw files take (no pixel copied): the same records and
    labels as raw_chunk, from views of bytes that are not the pixels' own."""
    values = [record(0, 5), record(1, 200), record(2, 70000, encoded=False),
              record(3, -1), b"\x0a\x02\xff\xff", record(5, 2**31 - 1)]
    ok, labels = raw_labels([memoryview(v) for v in values], raw_prefix(SHAPE), SHAPE)
    assert ok.tolist() == [True, True, True, False, False, True]
    assert labels[ok].tolist() == [5, 200, 70000, 2**31 - 1]


def test_nothing_raw_gives_none():
    assert raw_chunk([b"\x0a\x02\xff\xff", b""], raw_prefix(SHAPE), SHAPE) is None


def test_big_records_from_views_are_copied_one_by_one_and_equal_the_decoder():
    """Records of SEPARATE_COPY_BYTES or more (ImageNet's) are copied record by record (numpy
    releases the GIL for each); views of the database's map work as bytes do."""
    from caffe_py.io.formats import raw_records

    shape = (3, 150, 150)
    assert np.prod(shape) >= raw_records.SEPARATE_COPY_BYTES
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(3)]
    values = [memoryview(encode_datum(datum_from_array(a, 10 + i)))
              for i, a in enumerate(arrays)]
    pixels, labels, ok = raw_chunk(values, raw_prefix(shape), shape)
    assert ok is None and labels.tolist() == [10, 11, 12]
    for got, want in zip(pixels, arrays, strict=True):
        np.testing.assert_array_equal(got, want)


def test_labels_of_two_widths_all_take_the_fast_path_from_views():
    """An ImageNet database: labels below and above 127 give records of two lengths; every
    one takes the fast path (no mask) and its pixels are copied out of the views."""
    values = [record(i, 3 if i % 3 else 999) for i in range(8)]
    buffers = [bytearray(v) for v in values]
    pixels, labels, ok = raw_chunk([memoryview(b) for b in buffers], raw_prefix(SHAPE), SHAPE)
    assert ok is None and labels.tolist() == [999, 3, 3, 999, 3, 3, 999, 3]
    for b in buffers:  # the map's pages may change once the chunk is decoded
        b[:] = bytes(len(b))
    for i, value in enumerate(values):
        np.testing.assert_array_equal(pixels[i], datum_to_array(decode_datum(value)))


def _threaded(calls: list):
    """A ``run`` that cuts the records into three parts and runs them on threads, last part
    first (the order parts finish in must not matter); ``calls`` gets each part's bounds."""
    import threading

    def run(part, n):
        bounds = [n * i // 3 for i in range(4)]
        spans = list(zip(bounds, bounds[1:], strict=False))[::-1]
        calls.extend(spans)
        threads = [threading.Thread(target=part, args=span) for span in spans]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return run


@pytest.mark.parametrize("labels", [[4, 5, 6, 7, 8, 9], [4, 500, 6, 7000, 8, 9]],
                         ids=["one length", "two lengths"])
def test_big_records_copied_by_run_in_parts_equal_the_one_thread_copy(labels):
    """Big records' copies go through ``run`` (the reader's copy threads), in parts, on both
    paths (records of one length, and of several), and give the one-thread copy's bytes."""
    shape = (3, 150, 150)
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in labels]
    values = [memoryview(encode_datum(datum_from_array(a, y)))
              for a, y in zip(arrays, labels, strict=True)]
    calls: list = []
    pixels, got, ok = raw_chunk(values, raw_prefix(shape), shape, _threaded(calls))
    alone = raw_chunk(values, raw_prefix(shape), shape)
    assert ok is None and got.tolist() == labels == alone[1].tolist()
    assert calls == [(4, 6), (2, 4), (0, 2)]
    np.testing.assert_array_equal(pixels, np.stack(arrays))
    np.testing.assert_array_equal(pixels, alone[0])


def test_small_records_are_joined_without_run():
    calls: list = []
    pixels, _, ok = raw_chunk([record(i, i) for i in range(6)], raw_prefix(SHAPE), SHAPE,
                              _threaded(calls))
    assert ok is None and calls == [] and [int(p.max()) for p in pixels] == list(range(6))
