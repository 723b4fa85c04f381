"""How long a test pass takes on N GPUs, where the replicas split the test batches, against one
GPU, with `cpy train --gpus 0..N-1` and no other flag: the goal is at most 1.1/N of one GPU's
time, printing the same test outputs.

    python benchmarks/split_test.py --out DIR [--max-gpus 4] [--models resnet50,lenet]
    python benchmarks/split_test.py --out DIR --cpu          # a smoke run on CPU replicas

Each run is benchmarks/scale_default.py's solver (ResNet-50 bf16 batch 256 per GPU, or LeNet
fp32 batch 64) with a test pass every INTERVAL iterations over the same net whose DummyData is
replaced by a Data layer on an LMDB of random raw Datums of the net's input shape, written here
once per model (a DummyData test net makes its own data, which the other replicas cannot read
their share of: it tests on the root alone). base_lr is 0, so the weights stay as
initialised (the same seed on every N), and the TEST net's BatchNorm layers use each batch's
own statistics (``use_global_stats: false``; the running sums that training on constant data
gathers have variances near 0, which saturate the outputs into ties): pass k must print the
same test outputs on every N. A pass's time is from its "Testing net" line to its last "Test
net output" line (the log's microsecond clock); the table gives the median of the passes after
the first (which pays for warm-up and capture). On N > 1 GPUs each replica's feed reads its own
batches (the TEST readers hand the replicas whole batches in turn) and the passes choose for
themselves (SplitTests): passes 1-2 on the root alone, pass 3 split, then whichever was shorter
a batch (the run's line saying so is in the notes). The last pass is beside it: a forward
switches to gathering its batches inside the graph a pass or two after its feeds start to
gather from the decoded database, so with few passes the median includes passes before that.
A first row runs one GPU with `--graphs off` (eager test forwards), the baseline of the
replayed forward in the same run. The table is
printed last and written to DIR/split_test.md; each run is a JSON line in DIR/split_test.jsonl.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from scale_default import solver_for  # noqa: E402

from caffe_py.io.db import open_writer  # noqa: E402
from caffe_py.io.formats.datum import Datum, encode_datum  # noqa: E402

RECORDS = 1024

STAMP = re.compile(r"^[IWEF]\d{4} (\d\d):(\d\d):(\d\d\.\d+) ")
TESTS = {
    # name: (test_iter, test_interval, passes)
    "resnet50": (100, 5, 6),
    "lenet": (2000, 20, 6),
}


def seconds(line: str) -> float | None:
    m = STAMP.match(line)
    return None if m is None else int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])


def test_passes(text: str) -> list[tuple[float, list[str]]]:
    """Each test pass's duration and its output lines (as printed, without the prefix)."""
    passes: list[tuple[float, list[str]]] = []
    start: float | None = None
    outputs: list[str] = []
    last: float | None = None
    for line in text.splitlines():
        t = seconds(line)
        if "Testing net" in line:
            if start is not None and last is not None:
                passes.append((last - start, outputs))
            start, outputs, last = t, [], None
        elif "Test net output" in line and start is not None:
            outputs.append(line.split("]", 1)[1].strip())
            last = t
    if start is not None and last is not None:
        passes.append((last - start, outputs))
    return passes


def test_net(net_path: Path, out: Path) -> Path:
    """The net with its DummyData replaced by a Data layer on an LMDB of random raw Datums of
    the same shape (written once), its BatchNorm layers using each test batch's statistics."""
    net = yaml.safe_load(net_path.read_text())
    layers = net["layer"]
    at = next(i for i, layer in enumerate(layers) if layer["type"] == "DummyData")
    batch, channels, height, width = layers[at]["dummy_data_param"]["shape"][0]["dim"]
    db = out / f"{net_path.stem}_test_lmdb"
    if not db.exists():
        rng = np.random.default_rng(0)
        with open_writer(db) as writer:
            for i in range(RECORDS):
                pixels = rng.integers(0, 256, (channels, height, width), dtype=np.uint8)
                writer.put(f"{i:08d}".encode(), encode_datum(Datum(
                    channels, height, width, pixels.tobytes(), label=int(i % 10))))
    for layer in layers:   # each test batch normalised by its own statistics
        if layer["type"] == "BatchNorm":
            layer.setdefault("batch_norm_param", {})["use_global_stats"] = False
    layers[at] = {"name": "data", "type": "Data", "top": ["data", "label"],
                  "transform_param": {"scale": 1 / 256},
                  "data_param": {"source": str(db), "batch_size": batch, "backend": "LMDB"}}
    path = out / f"{net_path.stem}_test.yaml"
    path.write_text(yaml.safe_dump(net, sort_keys=False))
    return path


