"""LeNet on the CPU: `cpy train` against the genuine BVLC Caffe 1.0 and a plain PyTorch loop.

    python benchmarks/cpu_vs_caffe.py --fmnist /usr/share/datasets/fashion-mnist \
        --caffe /opt/caffe/bin/caffe --save docs/performance.md

Caffe's examples/mnist LeNet (lenet_train_test.prototxt, lenet_solver.prototxt: SGD momentum
0.9, weight decay 5e-4, inv policy, batch 64) on Fashion-MNIST LMDBs written by
``cpy convert idx`` (Caffe reads them as they are), ``--iters`` iterations with no test pass
and no snapshot. Each row is one whole process (start-up, net construction, data, training),
timed from outside; the rows take turns ``--repeats`` times and the table keeps each row's
fastest run. The plain loop is fast_default.py's LeNet with Caffe's update rule written with
foreach ops, its batches sliced from the training images in memory (no data loading at all).
``--save FILE`` replaces the section between ``<!-- bench:cpu-lenet -->`` markers.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOTXT = ROOT / "tests/fixtures/prototxts/bvlc/examples/mnist/lenet_train_test.prototxt"
MARK = "<!-- bench:cpu-lenet -->"
SOLVER = """net: "{net}"
test_iter: 1
test_interval: 100000000
test_initialization: false
base_lr: 0.01
momentum: 0.9
weight_decay: 0.0005
lr_policy: "inv"
gamma: 0.0001
power: 0.75
display: 100
max_iter: {iters}
snapshot_after_train: false
snapshot_prefix: "{prefix}"
solver_mode: CPU
random_seed: 1701
"""


def make_files(fmnist: Path, work: Path, iters: int) -> tuple[Path, Path]:
    """The LMDBs, Caffe's prototxts and caffe-py's YAML solver: (Caffe solver, cpy solver)."""
    import yaml

    sys.path.insert(0, str(ROOT))
    from caffe_py.tools.convert import convert_idx

    for split, stem in (("train", "train"), ("test", "t10k")):
        convert_idx(fmnist / f"{stem}-images-idx3-ubyte.gz",
                    fmnist / f"{stem}-labels-idx1-ubyte.gz", work / f"{split}_lmdb")
    text = PROTOTXT.read_text()
    text = text.replace("examples/mnist/mnist_train_lmdb", str(work / "train_lmdb"))
    text = text.replace("examples/mnist/mnist_test_lmdb", str(work / "test_lmdb"))
    (work / "lenet.prototxt").write_text(text)
    caffe = work / "caffe_solver.prototxt"
    caffe.write_text(SOLVER.format(net=work / "lenet.prototxt", iters=iters,
                                   prefix=work / "caffe"))
    net = yaml.safe_load((ROOT / "configs/lenet.yaml").read_text())
    for layer in net["layer"]:
        if layer["type"] == "Data":
            split = "train" if "train" in layer["data_param"]["source"] else "test"
            layer["data_param"]["source"] = str(work / f"{split}_lmdb")
    (work / "lenet.yaml").write_text(yaml.safe_dump(net, sort_keys=False))
    solver = yaml.safe_load((ROOT / "configs/mnist.yaml").read_text())
    solver.update(net="lenet.yaml", max_iter=iters, test_interval=0, snapshot=0,
                  snapshot_after_train=False, snapshot_prefix=str(work / "cpy"),
                  solver_mode="CPU")
    cpy = work / "mnist.yaml"
    cpy.write_text(yaml.safe_dump(solver, sort_keys=False))
    return caffe, cpy


def plain_child(fmnist: Path, iters: int) -> None:
    """The plain loop, run as its own process by :func:`main` (``--plain-child``)."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from fast_default import CaffeSGD, LeNet, idx_arrays, inv_rate

    torch.manual_seed(1701)
    images, labels = idx_arrays(fmnist)
    model = LeNet()
    opt = CaffeSGD(model, torch.device("cpu"))
    n = len(labels) // 64
    for it in range(iters):
        for p in model.parameters():
            p.grad = None
        k = it % n
        x = images[k * 64:(k + 1) * 64].float().mul_(0.00390625)
        F.cross_entropy(model(x), labels[k * 64:(k + 1) * 64]).backward()
        opt.step(inv_rate(it))


