"""How the reader copies raw ImageNet-sized records, measured where it matters: ResNet-50
training steps fed by a raw 256 x 256 LMDB (imagenet_data.py's rows), the copy modes taking
turns in one run.

    python benchmarks/raw_copy_ab.py --images 16000 [--rounds 2]

Modes: ``join`` (one bytes join per chunk: one copy holding the GIL for the whole chunk) and
``separate`` (numpy copies record by record, releasing the GIL for each: the shipped choice
for records of raw_records.SEPARATE_COPY_BYTES or more). Rows: DummyData, then the modes in
turn ``--rounds`` times, then DummyData again; ratios against the DummyData mean.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import imagenet_data as bench  # noqa: E402

from caffe_py.io.decoders.workers import DecodeOptions  # noqa: E402
from caffe_py.io.formats import raw_records  # noqa: E402
from caffe_py.io.reader import reader  # noqa: E402

MODES = {"join": 1 << 62, "separate": raw_records.SEPARATE_COPY_BYTES}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=16000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data", type=Path, default=Path("/tmp/cpy_imagenet_ab"))
    args = ap.parse_args()
    s = dataclasses.replace(bench.REAL, images=args.images)
    device = torch.device("cuda")
    torch.backends.cudnn.benchmark = True
    reader.CACHE_BYTES = 0  # every pass read and decoded, as ImageNet's would be
    bench.make_data(args.data, s)
    raw = args.data / "raw_lmdb"
    rows = [("DummyData", bench.train_rate(bench.net_spec(s, None), device, s))]
    for r in range(args.rounds):
        for mode, threshold in MODES.items():
            raw_records.SEPARATE_COPY_BYTES = threshold
            spec = bench.net_spec(s, bench.data_spec(raw, args.data, s))
            rate = bench.train_rate(spec, device, s, lambda net: bench.our_feed(
                net, device, DecodeOptions(), {}))
            rows.append((f"raw LMDB, {mode} (round {r + 1})", rate))
            print(f"{rows[-1][0]}: {rate:,.1f} images/s", flush=True)
    rows.append(("DummyData", bench.train_rate(bench.net_spec(s, None), device, s)))
    dummy = (rows[0][1] + rows[-1][1]) / 2
    print(f"\n{torch.cuda.get_device_name(device)}; {args.images} images, batch {s.batch}, "
          f"{s.warmup} + {s.steps} steps per row\n\n| fed by | images/s | vs DummyData |\n"
          "|---|---:|---:|")
    for name, rate in rows:
        print(f"| {name} | {rate:,.1f} | {rate / dummy:.3f} |")


if __name__ == "__main__":
    main()
