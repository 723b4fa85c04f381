"""The tiny LMDB the replicated and multi-host tests train on."""
from __future__ import annotations

import numpy as np
import pytest

from caffe_py.io.db.lmdb_store import LmdbWriter
from caffe_py.io.formats.datum import datum_from_array, encode_datum


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("lmdb") / "train_lmdb"
    rng = np.random.default_rng(0)
    with LmdbWriter(path) as writer:
        for i in range(97):   # not a multiple of any batch: the reader wraps
            image = rng.integers(0, 256, (1, 6, 6), dtype=np.uint8)
            writer.put(b"%08d" % i, encode_datum(datum_from_array(image, int(i % 3))))
    return str(path)
