"""The tiny LMDB the replicated and multi-host tests train on."""
from __future__ import annotations

import numpy as np
import pytest
from support import write_records


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("lmdb") / "train_lmdb"
    rng = np.random.default_rng(0)
    # 97: not a multiple of any batch, so the reader wraps
    return write_records(path, ((rng.integers(0, 256, (1, 6, 6), dtype=np.uint8), i % 3)
                                for i in range(97)))
