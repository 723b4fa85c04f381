"""The forward launch sweep: every variant of csrc/fwd_variants.h, built as its own extension.

The shipped module holds one forward launch, ``kFwd`` in csrc/common.cuh (threads per block,
16-byte packs per thread for 4-byte and 2-byte types, load and store flavours).
``benchmarks/activations.py --variants`` builds this second module (only then), times ReLU
forward for every variant against torch.relu and x.copy_, and uses :func:`choose` to print
the ``kFwd`` line to put in common.cuh: the launch whose worst case against torch.relu is best.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from . import build

NAME = "caffe_py_fwd_variants"
SOURCES = ("fwd_variants.cpp", "fwd_variants_f32.cu", "fwd_variants_bf16.cu")
LOADS = ("kPlain", "kNc", "kCs")  # Ld in common.cuh, in its numbering
STORES = ("kPlain", "kCs", "kCg")  # St in common.cuh
_KFWD = re.compile(r"^constexpr FwdConfig kFwd\{(\d+), (\d+), (\d+), Ld::(\w+), St::(\w+)\};$",
                   re.MULTILINE)


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
    """common.cuh's kFwd: packs4 for 4-byte types (doubles: twice), packs2 for 2-byte types."""

    threads: int
    packs4: int
    packs2: int
    load: str
    store: str

    def line(self) -> str:
        """The C++ line of common.cuh that sets this launch."""
        return f"constexpr FwdConfig kFwd{{{self.threads}, {self.packs4}, {self.packs2}, " \
               f"Ld::{self.load}, St::{self.store}}};"

    def variant(self, itemsize: int) -> Variant:
        """The variant this launch runs for elements of `itemsize` bytes."""
        packs = {2: self.packs2, 8: 2 * self.packs4}.get(itemsize, self.packs4)
        return Variant(self.threads, packs, self.load, self.store)


def shipped(common: Path = build.CSRC / "common.cuh") -> FwdConfig:
    """The kFwd line of common.cuh as it is now."""
    match = _KFWD.search(common.read_text())
    if match is None:
        raise ValueError(f"{common}: no line `constexpr FwdConfig kFwd{{...}};` to read")
    t, p4, p2, ld, st = match.groups()
    return FwdConfig(int(t), int(p4), int(p2), ld, st)


def load(verbose: bool = False) -> tuple[ModuleType, list[Variant]]:
    """Build (or load the cached) sweep module: (module, variants by id)."""
    from torch.utils import cpp_extension

    directory = build.build_dir() / "fwd_variants"
    directory.mkdir(parents=True, exist_ok=True)
    module = cpp_extension.load(
        name=NAME, sources=[str(build.CSRC / s) for s in SOURCES], extra_cflags=["-O3"],
        extra_cuda_cflags=list(build.NVCC_FLAGS), build_directory=str(directory),
        verbose=verbose)
    variants = [Variant(t, p, LOADS[ld], STORES[st]) for t, p, ld, st in module.variants()]
    return module, variants


def choose(ratios: dict[tuple[int, int, Variant], float]) -> tuple[FwdConfig, float]:
    """The kFwd whose worst ratio (variant time vs torch.relu's, >1 is faster) is best.

    ``ratios`` maps (itemsize, megabytes, variant) to a speed ratio. threads, load and store
    are shared by all dtypes, the packs per thread are chosen per item size (4 or 2 bytes).
    Returns the launch and its worst ratio over all measured cases.
    """
    best: tuple[float, FwdConfig] | None = None
    shared = sorted({(v.threads, v.load, v.store) for _, _, v in ratios})
    for threads, ld, st in shared:
        packs: dict[int, int] = {}
        worst = float("inf")
        for itemsize in sorted({k[0] for k in ratios}):
            options = {}
            for (size, _mb, v), r in ratios.items():
                if size == itemsize and (v.threads, v.load, v.store) == (threads, ld, st):
                    options[v.packs] = min(options.get(v.packs, float("inf")), r)
            if not options:
                continue
            pick = max(sorted(options), key=lambda p, o=options: o[p])
            packs[itemsize] = pick
            worst = min(worst, options[pick])
        config = FwdConfig(threads, packs.get(4, 2), packs.get(2, 1), ld, st)
        if best is None or worst > best[0]:
            best = (worst, config)
    if best is None:
        raise ValueError("no measurements to choose a forward launch from")
    return best[1], best[0]
