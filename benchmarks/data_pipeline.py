"""Data pipeline benchmark: how fast the reader decodes and the feed delivers, and (with
--train) what share of a training step waits for data.

    python benchmarks/data_pipeline.py                     # CPU: records/s and batches/s
    python benchmarks/data_pipeline.py --save docs/data_pipeline.md
    python benchmarks/data_pipeline.py --device cuda --train --save docs/data_pipeline.md

Everything runs on synthetic LMDBs written to a temporary directory: 28x28x1 records
(MNIST-like) and 3x224x224 records (ImageNet-like), uint8. ``--train`` times forward/backward
steps of a LeNet-like and a ResNet-50-like net (plain torch, so nothing but torch and this
repository is needed) fed by the Data layer through the ReaderPool, against the same steps fed
by a DummyData layer (data already on the device): the ratio of the step rates is the share of
the step not spent waiting for data (goal >= 0.97).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

# Idle OpenMP workers sleep instead of spinning: a spinning team steals the cores the reader
# threads need on a small CPU machine (set before torch loads OpenMP; see docs/data_pipeline.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caffe_py.io import ReaderPool, attach_feeds  # noqa: E402
from caffe_py.io.db.lmdb_store import LmdbWriter  # noqa: E402
from caffe_py.io.feed.transformer import Choices  # noqa: E402
from caffe_py.io.formats.datum import datum_from_array, encode_datum  # noqa: E402
from caffe_py.io.reader import FeedSpec  # noqa: E402
from caffe_py.layers import BuildContext, lookup  # noqa: E402
from caffe_py.spec.net_spec import parse_layer  # noqa: E402
from caffe_py.spec.schema import Source  # noqa: E402


@dataclass
class Kind:
    """One record kind: its shape, how many records the database holds, the batch size, the
    transform (as a Caffe user would set it) and the net trained on it with --train."""

    name: str
    shape: tuple[int, int, int]
    records: int
    batch: int
    transform: dict
    model: str


KINDS = [
    Kind("28x28x1", (1, 28, 28), 20000, 64, {"scale": 0.00390625}, "LeNet"),
    Kind("3x224x224", (3, 224, 224), 768, 128,
         {"mirror": True, "mean_value": [104, 117, 123], "scale": 0.017}, "ResNet-50"),
]


class _Net:
    def __init__(self, layers):
        self.layers = layers

    def data_layers(self):
        return self.layers


def make_db(root: str, kind: Kind) -> str:
    path = os.path.join(root, f"db_{kind.name}")
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (16, *kind.shape), dtype=np.uint8)
    with LmdbWriter(path) as writer:
        for i in range(kind.records):
            datum = datum_from_array(base[i % 16], i % 10)
            writer.put(b"%08d" % i, encode_datum(datum))
    return path


def data_layer(db: str, kind: Kind, device: str, phase: str = "TRAIN"):
    spec = parse_layer({"name": "data", "type": "Data", "top": ["data", "label"],
                        "data_param": {"source": db, "batch_size": kind.batch},
                        "transform_param": kind.transform}, Source(), "layer")
    return lookup("Data")(spec, [], BuildContext(phase=phase, device=torch.device(device)))


def dummy_layer(kind: Kind, device: str):
    spec = parse_layer({"name": "data", "type": "DummyData", "top": ["data", "label"],
                        "dummy_data_param": {"shape": [{"dim": [kind.batch, *kind.shape]},
                                                       {"dim": [kind.batch]}]}},
                       Source(), "layer")
    return lookup("DummyData")(spec, [], BuildContext(device=torch.device(device)))


# --- pipeline rates -------------------------------------------------------------------------
@dataclass
class Record:
    """One record as a consumer taking records one by one holds it."""

    position: int
    key: bytes
    array: np.ndarray
    label: int


def take_records(queue, n: int) -> list[Record]:
    """The next ``n`` records one by one: the per-record consumer this rate has always been
    measured with (so the column compares across versions)."""
    batch = queue.get_batch(n)
    return [Record(int(p), k, a, int(label)) for p, k, a, label in
            zip(batch.positions, batch.keys, batch.pixels, batch.labels, strict=True)]


def decode_rate(db: str, kind: Kind, seconds: float) -> float:
    """Records/s through the producer thread alone (read, decode, queue)."""
    with ReaderPool() as pool:
        queue = pool.subscribe(FeedSpec(db, kind.batch, 4, kind.shape), "bench", replica=0)
        pool.start()
        take_records(queue, kind.batch)
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            n += len(take_records(queue, kind.batch))
        return n / (time.perf_counter() - start)


def batch_rate(db: str, kind: Kind, device: str, seconds: float) -> float:
    """Batches/s the Data layer delivers (reader + transform + prefetch, nothing computing)."""
    layer = data_layer(db, kind, device)
    with ReaderPool() as pool:
        attach_feeds(_Net([layer]), pool, device=device, seed=0)
        pool.start()
        layer()
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            data, _ = layer()
            n += 1
        if device == "cuda":
            torch.cuda.synchronize()
        return n / (time.perf_counter() - start)


# --- training steps -------------------------------------------------------------------------
class LeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 20, 5), nn.Conv2d(20, 50, 5)
        self.fc1, self.fc2 = nn.Linear(800, 500), nn.Linear(500, 10)

    def forward(self, x):
        x = F.max_pool2d(self.conv1(x), 2, 2)
        x = F.max_pool2d(self.conv2(x), 2, 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True), nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return F.relu(self.body(x) + self.skip(x))


def resnet50(classes: int = 1000) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                               nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def make_step(model: nn.Module, source, device: str, channels_last: bool):
    """One SGD step on the next batch of ``source``; returns the seconds spent getting it."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    fmt = torch.channels_last if channels_last else torch.contiguous_format

    def step() -> float:
        t0 = time.perf_counter()
        x, y = source()
        waited = time.perf_counter() - t0
        x = x.contiguous(memory_format=fmt)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = F.cross_entropy(model(x), y.long())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return waited

    return step


