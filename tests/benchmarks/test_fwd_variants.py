"""The forward launch sweep (benchmarks/fwd_variants.py): reading and writing common.cuh's kFwd
and kFwdMath lines, the choice of the launch to ship from measured ratios, and (with CUDA)
every variant's output."""
from __future__ import annotations

import pytest
import torch
from support import load_benchmark

from caffe_py.kernels import build

variants = load_benchmark("fwd_variants")
FwdConfig, Variant = variants.FwdConfig, variants.Variant


def test_shipped_reads_the_kfwd_and_kfwdmath_lines_of_common_cuh():
    text = (build.CSRC / "common.cuh").read_text().splitlines()
    config = variants.shipped()
    assert config == FwdConfig(256, 1, 1, "kCs", "kCs")
    assert config.line() in text
    math = variants.shipped(name="kFwdMath")
    assert math == FwdConfig(128, 1, 2, "kCs", "kCs")
    assert math.line("kFwdMath") == \
        "constexpr FwdConfig kFwdMath{128, 1, 2, Ld::kCs, St::kCs};"
    assert math.line("kFwdMath") in text


def test_shipped_without_the_line_names_the_file(tmp_path):
    header = tmp_path / "common.cuh"
    header.write_text("constexpr int kThreads = 128;\n")
    with pytest.raises(ValueError, match=r"common\.cuh: no line `constexpr FwdConfig kFwd"):
        variants.shipped(header)
    header.write_text("constexpr FwdConfig kFwd{256, 1, 1, Ld::kCs, St::kCs};\n")
    assert variants.shipped(header) == FwdConfig(256, 1, 1, "kCs", "kCs")
    with pytest.raises(ValueError, match=r"no line `constexpr FwdConfig kFwdMath\{\.\.\.\};`"):
        variants.shipped(header, name="kFwdMath")


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


def test_choose_takes_the_worst_case_over_ops_of_one_launch():
    """Cases labelled (op, MB): a launch that wins on ELU but loses on TanH is not chosen."""
    table = {}
    for v, (elu, tanh) in {Variant(128, 4, "kPlain", "kPlain"): (1.50, 1.01),
                           Variant(128, 1, "kPlain", "kPlain"): (1.35, 0.98),
                           Variant(256, 4, "kCs", "kCs"): (1.60, 0.97)}.items():
        table[(2, ("ELU", 64), v)] = elu
        table[(2, ("TanH", 64), v)] = tanh
    config, worst = variants.choose(table)
    assert config == FwdConfig(128, 2, 4, "kPlain", "kPlain")  # packs4 defaults to 2
    assert worst == pytest.approx(1.01)


def test_choose_without_measurements_is_an_error():
    with pytest.raises(ValueError, match="no measurements"):
        variants.choose({})


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_variant_matches_torch_relu(dtype):
    """Sizes: a partial last block with a tail, several full blocks of the largest shape."""
    module, sweep, _ = variants.load()
    assert len(sweep) == 54 and len(set(sweep)) == 54
    gen = torch.Generator(device="cuda").manual_seed(3)
    v = 16 // torch.empty((), dtype=dtype).element_size()
    for n in (1, v + 3, 2 * 256 * 4 * v, 2 * 256 * 4 * v + 7, 100_003):
        x = torch.randn(n, device="cuda", generator=gen).to(dtype)
        for i, variant in enumerate(sweep):
            y = torch.full_like(x, float("nan"))
            module.relu(x, y, i)
            assert torch.equal(y, torch.relu(x)), (variant.name, n)


# (rtol, atol) of tests/kernels/test_cuda_kernels.py against the op in double
MATH_TOL = {torch.float32: (1e-6, 1e-6), torch.bfloat16: (8e-3, 1e-3)}
MATH_OPS = [(1, 1.0, lambda x: torch.nn.functional.elu(x, 1.0)),
            (1, 0.5, lambda x: torch.nn.functional.elu(x, 0.5)),
            (2, 0.0, torch.sigmoid), (3, 0.0, torch.tanh)]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_math_variant_matches_the_op_in_double(dtype):
    """ELU (two alphas), Sigmoid and TanH for each of the 12 kFwdMath variants; sizes as
    above, values over [-12, 12] (both branches of ELU's expm1, saturating sigmoid/tanh)."""
    module, _, sweep = variants.load()
    assert len(sweep) == 12 and len(set(sweep)) == 12
    assert {(v.load, v.store) for v in sweep} == {("kPlain", "kPlain"), ("kCs", "kCs")}
    rtol, atol = MATH_TOL[dtype]
    gen = torch.Generator(device="cuda").manual_seed(4)
    v = 16 // torch.empty((), dtype=dtype).element_size()
    for n in (1, v + 3, 2 * 256 * 4 * v + 7, 100_003):
        x = (torch.randn(n, device="cuda", generator=gen) * 4).clamp(-12, 12).to(dtype)
        for kind, p, op in MATH_OPS:
            want = op(x.double())
            for i, variant in enumerate(sweep):
                y = torch.full_like(x, float("nan"))
                module.math(x, y, kind, p, i)
                torch.testing.assert_close(y.double(), want, rtol=rtol, atol=atol,
                                           msg=lambda m, k=kind, name=variant.name, n=n:
                                           f"kind {k} {name} n={n}: {m}")
