"""Caffe's random stream in caffe_py.pycaffe: boost's distributions on an mt19937
(caffe_py.io.db.caffe_rng) and the nets that draw from it. The api-semantics example holds
BVLC's own draws of every filler and of Dropout (test_pycaffe_examples.py compares them); these
tests pin the pieces."""
from __future__ import annotations

import numpy as np

import caffe_py.pycaffe as caffe
from caffe_py.io.db.caffe_rng import Mt19937, bernoullis, normals, uniform_reals, ziggurat_tables
from caffe_py.pycaffe.caffe_stream import STREAM, drawn_filler
from caffe_py.spec.layer_params.shared import FillerParameter


def test_the_ziggurat_tables_are_boosts():
    x, y = ziggurat_tables("normal")
    assert (len(x), len(y)) == (129, 129)
    assert x[1] == 3.4426198558966521214 and x[0] == 3.7130862467403632609  # boost 1.74's
    assert y[1] == 0.0026696290839025035092 and (x[-1], y[-1]) == (0.0, 1.0)
    ex, ey = ziggurat_tables("exponential")
    assert (ex[0], ex[1], len(ex)) == (8.6971174701310497140, 7.6971174701310497140, 257)
    assert ey[1] == 0.00045413435384149675545


def test_uniform_and_bernoulli_take_one_draw_each():
    rng, raw = Mt19937(5), Mt19937(5).draws(4)
    values = uniform_reals(rng, 4, -1.0, 3.0)
    expect = (raw.astype(np.float32) / np.float32(2 ** 32)) * np.float32(4) - np.float32(1)
    np.testing.assert_array_equal(values, expect.astype(np.float32))
    assert rng.drawn == 4
    mask = bernoullis(rng, 3, 0.75, double=True)
    assert mask.tolist() == (Mt19937(5).draws(7)[4:] <= 0.75 * 4294967295.0).tolist()
    assert bernoullis(rng, 5, 0.0).tolist() == [False] * 5 and rng.drawn == 7  # no draw


def test_normals_are_deterministic_and_gaussian():
    a = normals(Mt19937(1), 20000, 1.0, 2.0)
    b = normals(Mt19937(1), 20000, 1.0, 2.0)
    np.testing.assert_array_equal(a, b)
    assert abs(a.mean() - 1.0) < 0.05 and abs(a.std() - 2.0) < 0.05
    assert np.abs(a - 1).max() > 2 * 3.44  # the tail is drawn too


def test_set_random_seed_repeats_the_fillers():
    spec = FillerParameter(type="xavier")
    caffe.set_random_seed(3)
    first = drawn_filler(spec, (4, 5))
    caffe.set_random_seed(3)
    np.testing.assert_array_equal(drawn_filler(spec, (4, 5)), first)
    assert np.abs(first).max() <= np.sqrt(3 / 5)
    assert drawn_filler(FillerParameter(type="constant", value=2), (3,)) is None
    assert STREAM.rng.drawn == 20