def run(model: str, n: int, out: Path, cpu: bool, flags: tuple[str, ...] = (),
        passes: int | None = None) -> dict:
    test_iter, interval, count = TESTS[model]
    if cpu:
        test_iter, interval, count = 20, 2, 5
    count = passes or count
    base = solver_for(model, out, cpu)
    spec = yaml.safe_load(base.read_text())
    spec.update(base_lr=0.0, test_net=str(test_net(Path(spec["net"]), out)),
                test_iter=[test_iter], test_interval=interval,
                test_initialization=False, max_iter=interval * count, display=0,
                snapshot_prefix=str(out / f"snap_split_{model}_{n}" / "s"))
    tag = f"{n}{''.join(flags).replace('-', '_').replace(' ', '')}"
    spec["snapshot_prefix"] = str(out / f"snap_split_{model}_{tag}" / "s")
    solver = out / f"split_{model}_{tag}.yaml"
    solver.write_text(yaml.safe_dump(spec, sort_keys=False))
    gpus = f"cpu:{n}" if cpu else ",".join(str(i) for i in range(n))
    done = subprocess.run([sys.executable, str(ROOT / "cli.py"), "train", "--solver",
                           str(solver), "--gpus", gpus, "--overwrite", *flags],
                          capture_output=True, text=True, timeout=900, cwd=out)
    text = done.stdout + done.stderr
    (out / f"split_{model}_{tag}.log").write_text(text)
    passes = test_passes(text)
    if done.returncode != 0 or len(passes) < 2:
        tail = " | ".join(text.strip().splitlines()[-3:])
        return {"ok": False, "why": f"exit {done.returncode}: {tail}"}
    notes = [line.split("]", 1)[1].strip() for line in text.splitlines()
             if "runs on the root alone" in line or "Test net #0 tests" in line]
    times = [t for t, _ in passes]
    return {"ok": True, "pass_s": statistics.median(times[1:]), "last_s": times[-1],
            "times": times, "outputs": [o for _, o in passes], "test_iter": test_iter,
            "notes": notes}


def _times(run: dict) -> str:
    """A run's passes, in seconds, in order."""
    return ", ".join(f"{t:.3f}" for t in run["times"])


def first_difference(mine: list[list[str]], ones: list[list[str]]) -> str:
    """Where a run's passes first print other test lines than one GPU's (for the notes)."""
    for k, (lines, theirs) in enumerate(zip(mine, ones, strict=False), start=1):
        for line, their in zip(lines, theirs, strict=False):
            if line != their:
                return f"pass {k} printed '{line}' where one GPU printed '{their}'"
        if len(lines) != len(theirs):
            return f"pass {k} printed {_count(len(lines), 'output line')} where one GPU " \
                   f"printed {len(theirs)}"
    return f"{_count(len(mine), 'pass', 'passes')} where one GPU ran {len(ones)}"


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def main(argv: list[str] | None = None) -> list[str]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-gpus", type=int, default=4)
    ap.add_argument("--models", default="resnet50,lenet")
    ap.add_argument("--passes", type=int, help="test passes a run (default: the model's, "
                                               "6; on --cpu 5)")
    ap.add_argument("--skip-eager", action="store_true",
                    help="leave out the one-GPU `--graphs off` row")
    ap.add_argument("--cpu", action="store_true", help="smoke run on CPU replicas")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.cpu:
        machine = f"CPU ({platform.processor() or platform.machine()})"
    else:
        import torch
        machine = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    rows = []
    with open(out / "split_test.jsonl", "w") as log:
        for model in args.models.split(","):
            one: dict | None = None
            eager: dict | None = None
            # one GPU eagerly (the replayed test forward's baseline), then 1..N with no flag
            plan = [(1, ("--graphs", "off"))] if not (args.cpu or args.skip_eager) else []
            plan += [(n, ()) for n in range(1, args.max_gpus + 1)]
            for n, flags in plan:
                r = run(model, n, out, args.cpu, flags, args.passes)
                shown = " ".join(flags)
                label = f"{n} (`{shown}`)" if flags else f"{n}"
                log.write(json.dumps({"model": model, "gpus": n, "flags": flags, **r}) + "\n")
                log.flush()
                if not r["ok"]:
                    rows.append(f"| {model} | {label} | failed: {r['why']} | | | | | | | |")
                    continue
                if flags:   # the eager baseline: its time against the replayed pass, below
                    eager = r
                    rows.append(f"| {model} | {label} | {r['test_iter']} | "
                                f"{r['pass_s']:.3f} | - | {r['last_s']:.3f} | - | - | | | "
                                f"{_times(r)} |")
                    print(rows[-1], flush=True)
                    continue
                if n == 1:
                    one = r
                    if eager is not None:
                        notes = [*r["notes"], f"{eager['pass_s'] / r['pass_s']:.2f}x shorter "
                                 "than the eager pass"]
                        r = {**r, "notes": notes}
                share = r["pass_s"] / one["pass_s"] if one else None
                last = r["last_s"] / one["last_s"] if one else None
                same = one is not None and r["outputs"] == one["outputs"]
                if one is not None and not same:
                    r = {**r, "notes": [*r["notes"],
                                        first_difference(r["outputs"], one["outputs"])]}
                goal = "" if n == 1 or share is None else (
                    f"<= {1.1 / n:.3f}: {'met' if share <= 1.1 / n else 'NOT met'}")
                rows.append(f"| {model} | {label} | {r['test_iter']} | {r['pass_s']:.3f} | "
                            f"{'' if share is None else f'{share:.3f}'} | {r['last_s']:.3f} | "
                            f"{'' if last is None else f'{last:.3f}'} | "
                            f"{'yes' if same else 'NO'} | {'; '.join(r['notes'])} | {goal} | "
                            f"{_times(r)} |")
                print(rows[-1], flush=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    table = "\n".join([
        f"Machine: {machine}; {stamp}; `python benchmarks/split_test.py "
        f"--max-gpus {args.max_gpus} --models {args.models}"
        f"{f' --passes {args.passes}' if args.passes else ''}"
        f"{' --skip-eager' if args.skip_eager else ''}{' --cpu' if args.cpu else ''}`",
        "",
        "| model | GPUs | test_iter | a pass (s, median after the first) | of one GPU's | "
        "the last pass (s) | of one GPU's last | every pass prints 1 GPU's | notes | goal | "
        "each pass (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|", *rows])
    (out / "split_test.md").write_text(table + "\n")
    print(table)
    return rows


if __name__ == "__main__":
    main()
