"""LeNet on the CPU: `cpy train` against the genuine BVLC Caffe 1.0 and a plain PyTorch loop.

    python benchmarks/cpu_vs_caffe.py --fmnist /usr/share/datasets/fashion-mnist \
        --caffe /opt/caffe/bin/caffe --save docs/performance.md
    python benchmarks/cpu_vs_caffe.py --busy --save docs/performance.md   # and under load

Caffe's examples/mnist LeNet (lenet_train_test.prototxt, lenet_solver.prototxt: SGD momentum
0.9, weight decay 5e-4, inv policy, batch 64) on Fashion-MNIST LMDBs written by
``cpy convert idx`` (Caffe reads them as they are), ``--iters`` iterations with no test pass
and no snapshot. Each row is one whole process (start-up, net construction, data, training),
timed from outside; the rows take turns ``--repeats`` times and the table keeps each row's
fastest run. The plain loop is fast_default.py's LeNet with Caffe's update rule written with
foreach ops, its batches sliced from the training images in memory (no data loading at all).
``--save FILE`` replaces the section between ``<!-- bench:cpu-lenet -->`` markers.

``--busy``: every round also runs each row beside a competing process, a Python busy loop
started before the row and ended after it (``--busy-pin CPU`` pins it to one CPU,
``--busy-nice N`` lowers its priority), and adds
two rows of ``cpy train`` with the thread count fixed by ``OMP_NUM_THREADS``: 1 (what one free
core gives) and the machine's cores (no following of the load: what every run did before
caffe_py/cpu_threads.py). Each run's "other load" is the CPU time the machine spent outside
the benchmark's own processes (``/proc/stat`` less the children's rusage), per second: other
people's work on a shared machine, which the table reports beside each kept run.
``--save FILE`` then replaces the ``<!-- bench:cpu-busy -->`` section.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOTXT = ROOT / "tests/fixtures/prototxts/bvlc/examples/mnist/lenet_train_test.prototxt"
MARK = "<!-- bench:cpu-lenet -->"
BUSY_MARK = "<!-- bench:cpu-busy -->"
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


def busy_seconds() -> float:
    """The machine's busy CPU seconds so far (every column of /proc/stat's cpu line but idle
    and iowait; niced work too: a compile under nice takes CPUs all the same)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks = [int(v) for v in fields[:8]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def children_seconds() -> float:
    """CPU seconds of this script's finished children (the rows and the busy loops)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclasses.dataclass
class Run:
    seconds: float
    other_load: float
    """CPUs the machine kept busy outside this script's processes during the run."""
    loss: str


@contextlib.contextmanager
def competing(busy: bool, pin: int | None, nice: int = 0) -> Iterator[None]:
    """A busy-loop process for the duration of the block (nothing when not ``busy``), pinned
    to CPU ``pin`` unless None, at niceness ``nice``."""
    if not busy:
        yield
        return
    code = "import os, sys\nif sys.argv[1] != '-': os.sched_setaffinity(0, {int(sys.argv[1])})" \
           "\nos.nice(int(sys.argv[2]))\nwhile True: pass"
    proc = subprocess.Popen([sys.executable, "-c", code, "-" if pin is None else str(pin),
                             str(nice)])
    try:
        time.sleep(0.5)  # running before the row starts
        yield
    finally:
        proc.kill()
        proc.wait()


def timed(cmd: list[str], env: dict[str, str], log: Path, busy: bool,
          pin: int | None, nice: int = 0) -> Run:
    """Wall seconds of ``cmd`` (its output to ``log``), beside a busy loop when ``busy``;
    a failure stops the benchmark."""
    wall0, busy0, own0 = time.perf_counter(), busy_seconds(), children_seconds()
    with competing(busy, pin, nice), log.open("w") as out:
        start = time.perf_counter()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
        seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (exit {done.returncode}); its output: {log}")
    window = time.perf_counter() - wall0
    others = (busy_seconds() - busy0 - (children_seconds() - own0)) / window
    return Run(seconds, max(others, 0.0), final_loss(log))


def final_loss(log: Path) -> str:
    """The last displayed training loss of a Caffe-format log ('-' when none)."""
    losses = re.findall(r"Iteration \d+.*?, loss = ([0-9.eE+-]+)", log.read_text())
    return losses[-1] if losses else "-"


NAMES = {
    "caffe": "BVLC Caffe 1.0 (`caffe train`)",
    "cpy": "caffe-py (`cpy train`, no flag)",
    "cpy_one": "caffe-py, `OMP_NUM_THREADS=1` (one core)",
    "cpy_all": "caffe-py, `OMP_NUM_THREADS={cores}` (the count fixed)",
    "plain": "plain PyTorch loop (data in memory)",
}


def row_name(key: str, cores: int) -> str:
    """The table's name of a row (``cpy@spin=N`` and ``cpy_all@spin=N``: --spin's rows)."""
    base, _, spin = key.partition("@spin=")
    name = NAMES[base].format(cores=cores)
    return f"{name}, `GOMP_SPINCOUNT={spin}`" if spin else name


def spin_flag(args: argparse.Namespace) -> str:
    return f" --spin {args.spin}" if args.spin else ""


def machine_line(args: argparse.Namespace, loads: tuple[float, float]) -> str:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores "
            f"(load average {loads[0]:.1f} at the start, {loads[1]:.1f} at the end), Python "
            f"{platform.python_version()}; {date}.")


