"""Which OpenMP runtime torch's CPU kernels run on, and what controls how its threads wait.

    python benchmarks/openmp_wait.py [--repeats 3]

Each variant is a fresh process (the runtime reads its settings once, when torch loads it)
that measures, with torch's default thread count:

* the runtime torch loaded (``libgomp`` or Intel's ``libiomp5``, from /proc/self/maps);
* idle burn: CPU seconds per wall second while the calling thread alternates one parallel op
  (``mul_`` of 1M floats) with 2.5 ms of its own work and sleep, during which the other
  threads have nothing to do (about 0.25 when they sleep, 1 when they spin the gap away);
* back to back: microseconds per small parallel op (``mul_`` of 256K floats) run one after
  another, as a LeNet step's ops are: what waking sleeping threads costs.

Variants: the defaults; ``GOMP_SPINCOUNT=0`` set before torch is imported and the same set
after (``os.environ`` once torch is loaded); ``OMP_WAIT_POLICY=PASSIVE``; Intel's
``KMP_BLOCKTIME=0``; ``GOMP_SPINCOUNT`` values between. The table keeps each variant's median
over ``--repeats`` rounds taken in turn. docs/performance.md ("A busy machine") keeps it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

VARIANTS = [
    ("defaults", {}, None),
    ("GOMP_SPINCOUNT=0 before torch is imported", {"GOMP_SPINCOUNT": "0"}, None),
    ("GOMP_SPINCOUNT=0 set after torch is imported", {}, "0"),
    ("OMP_WAIT_POLICY=PASSIVE", {"OMP_WAIT_POLICY": "PASSIVE"}, None),
    ("KMP_BLOCKTIME=0 (Intel's runtime's)", {"KMP_BLOCKTIME": "0"}, None),
    ("GOMP_SPINCOUNT=10000", {"GOMP_SPINCOUNT": "10000"}, None),
    ("GOMP_SPINCOUNT=30000", {"GOMP_SPINCOUNT": "30000"}, None),
]
CLEARED = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "OMP_NUM_THREADS")


def child(late_spincount: str | None) -> None:
    """One variant's measurements, printed as JSON."""
    import resource

    import torch

    if late_spincount is not None:
        os.environ["GOMP_SPINCOUNT"] = late_spincount
    x = torch.randn(1 << 20)
    for _ in range(50):
        x.mul_(1.0)
    start, usage = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(400):
        x.mul_(1.0)
        t = time.perf_counter()
        while time.perf_counter() - t < 0.0005:  # the calling thread's own work
            pass
        time.sleep(0.002)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - usage.ru_utime + after.ru_stime - usage.ru_stime
    y = torch.randn(1 << 18)
    start = time.perf_counter()
    for _ in range(20000):
        y.mul_(1.0)
    per_op = (time.perf_counter() - start) / 20000
    with open("/proc/self/maps") as maps:
        libs = {line.split()[-1].rsplit("/", 1)[-1] for line in maps if ".so" in line}
    runtime = sorted(lib for lib in libs if "gomp" in lib or "iomp" in lib)
    print(json.dumps({"burn": cpu / wall, "op_us": per_op * 1e6, "runtime": runtime,
                      "threads": torch.get_num_threads()}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--late", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.late)
        return
    base = {k: v for k, v in os.environ.items() if k not in CLEARED}
    results: dict[str, list[dict]] = {name: [] for name, _, _ in VARIANTS}
    for _ in range(args.repeats):
        for name, env, late in VARIANTS:
            cmd = [sys.executable, __file__, "--child"] + (["--late", late] if late else [])
            out = subprocess.run(cmd, env={**base, **env}, capture_output=True, text=True,
                                 check=True).stdout
            results[name].append(json.loads(out))
    first = results["defaults"][0]
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"Machine: {platform.machine()}, {os.cpu_count()} cores (load average "
          f"{os.getloadavg()[0]:.1f} at the end); {date}; torch's OpenMP runtime: "
          f"{', '.join(first['runtime']) or 'none found'}, {first['threads']} threads.")
    print(f"Command: `python benchmarks/openmp_wait.py --repeats {args.repeats}`; medians.\n")
    print("| variant | idle burn (CPU s per s) | back to back (us per op) |")
    print("|---|---:|---:|")
    for name, runs in results.items():
        burn = statistics.median(r["burn"] for r in runs)
        op = statistics.median(r["op_us"] for r in runs)
        print(f"| {name} | {burn:.2f} | {op:.1f} |")


if __name__ == "__main__":
    main()
