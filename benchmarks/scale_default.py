"""`cpy train --gpus 0..N-1` with no other flag against torchrun DDP, in one run: the scaling
goals of the multi-GPU default.

    python benchmarks/scale_default.py --out DIR [--max-gpus 4] [--models resnet50,lenet]
    python benchmarks/scale_default.py --out DIR --gpus 1,2,4,3 --compare-overlap --budget-s 300
    python benchmarks/scale_default.py --out DIR --cpu          # a smoke run on CPU replicas

Models: ResNet-50 (configs/resnet50_dummy.yaml with constant DummyData, bf16 autocast,
channels_last by the solver's AUTO memory format, batch 256 per GPU), resnet50_fp16 (the same
with ``precision: FLOAT16`` and its dynamic loss scaling; its goal column compares its rate
with BF16's at the same count when ``--models`` lists resnet50 first) and LeNet (configs/
lenet.yaml on constant DummyData, fp32, batch 64 per GPU). Each `cpy train` is a fresh process
as a user runs it, on a solver file that fixes max_iter and display; its rate is the median of
Caffe's display lines ("Iteration I (R iter/s, ...)") after the first two, in images/s = R x
batch x N. Baselines in the same run: torchrun DDP over torchvision's resnet50 (ResNet-50) or
over caffe-py's net as an nn.Module (LeNet), same batch per GPU (benchmarks/ddp_baseline.py),
and the plain 1-GPU torchvision loop; "of linear" is the rate over N x the same model's 1-GPU
`cpy train` rate. The table (with the goals' verdicts) is printed last and written to
DIR/scale_default.md; every result is a JSON line in DIR/scale_default.jsonl.

With --compare-overlap every run of several GPUs is made a second time with the solver's
``layer_wise_reduce: false`` (the gradients all-reduced after backward instead of bucket by
bucket during it), in the same run, and the table gains its rate and the ratio. The runs go
GPU count by GPU count in the order --gpus gives, every model at each; with --budget-s a run
that would start after that many seconds is skipped (and says so in the table).

With --apart every count N > 1 also runs as N one-GPU `cpy train` processes at once, GPU i
each, which share nothing but the host (its power, memory bandwidth, PCIe, CPUs): their summed
rate over N x the 1-GPU rate is what the host alone leaves of linear, the bound that any
reduction's "of linear" is measured under.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from multigpu import constant_dummy_data, lenet_dummy, write_solver  # noqa: E402

RATE = re.compile(r"Iteration (\d+) \(([\d.e+]+) iter/s")
MODELS = {
    # name: (display interval, max_iter, DDP warm-up/iterations)
    "resnet50": (10, 80, (15, 30)),
    "resnet50_fp16": (10, 80, (15, 30)),
    "lenet": (1000, 8000, (200, 2000)),
}
PRECISION = {"resnet50": "BF16", "resnet50_fp16": "FLOAT16"}
"""ResNet-50's solver precision per model name (resnet50_fp16: FLOAT16 with dynamic loss
scaling, its speed compared with BF16's in the same run)."""


def without_overlap(solver: Path) -> Path:
    """The same solver with ``layer_wise_reduce: false``."""
    spec = yaml.safe_load(solver.read_text())
    spec["layer_wise_reduce"] = False
    path = solver.with_name(f"{solver.stem}_after_backward.yaml")
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def solver_for(model: str, out: Path, cpu: bool) -> Path:
    """The model's solver with max_iter and display fixed (nothing left to a flag)."""
    if model in PRECISION and not cpu:
        net = constant_dummy_data(yaml.safe_load((ROOT / "configs/resnet50_dummy.yaml")
                                                 .read_text()))
        path = write_solver(net, out, model, PRECISION[model])
    else:   # LeNet (and the CPU smoke run's stand-in for ResNet-50)
        net = lenet_dummy(yaml.safe_load((ROOT / "configs/lenet.yaml").read_text()), 64)
        path = write_solver(net, out, model, "FLOAT32")
    display, max_iter, _ = MODELS[model]
    if cpu:
        display, max_iter = 5, 30
    solver = yaml.safe_load(path.read_text())
    solver.update(display=display, max_iter=max_iter)
    path.write_text(yaml.safe_dump(solver, sort_keys=False))
    return path