def timed(cmd: list[str], log: Path) -> float:
    """Wall seconds of ``cmd`` (its output to ``log``); a failure stops the benchmark."""
    start = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (exit {done.returncode}); its output: {log}")
    return seconds


def final_loss(log: Path) -> str:
    """The last displayed training loss of a Caffe-format log ('-' when none)."""
    losses = re.findall(r"Iteration \d+.*?, loss = ([0-9.eE+-]+)", log.read_text())
    return losses[-1] if losses else "-"


def table(best: dict[str, float], losses: dict[str, str], args: argparse.Namespace) -> str:
    caffe, cpy, plain = best["caffe"], best["cpy"], best["plain"]
    rows = [
        ("BVLC Caffe 1.0 (`caffe train`)", caffe, losses["caffe"], "1.00x"),
        ("caffe-py (`cpy train`, no flag)", cpy, losses["cpy"], f"{caffe / cpy:.2f}x"),
        ("plain PyTorch loop (data in memory)", plain, "-", f"{caffe / plain:.2f}x"),
    ]
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0]
    lines = [
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
        f"(load average {load:.1f} at the end), Python {platform.python_version()}; {date}.",
        f"Command: `python benchmarks/cpu_vs_caffe.py --iters {args.iters} "
        f"--repeats {args.repeats}`; LeNet, batch 64, {args.iters} iterations, whole "
        "processes, fastest of the repeats.", "",
        "| run | seconds | last displayed loss | speed vs Caffe |", "|---|---:|---|---:|"]
    lines += [f"| {name} | {s:.1f} | {loss} | {ratio} |" for name, s, loss, ratio in rows]
    lines += ["", f"`cpy train` against the plain loop: {plain / cpy:.2f}x its speed "
                  "(whole processes)."]
    return "\n".join(lines)


def save(path: Path, text: str) -> None:
    doc = path.read_text()
    if doc.count(MARK) != 2:
        sys.exit(f"{path}: needs two '{MARK}' lines around the section to replace")
    head, _, rest = doc.partition(MARK)
    _, _, tail = rest.partition(MARK)
    path.write_text(f"{head}{MARK}\n{text}\n{MARK}{tail}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fmnist", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--caffe", default="/opt/caffe/bin/caffe")
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--save", type=Path)
    ap.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_child:
        plain_child(args.fmnist, args.iters)
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        caffe_solver, cpy_solver = make_files(args.fmnist, work, args.iters)
        env_caffe = {**os.environ, "GLOG_logtostderr": "1"}
        runs = {
            "caffe": lambda log: timed(["env", *(f"{k}={v}" for k, v in env_caffe.items()
                                                 if k.startswith("GLOG")),
                                        args.caffe, "train", f"--solver={caffe_solver}"], log),
            "cpy": lambda log: timed([sys.executable, str(ROOT / "cli.py"), "train",
                                      "--solver", str(cpy_solver)], log),
            "plain": lambda log: timed([sys.executable, __file__, "--plain-child",
                                        "--fmnist", str(args.fmnist),
                                        "--iters", str(args.iters)], log),
        }
        best: dict[str, float] = {}
        losses: dict[str, str] = {}
        for r in range(args.repeats):
            for name, run in runs.items():
                log = work / f"{name}_{r}.log"
                seconds = run(log)
                print(f"{name} run {r + 1}: {seconds:.1f} s", flush=True)
                best[name] = min(best.get(name, seconds), seconds)
                losses[name] = final_loss(log)
        text = table(best, losses, args)
    print(text)
    if args.save:
        save(args.save, text)


if __name__ == "__main__":
    main()
