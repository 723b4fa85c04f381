"""The forward launch sweep: reading and writing common.cuh's kFwd line, the choice of the
launch to ship from measured ratios, and (with CUDA) every variant's output."""
from __future__ import annotations

import pytest
import torch

from caffe_py.kernels import build, variants
from caffe_py.kernels.variants import FwdConfig, Variant


def test_shipped_reads_the_kfwd_line_of_common_cuh():
    config = variants.shipped()
    assert config == FwdConfig(128, 2, 1, "kPlain", "kPlain")
    text = (build.CSRC / "common.cuh").read_text()
    assert config.line() in text.splitlines()


def test_shipped_without_the_line_names_the_file(tmp_path):
    header = tmp_path / "common.cuh"
    header.write_text("constexpr int kThreads = 128;\n")
    with pytest.raises(ValueError, match=r"common\.cuh: no line `constexpr FwdConfig kFwd"):
        variants.shipped(header)


def test_line_and_variant_per_item_size():
    config = FwdConfig(256, 4, 1, "kNc", "kCs")
    assert config.line() == "constexpr FwdConfig kFwd{256, 4, 1, Ld::kNc, St::kCs};"
    assert config.variant(4) == Variant(256, 4, "kNc", "kCs")
    assert config.variant(2) == Variant(256, 1, "kNc", "kCs")
    assert config.variant(8) == Variant(256, 8, "kNc", "kCs")
    assert config.variant(4).name == "t256 p4 ld:nc st:cs"


def _ratios(table: dict[tuple[int, int, str, str], tuple[float, float]]):
    """{(threads, packs, load, store): (ratio at 4 bytes, ratio at 2 bytes)}, 2 sizes each."""
    out = {}
    for (t, p, ld, st), (r4, r2) in table.items():
        v = Variant(t, p, ld, st)
        for mb, wiggle in ((64, 0.0), (256, 0.001)):
            out[(4, mb, v)] = r4 + wiggle
            out[(2, mb, v)] = r2 + wiggle
    return out


def test_choose_maximises_the_worst_case_with_packs_per_item_size():
    ratios = _ratios({
        (128, 1, "kPlain", "kPlain"): (0.97, 1.01),
        (128, 2, "kPlain", "kPlain"): (1.00, 0.98),
        (128, 4, "kPlain", "kPlain"): (0.96, 0.97),
        # faster for floats, but its best bfloat16 launch is slower than 128 threads' best
        (256, 2, "kPlain", "kCs"): (1.03, 0.97),
        (256, 1, "kPlain", "kCs"): (0.95, 0.975),
    })
    config, worst = variants.choose(ratios)
    assert config == FwdConfig(128, 2, 1, "kPlain", "kPlain")
    assert worst == pytest.approx(1.00)


def test_choose_without_measurements_is_an_error():
    with pytest.raises(ValueError, match="no measurements"):
        variants.choose({})


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_variant_matches_torch_relu(dtype):
    """Sizes: a partial last block with a tail, several full blocks of the largest shape."""
    module, sweep = variants.load()
    assert len(sweep) == 54 and len(set(sweep)) == 54
    gen = torch.Generator(device="cuda").manual_seed(3)
    v = 16 // torch.empty((), dtype=dtype).element_size()
    for n in (1, v + 3, 2 * 256 * 4 * v, 2 * 256 * 4 * v + 7, 100_003):
        x = torch.randn(n, device="cuda", generator=gen).to(dtype)
        for i, variant in enumerate(sweep):
            y = torch.full_like(x, float("nan"))
            module.relu(x, y, i)
            assert torch.equal(y, torch.relu(x)), (variant.name, n)
