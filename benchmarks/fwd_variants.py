"""The forward launch sweep: every variant of csrc/fwd_variants.h, built as its own extension.

The shipped module holds two forward launches in caffe_py/kernels/csrc/common.cuh (threads per
block, 16-byte packs per thread for 4-byte and 2-byte types, load and store flavours): ``kFwd``
for ReLU and leaky ReLU, ``kFwdMath`` for ELU, Sigmoid and TanH. ``benchmarks/activations.py
--variants`` builds this second module (only then; its sources are benchmarks/csrc/ and it
includes the package's kernels), times ReLU forward over the full grid and the three math ops
over a smaller one against PyTorch's ops and x.copy_, and uses :func:`choose` to print the line
of each launch to put in common.cuh: the launch whose worst case against PyTorch is best.

    python benchmarks/fwd_variants.py    # build (or load the cached) sweep module only
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caffe_py.kernels import build  # noqa: E402

CSRC = Path(__file__).resolve().parent / "csrc"
NAME = "caffe_py_fwd_variants"
SOURCES = ("fwd_variants.cpp", "fwd_variants_f32.cu", "fwd_variants_bf16.cu",
           "fwd_variants_math_f32.cu", "fwd_variants_math_bf16.cu")
LAUNCHES = ("kFwd", "kFwdMath")  # the FwdConfig lines of common.cuh
LOADS = ("kPlain", "kNc", "kCs")  # Ld in common.cuh, in its numbering
STORES = ("kPlain", "kCs", "kCg")  # St in common.cuh


@dataclass(frozen=True)
class Variant:
    """One forward launch: block size, packs per thread, load and store flavour."""

    threads: int
    packs: int
    load: str  # one of LOADS
    store: str  # one of STORES

    @property
    def name(self) -> str:
        return f"t{self.threads} p{self.packs} ld:{self.load[1:].lower()} " \
               f"st:{self.store[1:].lower()}"


@dataclass(frozen=True)
class FwdConfig:
    """A launch of common.cuh (kFwd, kFwdMath): packs4 for 4-byte types (doubles: twice),
    packs2 for 2-byte types."""

    threads: int
    packs4: int
    packs2: int
    load: str
    store: str

    def line(self, name: str = "kFwd") -> str:
        """The C++ line of common.cuh that sets this launch as ``name``."""
        return f"constexpr FwdConfig {name}{{{self.threads}, {self.packs4}, {self.packs2}, " \
               f"Ld::{self.load}, St::{self.store}}};"

    def variant(self, itemsize: int) -> Variant:
        """The variant this launch runs for elements of `itemsize` bytes."""
        packs = {2: self.packs2, 8: 2 * self.packs4}.get(itemsize, self.packs4)
        return Variant(self.threads, packs, self.load, self.store)


def shipped(common: Path = build.CSRC / "common.cuh", name: str = "kFwd") -> FwdConfig:
    """The launch ``name`` (one of LAUNCHES) of common.cuh as it is now."""
    pattern = rf"^constexpr FwdConfig {re.escape(name)}" \
              r"\{(\d+), (\d+), (\d+), Ld::(\w+), St::(\w+)\};$"
    match = re.search(pattern, common.read_text(), re.MULTILINE)
    if match is None:
        raise ValueError(f"{common}: no line `constexpr FwdConfig {name}{{...}};` to read")
    t, p4, p2, ld, st = match.groups()
    return FwdConfig(int(t), int(p4), int(p2), ld, st)


def load(verbose: bool = False) -> tuple[ModuleType, list[Variant], list[Variant]]:
    """Build (or load the cached) sweep module: (module, ReLU variants by id, math variants by
    id)."""
    from torch.utils import cpp_extension

    directory = build.build_dir() / "fwd_variants"
    directory.mkdir(parents=True, exist_ok=True)
    module = cpp_extension.load(
        name=NAME, sources=[str(CSRC / s) for s in SOURCES], extra_cflags=["-O3"],
        extra_cuda_cflags=list(build.NVCC_FLAGS), extra_include_paths=[str(build.CSRC)],
        build_directory=str(directory), verbose=verbose)
    relu = [Variant(t, p, LOADS[ld], STORES[st]) for t, p, ld, st in module.variants()]
    math = [Variant(t, p, LOADS[ld], STORES[st]) for t, p, ld, st in module.math_variants()]
    return module, relu, math


def choose(ratios: dict[tuple[int, object, Variant], float]) -> tuple[FwdConfig, float]:
    """The launch whose worst ratio (variant time vs PyTorch's op's, >1 is faster) is best.

    ``ratios`` maps (itemsize, case, variant) to a speed ratio; a case is any label of one
    measurement at that item size (megabytes, or (op, megabytes)). threads, load and store
    are shared by all dtypes, the packs per thread are chosen per item size (4 or 2 bytes).
    Returns the launch and its worst ratio over all measured cases.
    """
    best: tuple[float, FwdConfig] | None = None
    shared = sorted({(v.threads, v.load, v.store) for _, _, v in ratios})
    for threads, ld, st in shared:
        packs: dict[int, int] = {}
        worst = float("inf")
        for itemsize in sorted({k[0] for k in ratios}):
            options: dict[int, float] = {}  # packs per thread -> worst ratio
            for (size, _mb, v), r in ratios.items():
                if size == itemsize and (v.threads, v.load, v.store) == (threads, ld, st):
                    options[v.packs] = min(options.get(v.packs, float("inf")), r)
            if not options:
                continue
            pick = max(sorted(options), key=options.__getitem__)
            packs[itemsize] = pick
            worst = min(worst, options[pick])
        config = FwdConfig(threads, packs.get(4, 2), packs.get(2, 1), ld, st)
        if best is None or worst > best[0]:
            best = (worst, config)
    if best is None:
        raise ValueError("no measurements to choose a forward launch from")
    return best[1], best[0]


if __name__ == "__main__":
    _, relu_variants, math_variants = load(verbose="-v" in sys.argv[1:])
    print(f"{NAME}: {len(relu_variants)} kFwd and {len(math_variants)} kFwdMath variants")