def table(best: dict[str, Run], args: argparse.Namespace, loads: tuple[float, float]) -> str:
    caffe, cpy, plain = best["caffe"].seconds, best["cpy"].seconds, best["plain"].seconds
    rows = [
        (NAMES["caffe"], caffe, best["caffe"].loss, "1.00x"),
        (NAMES["cpy"], cpy, best["cpy"].loss, f"{caffe / cpy:.2f}x"),
        *[(row_name(key, os.cpu_count() or 1), run.seconds, run.loss,
           f"{caffe / run.seconds:.2f}x") for key, run in best.items() if "@spin=" in key],
        (NAMES["plain"], plain, "-", f"{caffe / plain:.2f}x"),
    ]
    lines = [
        machine_line(args, loads),
        f"Command: `python benchmarks/cpu_vs_caffe.py --iters {args.iters} "
        f"--repeats {args.repeats}{spin_flag(args)}`; LeNet, batch 64, {args.iters} "
        "iterations, whole processes, fastest of the repeats.", "",
        "| run | seconds | last displayed loss | speed vs Caffe |", "|---|---:|---|---:|"]
    lines += [f"| {name} | {s:.1f} | {loss} | {ratio} |" for name, s, loss, ratio in rows]
    lines += ["", f"`cpy train` against the plain loop: {plain / cpy:.2f}x its speed "
                  "(whole processes)."]
    return "\n".join(lines)