def batch_of(solver: Path) -> int:
    net = yaml.safe_load(Path(yaml.safe_load(solver.read_text())["net"]).read_text())
    data = next(layer for layer in net["layer"] if layer["type"] == "DummyData")
    return int(data["dummy_data_param"]["shape"][0]["dim"][0])


def cpy_train(solver: Path, n: int, out: Path, cpu: bool, timeout: float = 900) -> dict:
    """One `cpy train --gpus ...` process; its display rates."""
    gpus = f"cpu:{n}" if cpu else ",".join(str(i) for i in range(n))
    try:
        done = subprocess.run(_train_command(solver, gpus, out, f"{n}"), capture_output=True,
                              text=True, timeout=timeout, cwd=out)
    except subprocess.TimeoutExpired as exc:
        text = _text(exc.stdout) + _text(exc.stderr)
        (out / f"cpy_{solver.stem}_{n}.log").write_text(text)
        return {"ok": False, "why": f"no end within {timeout:.0f} s"}
    text = done.stdout + done.stderr
    (out / f"cpy_{solver.stem}_{n}.log").write_text(text)
    return _rates(text, done.returncode, batch_of(solver) * n)


def cpy_apart(solver: Path, n: int, out: Path, timeout: float = 900) -> dict:
    """n one-GPU `cpy train` processes at once, GPU i each (CUDA_VISIBLE_DEVICES), sharing
    nothing but the host: how far the host alone keeps N GPUs from N x one GPU's rate."""
    procs = []
    for i in range(n):
        log = (out / f"cpy_{solver.stem}_apart{n}_{i}.log").open("w")
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(i)}
        procs.append((subprocess.Popen(_train_command(solver, "0", out, f"apart{n}_{i}"),
                                       stdout=log, stderr=subprocess.STDOUT, text=True,
                                       cwd=out, env=env), log))
    deadline = time.monotonic() + timeout
    results = []
    for i, (proc, log) in enumerate(procs):
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        log.close()
        text = (out / f"cpy_{solver.stem}_apart{n}_{i}.log").read_text()
        results.append(_rates(text, code, batch_of(solver)))
    failed = [r for r in results if not r["ok"]]
    if failed:
        return failed[0]
    return {"ok": True, "images_per_s": sum(r["images_per_s"] for r in results),
            "per_gpu": [r["images_per_s"] for r in results]}


def _train_command(solver: Path, gpus: str, out: Path, tag: str) -> list[str]:
    """The `cpy train` command line on a copy of ``solver`` with its own snapshot prefix."""
    prefix = out / f"snap_{solver.stem}_{tag}"
    subprocess.run(["rm", "-rf", str(prefix)], check=False)
    solver_copy = out / f"{solver.stem}_{tag}.yaml"
    spec = yaml.safe_load(solver.read_text())
    spec["snapshot_prefix"] = str(prefix / "s")
    solver_copy.write_text(yaml.safe_dump(spec, sort_keys=False))
    return [sys.executable, str(ROOT / "cli.py"), "train", "--solver", str(solver_copy),
            "--gpus", gpus, "--log-format", "plain"]