def time_steps(step, device: str, steps: int) -> tuple[float, float]:
    """(steps/s, ms per step spent getting the batch)."""
    _sync(device)
    waited, start = 0.0, time.perf_counter()
    for _ in range(steps):
        waited += step()
    _sync(device)
    return steps / (time.perf_counter() - start), 1000 * waited / steps


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def first_pass(kind: Kind) -> int:
    """Steps until the Data side has consumed one pass over the database: by then the reader
    keeps it decoded (when it is small), and the steady state (every later epoch) begins."""
    return -(-kind.records // kind.batch) + 1


def feed_path(feed) -> str:
    """How the Data layer got its batches at the end: gathered by the training thread from
    the decoded database, or assembled by the reader and feed threads."""
    return "gathered in the loop" if feed.gathers_in_loop else "threads"


def train_compare(db: str, kind: Kind, device: str, steps: int, warmup: int,
                  rounds: int = 2) -> dict:
    """Steps fed by DummyData and by Data, alternated ``rounds`` times after a warm-up of
    both (the Data side's covers the first pass over the database); each side keeps its best
    round (so warm-up and clock drift favour neither)."""
    torch.manual_seed(0)
    if kind.model == "LeNet":
        model, channels_last = LeNet(), False
    else:
        model, channels_last = resnet50(), device == "cuda"
    model = model.to(device, memory_format=torch.channels_last if channels_last
                     else torch.contiguous_format)
    layer = data_layer(db, kind, device)
    with ReaderPool() as pool:
        (feed,) = attach_feeds(_Net([layer]), pool, device=device, seed=0)
        pool.start()
        sides = {"dummy": make_step(model, dummy_layer(kind, device), device, channels_last),
                 "data": make_step(model, layer, device, channels_last)}
        for name, step in sides.items():
            for _ in range(max(warmup, first_pass(kind)) if name == "data" else warmup):
                step()
        best = {name: (0.0, 0.0) for name in sides}
        for _ in range(rounds):
            for name, step in sides.items():
                best[name] = max(best[name], time_steps(step, device, steps))
        pieces = direct_breakdown(layer, feed) if device == "cuda" and feed.gathers_in_loop \
            else []
    return {"dummy": best["dummy"][0], "data": best["data"][0], "wait_ms": best["data"][1],
            "ratio": best["data"][0] / best["dummy"][0], "path": feed_path(feed),
            "pieces": pieces, "stage": feed.gatherer.k if feed.gathers_in_loop else 1}


# --- where the Data layer's time goes (CUDA, gathering in the loop) ----------------------------
BREAKDOWN_CALLS = 2000


def _host_us(fn, calls: int = BREAKDOWN_CALLS) -> float:
    """Host microseconds per call of ``fn`` (no synchronize: the GPU is mostly idle here, and
    what counts in a launch-bound loop is the time the training thread spends issuing)."""
    fn()
    start = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - start) / calls / 1000