def busy_table(best: dict[tuple[str, bool], Run], args: argparse.Namespace,
               loads: tuple[float, float]) -> str:
    """Quiet and busy, each row's fastest run, its rate and its ratio to Caffe's in the same
    condition."""
    cores = os.cpu_count() or 1
    pin = "" if args.busy_pin is None else f" --busy-pin {args.busy_pin}"
    pin += f" --busy-nice {args.busy_nice}" if args.busy_nice else ""
    where = "unpinned" if args.busy_pin is None else f"pinned to CPU {args.busy_pin}"
    where += f", nice {args.busy_nice}" if args.busy_nice else ""
    lines = [
        machine_line(args, loads),
        f"Command: `python benchmarks/cpu_vs_caffe.py --busy{pin} --iters {args.iters} "
        f"--repeats {args.repeats}{spin_flag(args)}`; LeNet, batch 64, {args.iters} "
        f"iterations, whole processes (start-up included), fastest of the repeats; busy: "
        f"beside one Python busy loop ({where}). Other load: CPUs the machine kept busy "
        "outside the benchmark's processes during the kept run.", "",
        "| run | quiet: s | it/s | vs Caffe | other load | busy: s | it/s | vs Caffe | "
        "other load | busy / quiet |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for key in dict.fromkeys(name for name, _ in best):
        quiet, busy = best[key, False], best[key, True]
        cells = []
        for run, condition in ((quiet, False), (busy, True)):
            caffe = best["caffe", condition].seconds
            cells += [f"{run.seconds:.1f}", f"{args.iters / run.seconds:.1f}",
                      f"{caffe / run.seconds:.2f}x", f"{run.other_load:.2f}"]
        lines.append(f"| {row_name(key, cores)} | {' | '.join(cells)} | "
                     f"{quiet.seconds / busy.seconds:.2f} |")
    cpy, one = best["cpy", True].seconds, best["cpy_one", True].seconds
    verdict = "met" if cpy <= one else "not met"
    lines += ["", f"Busy: `cpy train` with no flag at {one / cpy:.2f}x the rate of one core "
                  f"(`OMP_NUM_THREADS=1`), {best['cpy_all', True].seconds / cpy:.1f}x the rate "
                  f"of the fixed count. No lower than one free core's rate: {verdict}."]
    return "\n".join(lines)


def save(path: Path, text: str, mark: str) -> None:
    if not path.is_file():
        sys.exit(f"{path}: no such file; --save names the document whose marked section the "
                 "table replaces (docs/performance.md)")
    doc = path.read_text()
    if doc.count(mark) != 2:
        sys.exit(f"{path}: needs two '{mark}' lines around the section to replace")
    head, _, rest = doc.partition(mark)
    _, _, tail = rest.partition(mark)
    path.write_text(f"{head}{mark}\n{text}\n{mark}{tail}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fmnist", type=Path, default=Path("/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--caffe", default="/opt/caffe/bin/caffe")
    ap.add_argument("--iters", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--busy", action="store_true",
                    help="also run every row beside a busy-loop process, and two rows with "
                         "the thread count fixed")
    ap.add_argument("--busy-pin", type=int, metavar="CPU",
                    help="pin the busy loop to this CPU (default: unpinned)")
    ap.add_argument("--busy-nice", type=int, default=0, metavar="N",
                    help="the busy loop's niceness (default 0: the rows' own priority)")
    ap.add_argument("--spin", metavar="LIST",
                    help="comma-separated GOMP_SPINCOUNT values: each adds a `cpy train` row "
                         "with it (and with --busy one of the fixed count), libgomp's wait "
                         "before a thread sleeps (its default: 300000, OMP_WAIT_POLICY=PASSIVE: "
                         "0)")
    ap.add_argument("--only", help="comma-separated rows to run (caffe,cpy,cpy_one,cpy_all,"
                                   "plain), for a quick look; no table")
    ap.add_argument("--save", type=Path)
    ap.add_argument("--plain-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_child:
        plain_child(args.fmnist, args.iters)
        return
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        caffe_solver, cpy_solver = make_files(args.fmnist, work, args.iters)
        env = {k: v for k, v in os.environ.items()
               if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "GOMP_SPINCOUNT",
                            "OMP_WAIT_POLICY")}
        cpy = [sys.executable, str(ROOT / "cli.py"), "train", "--solver", str(cpy_solver)]
        runs = {
            "caffe": ([args.caffe, "train", f"--solver={caffe_solver}"],
                      {**env, "GLOG_logtostderr": "1"}),
            "cpy": (cpy, env),
            "cpy_one": (cpy, {**env, "OMP_NUM_THREADS": "1"}),
            "cpy_all": (cpy, {**env, "OMP_NUM_THREADS": str(os.cpu_count() or 1)}),
            "plain": ([sys.executable, __file__, "--plain-child", "--fmnist", str(args.fmnist),
                       "--iters", str(args.iters)], env),
        }
        names = ["caffe", "cpy", "cpy_one", "cpy_all", "plain"] if args.busy else \
            ["caffe", "cpy", "plain"]
        for spin in args.spin.split(",") if args.spin else []:
            for base in ("cpy", "cpy_all") if args.busy else ("cpy",):
                cmd, base_env = runs[base]
                runs[f"{base}@spin={spin}"] = (cmd, {**base_env, "GOMP_SPINCOUNT": spin})
                names.insert(names.index("plain"), f"{base}@spin={spin}")
        if args.only:
            names = [n for n in args.only.split(",") if n in runs]
        conditions = (False, True) if args.busy else (False,)
        best: dict[tuple[str, bool], Run] = {}
        for r in range(args.repeats):
            for busy in conditions:
                for name in names:
                    cmd, run_env = runs[name]
                    log = work / f"{name}_{'busy' if busy else 'quiet'}_{r}.log"
                    run = timed(cmd, run_env, log, busy, args.busy_pin, args.busy_nice)
                    print(f"{name} {'busy' if busy else 'quiet'} run {r + 1}: {run.seconds:.1f} "
                          f"s, other load {run.other_load:.2f} CPUs, load average "
                          f"{os.getloadavg()[0]:.1f}", flush=True)
                    kept = best.get((name, busy))
                    if kept is None or run.seconds < kept.seconds:
                        best[name, busy] = run
    if args.only:
        return
    loads = (load_start, os.getloadavg()[0])
    if args.busy:
        text, mark = busy_table(best, args, loads), BUSY_MARK
    else:
        text, mark = table({k: v for (k, _), v in best.items()}, args, loads), MARK
    print(text)
    if args.save:
        save(args.save, text, mark)


if __name__ == "__main__":
    main()