def _rates(text: str, code: int, images_per_iteration: int) -> dict:
    """A run's result from its output: the median display rate after the first two (every
    display line's rate, iterations a second, in ``rates``)."""
    rates = [float(m.group(2)) for m in RATE.finditer(text)]
    notes = [line for line in text.splitlines() if "CUDA graphs off" in line
             or "whole iterations" in line or "reduction tree" in line]
    if code != 0 or len(rates) < 3:
        tail = " | ".join(text.strip().splitlines()[-3:])
        return {"ok": False, "why": f"exit {code}: {tail}"}
    per_s = statistics.median(rates[2:])
    return {"ok": True, "iter_per_s": per_s, "images_per_s": per_s * images_per_iteration,
            "notes": notes, "rates": rates}


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def ddp(solver: Path, n: int, model: str, out: Path, cpu: bool, timeout: float = 900) -> dict:
    """torchrun DDP (n > 1) or the plain 1-GPU loop (n = 1) on the same batch per GPU."""
    warmup, iters = MODELS[model][2]
    if cpu:
        warmup, iters = 2, 5
    result = out / f"ddp_{model}_{n}.jsonl"
    result.unlink(missing_ok=True)
    common = ["--solver", str(solver), "--warmup", str(warmup), "--iters", str(iters),
              "--json", str(result), *(["--cpu"] if cpu else [])]
    if model == "resnet50" and not cpu:
        common += ["--torchvision", "--channels-last"]
    if n == 1:
        cmd = [sys.executable, str(ROOT / "benchmarks/ddp_baseline.py"), "--plain", *common]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(n), str(ROOT / "benchmarks/ddp_baseline.py"), *common]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ok": False, "why": f"no end within {timeout:.0f} s"}
    (out / f"ddp_{model}_{n}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0 or not result.exists():
        return {"ok": False, "why": f"exit {done.returncode}"}
    return {"ok": True, **json.loads(result.read_text().splitlines()[-1])}


def verdicts(model: str, n: int, ratio_ddp: float | None, of_linear: float | None,
             speedup: float | None, bf16: float | None = None) -> str:
    goals = []
    if model == "resnet50" and n >= 2:
        if ratio_ddp is not None:
            goals.append(f"vs DDP >= 1.05: {'met' if ratio_ddp >= 1.05 else 'NOT met'}")
        if of_linear is not None:
            goals.append(f">= 99% of linear: {'met' if of_linear >= 0.99 else 'NOT met'}")
    if model == "resnet50" and n == 1 and ratio_ddp is not None:
        goals.append(f">= 1.10x torchvision: {'met' if ratio_ddp >= 1.10 else 'NOT met'}")
    if model == "resnet50_fp16" and bf16 is not None:
        goals.append(f"FLOAT16 >= BF16's speed ({bf16:.3f}x): "
                     f"{'met' if bf16 >= 1.0 else 'NOT met'}")
    if model == "lenet" and n in (2, 4) and speedup is not None:
        want = 1.8 if n == 2 else 3.0
        goals.append(f">= {want}x one GPU: {'met' if speedup >= want else 'NOT met'}")
    return "; ".join(goals)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--max-gpus", type=int, default=4)
    ap.add_argument("--models", default="resnet50,lenet")
    ap.add_argument("--gpus", default=None, metavar="LIST",
                    help="GPU counts to run, in this order, e.g. 1,2,4,3 (default: 1..max-gpus; "
                         "1 is needed for 'of linear')")
    ap.add_argument("--cpu", action="store_true", help="smoke run on CPU replicas")
    ap.add_argument("--ddp-models", default="resnet50,lenet",
                    help="models that get the DDP baseline rows")
    ap.add_argument("--compare-overlap", action="store_true",
                    help="also run every count > 1 with layer_wise_reduce: false")
    ap.add_argument("--apart", action="store_true",
                    help="also run every count > 1 as that many one-GPU processes at once")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="skip the runs that would start after this many seconds")
    ap.add_argument("--run-timeout-s", type=float, default=900,
                    help="a run that has not ended after this many seconds fails")
    args = ap.parse_args()
    started = time.monotonic()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.cpu:
        gpus = args.max_gpus
    else:
        import torch

        gpus = min(args.max_gpus, torch.cuda.device_count())
    counts = [int(c) for c in args.gpus.split(",")] if args.gpus else list(range(1, gpus + 1))
    models = args.models.split(",")
    solvers = {model: solver_for(model, out, args.cpu) for model in models}
    jsonl = out / "scale_default.jsonl"
    skipped = {"ok": False, "why": "skipped: the time budget was spent"}

    def spent() -> bool:
        return args.budget_s is not None and time.monotonic() - started > args.budget_s

    ones: dict[str, float] = {}
    rows = []
    t = args.run_timeout_s
    for n in counts:
        for model in models:
            solver = solvers[model]
            cpy = skipped if spent() else cpy_train(solver, n, out, args.cpu, t)
            after: dict = {"ok": False}
            if args.compare_overlap and n > 1:
                after = skipped if spent() else cpy_train(without_overlap(solver), n, out,
                                                          args.cpu, t)
            apart: dict = {"ok": False}
            if args.apart and n > 1 and not args.cpu:
                apart = skipped if spent() else cpy_apart(solver, n, out, t)
            base: dict = {"ok": False}
            if model in args.ddp_models.split(","):
                base = skipped if spent() else ddp(solver, n, model, out, args.cpu, t)
            if n == 1 and cpy["ok"]:
                ones[model] = cpy["images_per_s"]
            one = ones.get(model)
            ratio = (cpy["images_per_s"] / base["images_per_s"]
                     if cpy["ok"] and base["ok"] else None)
            linear = cpy["images_per_s"] / (one * n) if cpy["ok"] and one else None
            speedup = cpy["images_per_s"] / one if cpy["ok"] and one else None
            gain = (cpy["images_per_s"] / after["images_per_s"]
                    if cpy["ok"] and after["ok"] else None)
            apart_linear = apart["images_per_s"] / (one * n) if apart["ok"] and one else None
            record = {"model": model, "gpus": n, "cpy": cpy, "after_backward": after,
                      "baseline": base, "vs_baseline": ratio, "of_linear": linear,
                      "vs_after_backward": gain, "apart": apart,
                      "apart_of_linear": apart_linear}
            with jsonl.open("a") as f:
                f.write(json.dumps(record) + "\n")
            bf16 = None   # FLOAT16's rate over BF16's at this count (both run before)
            if model == "resnet50_fp16" and cpy["ok"]:
                same = [r[2] for r in rows if r[0] == "resnet50" and r[1] == n and r[2]["ok"]]
                bf16 = cpy["images_per_s"] / same[0]["images_per_s"] if same else None
            rows.append((model, n, cpy, after, base, ratio, linear, gain, apart, apart_linear,
                         verdicts(model, n, ratio, linear, speedup, bf16)))
            print(json.dumps(record), flush=True)
    rows.sort(key=lambda row: (models.index(row[0]), row[1]))
    models_default = "resnet50,lenet"
    command = (f"`python benchmarks/scale_default.py --out DIR --max-gpus {args.max_gpus}"
               f"{f' --models {args.models}' if args.models != models_default else ''}"
               f"{f' --gpus {args.gpus}' if args.gpus else ''}"
               f"{f' --ddp-models {args.ddp_models}' if args.ddp_models != models_default else ''}"
               f"{' --compare-overlap' if args.compare_overlap else ''}"
               f"{' --apart' if args.apart else ''}"
               f"{f' --budget-s {args.budget_s:g}' if args.budget_s is not None else ''}"
               f"{' --cpu' if args.cpu else ''}`")
    lines = [f"Machine: {platform.node()}, {gpus} {'CPU replicas' if args.cpu else 'GPUs'}; "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; {command}",
             "",
             "| model | GPUs | `cpy train`, no flag: img/s | layer_wise_reduce false: img/s "
             "| no flag vs false | baseline (n=1: plain loop; else torchrun DDP): img/s | "
             "vs baseline | of linear | N one-GPU runs at once: img/s | theirs of linear | "
             "goals |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, n, cpy, after, base, ratio, linear, gain, apart, apart_linear, goal in rows:
        lines.append(f"| {model} | {n} | {_rate(cpy)} | {_rate(after)} | "
                     f"{f'{gain:.3f}x' if gain else '-'} | {_rate(base)} | "
                     f"{f'{ratio:.3f}x' if ratio else '-'} | "
                     f"{f'{linear:.1%}' if linear else '-'} | {_rate(apart)} | "
                     f"{f'{apart_linear:.1%}' if apart_linear else '-'} | {goal} |")
    table = "\n".join(lines)
    (out / "scale_default.md").write_text(table + "\n")
    print(table)


def _rate(result: dict) -> str:
    if result.get("ok"):
        return f"{result['images_per_s']:,.0f}"
    return f"failed ({result['why'][:80]})" if "why" in result else "-"


if __name__ == "__main__":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    main()
