"""Accuracy of model averaging (``model_average_period``) against synchronous training, after
the same number of samples: LeNet (configs/mnist.yaml) on Fashion-MNIST, N CPU replicas.

Every run trains ``--iters`` iterations of N replicas x the net's batch (the same records in
the same order in every run: the reader's round-robin) and tests the final model on the whole
test set (100 x 100 images). Averaging runs use the solver's momentum, weight decay and rate
schedule unchanged; ``--history`` compares averaging the update history with keeping it per
replica (``Tuning.average_history``). Each run appends one JSON line to ``--out`` (so a long
sweep can be resumed with ``--skip-done``) and the script prints a markdown table of the mean
and range over the seeds, with the machine, the date and the command::

    python benchmarks/local_sgd_accuracy.py --replicas 4 --iters 2000 \\
        --periods 0,4,16,64 --seeds 1701,1702,1703 --out /tmp/local_sgd.jsonl
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from caffe_py.parallel import ReplicatedRun, Tuning  # noqa: E402
from caffe_py.spec.solver_spec import load_solver  # noqa: E402


def run_one(solver: str, replicas: int, iters: int, period: int, history: str,
            seed: int) -> dict:
    """One training run; its final test accuracy and loss, and its wall time."""
    param = dataclasses.replace(
        load_solver(solver), max_iter=iters, test_interval=iters, test_initialization=False,
        display=0, snapshot=0, snapshot_after_train=False, random_seed=seed,
        model_average_period=period)
    tuning = Tuning(average_history=history == "averaged")
    started = time.perf_counter()
    with ReplicatedRun(param, ["cpu"] * replicas, tuning=tuning) as run:
        root = run.run()
        means = root.last_test[0]
        batch = root.batch_size()
    return {"period": period, "history": history if period else "-", "seed": seed,
            "replicas": replicas, "iters": iters, "samples": iters * replicas * batch,
            "accuracy": float(means["accuracy"]), "loss": float(means["loss"]),
            "seconds": round(time.perf_counter() - started, 1)}


def table(rows: list[dict]) -> list[str]:
    groups: dict[tuple[int, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["period"], row["history"]), []).append(row)
    sync = [r["accuracy"] for r in groups.get((0, "-"), [])]
    base = statistics.mean(sync) if sync else None
    out = ["| model_average_period | history | seeds | test accuracy (mean) | min - max | "
           "vs synchronous | s/run |", "|---|---|---|---|---|---|---|"]
    for (period, history), group in sorted(groups.items()):
        acc = [r["accuracy"] for r in group]
        mean = statistics.mean(acc)
        delta = f"{mean - base:+.4f}" if base is not None else "-"
        name = "0 (synchronous)" if period == 0 else str(period)
        out.append(f"| {name} | {history} | {len(acc)} | {mean:.4f} | {min(acc):.4f} - "
                   f"{max(acc):.4f} | {delta} | "
                   f"{statistics.mean(r['seconds'] for r in group):.0f} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solver", default=str(ROOT / "configs" / "mnist.yaml"))
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--periods", default="0,4,16,64")
    ap.add_argument("--history", default="averaged",
                    help="averaged, kept or averaged,kept (for periods > 0)")
    ap.add_argument("--seeds", default="1701,1702,1703")
    ap.add_argument("--out", default="/tmp/local_sgd.jsonl")
    ap.add_argument("--skip-done", action="store_true", help="skip runs already in --out")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    out = Path(args.out)
    done = ([json.loads(line) for line in out.read_text().splitlines() if line.strip()]
            if out.exists() else [])
    keys = {(r["period"], r["history"], r["seed"], r["iters"], r["replicas"]) for r in done}
    for seed in [int(s) for s in args.seeds.split(",")]:
        for period in [int(p) for p in args.periods.split(",")]:
            for history in (args.history.split(",") if period else ["averaged"]):
                key = (period, history if period else "-", seed, args.iters, args.replicas)
                if args.skip_done and key in keys:
                    continue
                row = run_one(args.solver, args.replicas, args.iters, period, history, seed)
                print(json.dumps(row), flush=True)
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                done.append(row)
    rows = [r for r in done if r["iters"] == args.iters and r["replicas"] == args.replicas]
    print(f"\nmachine: {platform.node()} ({platform.processor() or platform.machine()}), "
          f"date: {time.strftime('%Y-%m-%d %H:%M %Z')}")
    print(f"command: python {' '.join(shlex.quote(a) for a in sys.argv)}\n")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