def direct_breakdown(layer, feed) -> list[tuple[str, float, float]]:
    """(piece, us per call, calls per batch) for one Data-layer forward of a feed gathering
    in the loop on CUDA: the whole call, then each piece of ``StagedGather.next`` (per batch)
    and ``StagedGather.stage`` (once per ``k`` batches), each timed alone over many calls on the
    feed's own buffers. Reaches into the gather's buffers on purpose; run after the timed
    steps (it advances the feed and rewrites its stages)."""
    direct, transformer, mean = feed.gatherer, feed.transformer, feed.mean
    loop = _host_us(lambda: None)
    rows = [("Data layer call (module wrapper + forward)", _host_us(layer), 1.0),
            ("  feed.next() alone", _host_us(feed.next), 1.0)]
    per_stage = 1 / direct.k
    stage, index = direct.stages[0], direct.index
    stream = torch.cuda.current_stream(direct.device)
    choices = direct.choices_k  # the stage's (k B records)
    batch_choices = direct.fixed if direct.fixed is not None else \
        Choices(choices.offsets[:feed.batch_size], choices.flips[:feed.batch_size])
    view = direct.pixels[0]
    consumed = feed.records.consumed
    pieces = [
        ("torch.cuda.current_stream", lambda: torch.cuda.current_stream(direct.device), 1.0),
        ("stream != staged stream", lambda: stream != direct.stream, 1.0),
        ("pixels[k] (a view)", lambda: direct.pixels[0], 1.0),
        ("labels[k] (a view)", lambda: direct.labels[0], 1.0),
        ("transform (transformer.device)",
         lambda: transformer.device(view, batch_choices, mean), 1.0),
        ("stage: event query", lambda: stage.done.query(), per_stage),
        ("stage: positions (np.add into the index)", lambda: direct.positions(consumed),
         per_stage),
        ("stage: choices_for", lambda: transformer.choices_for(0, direct.step, len(index)),
         per_stage),
        ("stage: gather (numpy, into pinned)",
         lambda: transformer.gather(direct.view.pixels, index, choices, stage.host_pixels),
         per_stage),
        ("stage: labels (np.take into pinned)",
         lambda: np.take(direct.view.labels, index, out=stage.host_labels, mode="clip"),
         per_stage),
        ("stage: pixel copy (.to, non_blocking)",
         lambda: stage.pixels.to(direct.device, non_blocking=True), per_stage),
        ("stage: label copy (.to, non_blocking)",
         lambda: stage.labels.to(direct.device, non_blocking=True), per_stage),
        ("stage: event record", lambda: stage.done.record(stream), per_stage),
    ]
    rows += [(name, _host_us(fn) - loop, n) for name, fn, n in pieces]
    tiny = torch.zeros(8, device=stream.device)
    rows.append(("(reference: one tiny CUDA op, x.add(1) on 8 floats)",
                 _host_us(lambda: tiny.add(1)) - loop, 0.0))
    torch.cuda.synchronize()
    return rows


def breakdown_table(kind: Kind, rows: list[tuple[str, float, float]], k: int) -> list[str]:
    summed = sum(us * n for _, us, n in rows[2:])
    return ["", f"Where one {kind.model} Data-layer forward's host time goes (gathering in the "
            f"loop, {k} batches staged per gather and copy; each piece timed alone over "
            f"{BREAKDOWN_CALLS:,} calls, no synchronize):", "",
            "| piece | us per call | calls per batch | us per batch |", "|---|---|---|---|",
            *[f"| {name} | {us:.2f} | {n:.3g} | {us * n:.2f} |" for name, us, n in rows],
            f"| sum of the pieces | | | {summed:.2f} |"]


# --- GIL share (CPU) ------------------------------------------------------------------------
LAUNCH_OPS = 120
"""Tiny torch ops per stand-in step: about 0.35 ms of Python on the 2-core machine, a
shorter step than LeNet's on the H200 (1.4 ms), so the feed's cost per batch weighs more here."""


def launch_bound_step(source):
    """A step whose thread is in Python ~100% of the time (a small net on a fast GPU issues
    kernels this way): take the next batch, then LAUNCH_OPS tiny ops on an 8-element tensor.
    Any Python the reader and prefetch threads run takes the GIL from this loop."""
    acc = torch.zeros(8)

    def step() -> float:
        t0 = time.perf_counter()
        source()
        waited = time.perf_counter() - t0
        x = acc
        for _ in range(LAUNCH_OPS):
            x = x.add(1.0)
        return waited

    return step


def gil_compare(db: str, kind: Kind, seconds: float, rounds: int = 12) -> dict:
    """Steps/s of :func:`launch_bound_step` fed by DummyData and by Data (past the first pass
    over the database: the training thread gathers small batches of a decoded database
    itself, other feeds run their threads behind it), alternated in ``rounds`` short rounds;
    each side keeps its best round (short rounds, many of them: on a small shared machine
    other processes take the cores at random moments, and the best round is the one they left
    alone). The ratio is the share of a launch-bound step left to it while records flow
    (goal >= 0.97)."""
    layer = data_layer(db, kind, "cpu")
    with ReaderPool() as pool:
        (feed,) = attach_feeds(_Net([layer]), pool, device="cpu", seed=0)
        pool.start()
        sides = {"dummy": launch_bound_step(dummy_layer(kind, "cpu")),
                 "data": launch_bound_step(layer)}
        for step in sides.values():
            for _ in range(max(400, first_pass(kind))):  # the Data side: past the first pass
                step()
        best = {name: (0.0, 0.0) for name in sides}
        for _ in range(rounds):
            for name, step in sides.items():
                n, waited, start = 0, 0.0, time.perf_counter()
                while time.perf_counter() - start < seconds / rounds:
                    waited += step()
                    n += 1
                elapsed = time.perf_counter() - start
                best[name] = max(best[name], (n / elapsed, 1000 * waited / n))
    return {"dummy": best["dummy"][0], "data": best["data"][0], "wait_ms": best["data"][1],
            "ratio": best["data"][0] / best["dummy"][0], "path": feed_path(feed)}


# --- report ---------------------------------------------------------------------------------
def machine(device: str) -> str:
    cpu = platform.processor() or platform.machine()
    text = f"{os.cpu_count()} CPU cores ({cpu}), Python {platform.python_version()}, " \
           f"torch {torch.__version__}"
    if device == "cuda":
        text += f", {torch.cuda.get_device_name()}"
    load = os.getloadavg()[0]
    return f"{text}, load average {load:.1f} at the start (other work on the machine)"


def run(args) -> str:
    device = args.device
    kinds = [dataclasses.replace(k, batch=args.batch or k.batch) for k in KINDS
             if not args.kinds or k.name in args.kinds]
    lines = [f"Machine: {machine(device)}. Date: {datetime.date.today().isoformat()}. "
             f"Command: `python benchmarks/data_pipeline.py {' '.join(sys.argv[1:])}`.", "",
             "| records | batch | transform | decoded records/s | batches/s delivered "
             "(images/s) |", "|---|---|---|---|---|"]
    train_rows, gil_rows, pieces = [], [], []
    with tempfile.TemporaryDirectory() as root:
        for kind in kinds:
            db = make_db(root, kind)
            rec = decode_rate(db, kind, args.seconds)
            bat = batch_rate(db, kind, device, args.seconds)
            transform = ", ".join(f"{k} {v}" for k, v in kind.transform.items())
            lines.append(f"| {kind.name} uint8 | {kind.batch} | {transform} | {rec:,.0f} | "
                         f"{bat:,.1f} ({bat * kind.batch:,.0f}) |")
            print(lines[-1], flush=True)
            if device == "cpu" and kind.model == "LeNet":
                r = gil_compare(db, kind, 2 * args.seconds)
                gil_rows.append(f"| {kind.name} uint8 | {kind.batch} | {r['dummy']:,.1f} | "
                                f"{r['data']:,.1f} | {r['ratio']:.3f} | {r['wait_ms']:.3f} | "
                                f"{r['path']} |")
                print(gil_rows[-1], flush=True)
            if args.train:
                steps = args.steps or (300 if kind.model == "LeNet" else 40)
                r = train_compare(db, kind, device, steps, warmup=max(5, steps // 10))
                train_rows.append(f"| {kind.model} | {kind.batch} | {r['dummy']:,.1f} | "
                                  f"{r['data']:,.1f} | {r['ratio']:.3f} | "
                                  f"{r['wait_ms']:.2f} | {r['path']} |")
                print(train_rows[-1], flush=True)
                if r["pieces"]:
                    table = breakdown_table(kind, r["pieces"], r["stage"])
                    pieces += table
                    print("\n".join(table), flush=True)
    if gil_rows:
        lines += ["", "A launch-bound step on the CPU (the training thread in Python all "
                  f"the time: the next batch, then {LAUNCH_OPS} tiny torch ops), fed by "
                  "DummyData and by Data, past the first pass over the database:", "",
                  "| records | batch | steps/s fed by DummyData | steps/s fed by Data | ratio | "
                  "ms/step in the Data layer | Data's batches |", "|---|---|---|---|---|---|---|",
                  *gil_rows]
    if train_rows:
        lines += ["", f"Training steps on {device} (SGD, forward + backward; bf16 autocast and "
                  "channels_last for ResNet-50 on CUDA):", "",
                  "| net | batch | steps/s fed by DummyData | steps/s fed by Data | ratio | "
                  "ms/step in the Data layer | Data's batches |", "|---|---|---|---|---|---|---|",
                  *train_rows]
    return "\n".join(lines + pieces)


def save(path: Path, tag: str, table: str) -> None:
    """Replace the section between ``<!-- bench:tag -->`` markers (or append it), atomically."""
    begin, end = f"<!-- bench:{tag} -->", f"<!-- /bench:{tag} -->"
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n{table}\n{end}"
    if begin in text and end in text:
        text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--train", action="store_true",
                        help="also time training steps fed by Data vs DummyData")
    parser.add_argument("--seconds", type=float, default=4.0, help="per rate measurement")
    parser.add_argument("--steps", type=int, default=0, help="training steps per measurement")
    parser.add_argument("--kinds", nargs="*", default=[], help="e.g. 28x28x1")
    parser.add_argument("--batch", type=int, default=0, help="override every batch size")
    parser.add_argument("--save", type=Path, help="write the table into this markdown file")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if args.device == "cuda":
        torch.backends.cudnn.benchmark = True
    threads_before = threading.active_count()
    table = run(args)
    print("\n" + table)
    if args.save:
        save(args.save, f"{args.device}{'-train' if args.train else ''}", table)
    assert threading.active_count() == threads_before, "a pipeline thread outlived its pool"


if __name__ == "__main__":
    main()
