"""ImageNet-scale data into ResNet-50: Caffe's raw and JPEG-encoded 256 x 256 LMDBs against
constant DummyData and against the usual PyTorch DataLoader, in one run.

    python benchmarks/imagenet_data.py --save docs/data_pipeline.md         # one GPU, ~6 min
    python benchmarks/imagenet_data.py --smoke                              # toy size, CPU
    python benchmarks/imagenet_data.py --replicas 4 --save docs/data_pipeline.md   # 4 GPUs
    python benchmarks/imagenet_data.py --replicas 4 --skip-decode --multi-trainer lockstep

1. Data: benchmarks/make_imagenet_lmdb.py makes (or reuses, in --data) N synthetic photo-like
   images as convert_imageset writes them, raw and JPEG (quality 90), and their mean file.
2. Decode throughput: images/s a Data layer's feed delivers (batch 256, crop 224, mirror,
   mean_file; transformed on the device, nothing computing): raw records, JPEG records decoded
   by 1, 2, 4, 8, 16 CPU threads (PIL) and by nvJPEG on the GPU; and the DataLoader peer's
   images/s on both databases. With --replicas N, N feeds on N GPUs share the reader.
3. Training: ResNet-50 (configs/resnet50_dummy.yaml, as benchmarks/resnet50_step.py builds it:
   bf16 autocast, channels_last, Caffe's SGD; on one GPU the Solver's iterations as `cpy train`
   runs them, whole iterations as CUDA graph replays) fed by DummyData (a constant; measured
   first and last),
   by the Data layer on each database, and by the DataLoader peer on each: steps/s after a
   warm-up, with same-run ratios against DummyData (goals: raw >= 0.97, JPEG >= 0.95) and
   against the peer on the same database (goal >= 1.2). With --replicas N (N > 1) the rows
   run on N GPUs, each in its own process: caffe-py fed by DummyData and by each LMDB, and
   torchrun DDP fed by the peer (benchmarks/ddp_baseline.py --peer-workers, cores / N workers
   per GPU). caffe-py's rows are `cpy train --gpus 0,...,N-1` with no other flag, as a user
   runs it (whole iterations captured on every replica, NCCL's all-reduce), on a solver that
   fixes max_iter and display; their rate is the median of its display lines' rates after
   the first two (benchmarks/scale_default.py's reading). --multi-trainer lockstep runs them the
   older way, as the earlier tables of several GPUs were measured: benchmarks/multigpu.py
   caffe --graphs (the reduction tree, CUDA graphs, one thread issuing every replica's step).

The peer is the usual PyTorch way: a torch.utils.data.Dataset over the same LMDB (each worker
process opens its own read-only environment), PIL for JPEG, torchvision's RandomCrop,
RandomHorizontalFlip, ToTensor/ConvertImageDtype and Normalize (the mean file's channel means,
Caffe's scale), a DataLoader with one worker per core, shuffle, pin_memory, and a
non_blocking copy to the GPU. Without torchvision it is left out, and the table says so.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the CLI: idle OpenMP threads sleep

import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import resnet50_step  # noqa: E402
from data_pipeline import save  # noqa: E402
from imagenet_peer import channel_means, peer_feed, peer_missing  # noqa: E402
from multigpu import constant_dummy_data, report_phases, write_solver  # noqa: E402
from scale_default import _rates, _train_command  # noqa: E402

from caffe_py.io import ReaderPool, attach_feeds, feed_of, swap_feed  # noqa: E402
from caffe_py.io.decoders import libjpeg, nvjpeg  # noqa: E402
from caffe_py.io.decoders.workers import DecodeOptions, usable_cores  # noqa: E402
from caffe_py.io.reader import reader  # noqa: E402
from caffe_py.layers import BuildContext, lookup  # noqa: E402
from caffe_py.solver.graph_loop import GraphedLoop  # noqa: E402
from caffe_py.solver.solver import Solver  # noqa: E402
from caffe_py.spec.net_spec import parse_layer  # noqa: E402
from caffe_py.spec.schema import Source  # noqa: E402
from caffe_py.spec.solver_spec import SolverParameter, load_solver  # noqa: E402


@dataclass
class Setup:
    """The sizes of one run: the real one, or --smoke's toy one."""

    images: int
    size: int  # stored records: size x size
    crop: int
    batch: int
    width: Fraction  # ResNet-50's convolutions' num_output x width
    seconds: float  # per decode measurement
    warmup: int
    steps: int
    workers: list[int]


ROW_KINDS = ("nvjpeg", "peer")
"""The training rows ``--leave-out`` may leave out."""
REAL = Setup(32000, 256, 224, 256, Fraction(1), 5.0, 25, 150, [1, 4, 8, 16, 32, 48])
SMOKE = Setup(48, 40, 32, 8, Fraction(1, 16), 0.5, 1, 3, [1, 2])


# --- data -------------------------------------------------------------------------------------
def make_data(root: Path, s: Setup) -> dict:
    """Make the databases (or reuse them): make_imagenet_lmdb.py in its own process."""
    cmd = [sys.executable, str(HERE / "make_imagenet_lmdb.py"), str(root), "--images",
           str(s.images), "--size", str(s.size), "--check"]
    subprocess.run(cmd, check=True)
    return json.loads((root / "info.json").read_text())


def transform(root: Path, s: Setup) -> dict:
    return {"crop_size": s.crop, "mirror": True, "mean_file": str(root / "mean.binaryproto")}


def data_spec(db: Path, root: Path, s: Setup) -> dict:
    return {"name": "data", "type": "Data", "top": ["data", "label"],
            "data_param": {"source": str(db), "batch_size": s.batch},
            "transform_param": transform(root, s)}


class _Net:
    def __init__(self, layers):
        self.layers = layers

    def data_layers(self):
        return self.layers


def data_layer(db: Path, root: Path, s: Setup):
    spec = parse_layer(data_spec(db, root, s), Source(), "layer")
    return lookup("Data")(spec, [], BuildContext(phase="TRAIN"))


# --- decode throughput ------------------------------------------------------------------------
def sync(devices: list[torch.device]) -> None:
    for device in devices:
        if device.type == "cuda":
            torch.cuda.synchronize(device)


def rate(sources: list, devices: list[torch.device], seconds: float, batch: int,
         warmup: int = 8) -> float:
    """Images/s the ``sources`` (callables giving a batch each, one per replica) deliver
    together, after ``warmup`` batches each (what the feeds had assembled ahead is not
    counted: 8 covers a Data feed's ring and queue)."""
    for source in sources:
        for _ in range(warmup):
            source()
    sync(devices)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for source in sources:
            source()
            n += batch
    sync(devices)
    return n / (time.perf_counter() - start)


def feed_rate(db: Path, root: Path, s: Setup, devices: list[torch.device],
              decode: DecodeOptions) -> tuple[float, str]:
    """Images/s of one Data feed per device (one reader), and who decoded."""
    layers = [data_layer(db, root, s) for _ in devices]
    with ReaderPool(replicas=len(devices), decode=decode) as pool:
        feeds = [attach_feeds(_Net([layer]), pool, replica=i, device=device, seed=0)[0]
                 for i, (layer, device) in enumerate(zip(layers, devices, strict=True))]
        pool.start()
        images = rate(layers, devices, s.seconds, s.batch)
        for feed in feeds:
            report_phases(feed)
        return images, decoder_of(feeds[0], pool)


def decoder_of(feed, pool: ReaderPool) -> str:
    """Who decoded a feed's records in the end."""
    if feed.images is None:
        return "reader"
    if feed.images.gpu is not None:
        return "nvJPEG"
    if feed.images.crops is not None:
        return f"{pool.processes.count} CPU processes, PIL"
    n = pool.workers.count
    return f"{n} CPU thread{'s' * (n != 1)}, {'torchvision' if feed.images.libjpeg else 'PIL'}"


CPU_DECODERS = {"pil": "PIL", "torchvision": "torchvision"}


def cpu_decoders() -> list[str]:
    """The CPU JPEG decoders this machine has: PIL, and torchvision's where installed."""
    return ["pil"] + (["torchvision"] if libjpeg.unavailable() is None else [])


def cpu_ways() -> list[tuple[str, DecodeOptions]]:
    """(name, options for n workers) of every CPU decode: the threads with each decoder, and
    the processes."""
    ways = [(f"{CPU_DECODERS[d]}, CPU threads",
             lambda n, d=d: DecodeOptions(n, "off", d, processes="off"))
            for d in cpu_decoders()]
    return ways + [("PIL, CPU processes", lambda n: DecodeOptions(n, "off", processes="on"))]


def decode_rows(root: Path, s: Setup, devices: list[torch.device], peer_workers: int) -> list:
    """(records, decoder, workers, images/s) for every decode configuration."""
    rows = []
    raw, jpeg = root / "raw_lmdb", root / "jpeg_lmdb"
    images, _ = feed_rate(raw, root, s, devices, DecodeOptions())
    rows.append(("raw", "reader (numpy fast path)", "-", images))
    report(rows[-1])
    for way, options in cpu_ways():
        for n in (n for n in s.workers if n <= usable_cores()):
            images, _ = feed_rate(jpeg, root, s, devices, options(n))
            rows.append(("JPEG", way, str(n), images))
            report(rows[-1])
    missing = nvjpeg.unavailable() if devices[0].type == "cuda" else "a CPU run"
    if missing is None:
        images, who = feed_rate(jpeg, root, s, devices, DecodeOptions(gpu="on"))
        rows.append(("JPEG", "nvJPEG (GPU)", "-", images))
    else:
        rows.append(("JPEG", f"nvJPEG (GPU): not run ({missing})", "-", None))
    report(rows[-1])
    if len(devices) > 1:  # several GPUs: the peer is measured training, under DDP
        return rows
    for name, db in (("raw", raw), ("JPEG", jpeg)):
        rows.append((name, "DataLoader peer", f"{peer_workers} processes",
                     peer_rate(db, root, s, devices, peer_workers)))
        report(rows[-1])
    return rows


def peer_rate(db: Path, root: Path, s: Setup, devices: list[torch.device],
              workers: int) -> float | None:
    if peer_missing():
        return None
    means = channel_means(root / "mean.binaryproto")
    with peer_feed(db, s.crop, s.batch, means, devices[0], workers) as feed:
        # the DataLoader holds 2 batches per worker ahead: drain them before timing
        return rate([feed.next], devices, s.seconds, s.batch, warmup=2 * workers + 8)


def report(row: tuple) -> None:
    value = "-" if row[-1] is None else f"{row[-1]:,.0f}"
    print(f"decode: {' | '.join(str(v) for v in row[:-1])} | {value} images/s", flush=True)


def decode_only_rows(root: Path, s: Setup) -> list:
    """(decoder, threads, images/s) of the CPU workers alone: decode and crop a batch of files
    into a host buffer (no reader, no transform), over the first records, again and again."""
    from caffe_py.io.db.lmdb_store import LmdbReader
    from caffe_py.io.decoders.decode_processes import DecodeProcesses
    from caffe_py.io.decoders.workers import DecodeWorkers
    from caffe_py.io.feed.image_batch import BatchImages
    from caffe_py.io.feed.transformer import Transformer
    from caffe_py.io.formats.datum import decode_datum
    from caffe_py.io.reader.records import RecordBatch
    from caffe_py.spec.net_spec import TransformationParameter

    with LmdbReader(root / "jpeg_lmdb") as db:
        files = tuple(decode_datum(v).data for _, (_, v) in zip(range(s.batch), db,
                                                                   strict=False))
    shape = (3, s.size, s.size)
    t = Transformer(TransformationParameter(crop_size=s.crop, mirror=True), "TRAIN", shape)
    batch = RecordBatch(0, 1, None, np.zeros(len(files), np.int64), (b"",) * len(files), files)
    out = np.empty((len(files), 3, s.crop, s.crop), np.uint8)
    rows = []
    for (way, options), n in ((w, n) for w in cpu_ways() for n in s.workers
                              if n <= usable_cores()):
        workers, decode = DecodeWorkers(n), options(n)
        processes = DecodeProcesses(n) if decode.use_processes else None
        workers.start()
        images = BatchImages("bench", shape, None, workers, decode, torch.device("cpu"),
                             processes)
        try:
            rows.append((way, n, rate(
                [lambda i=images: i.host(batch, t.choices_for(0, 1, len(files)), out)],
                [], s.seconds / 2, len(files))))
        finally:
            images.close()
            if processes is not None:
                processes.close()
            workers.close()
        print(f"decode + crop only: {way}, {n}: {rows[-1][2]:,.0f} images/s", flush=True)
    return rows


def pixel_agreement(root: Path, n: int = 256) -> str:
    """How far nvJPEG's pixels are from PIL's on the first ``n`` JPEG records."""
    if nvjpeg.unavailable() is not None:
        return f"nvJPEG against PIL: not measured ({nvjpeg.unavailable()})."
    from torchvision.io import ImageReadMode, decode_jpeg

    from caffe_py.io.db.lmdb_store import LmdbReader
    from caffe_py.io.formats.datum import decode_datum, decode_image

    with LmdbReader(root / "jpeg_lmdb") as db:
        files = [decode_datum(value).data for _, (_, value) in zip(range(n), db,
                                                                     strict=False)]
    gpu = decode_jpeg([torch.frombuffer(bytearray(f), dtype=torch.uint8) for f in files],
                      mode=ImageReadMode.RGB, device=torch.device("cuda", 0))
    diffs = [(g.flip(0).cpu().int() - torch.from_numpy(decode_image(f)).int()).abs()
             for g, f in zip(gpu, files, strict=True)]
    per_image = torch.stack([d.float().mean() for d in diffs])
    every = torch.cat([d.flatten() for d in diffs])
    return (f"nvJPEG against PIL on {n} JPEG records: mean |difference| per image "
            f"{per_image.mean():.3f} (largest {per_image.max():.3f}; torchvision's own test "
            f"allows < 2), largest pixel difference {int(every.max())}, "
            f"{100 * float((every == 0).float().mean()):.1f}% of pixels equal, "
            f"{100 * float((every <= 2).float().mean()):.2f}% within 2.")


# --- training ---------------------------------------------------------------------------------
def net_spec(s: Setup, data: dict | None) -> dict:
    """ResNet-50 at the run's batch and width, fed by constant DummyData or by ``data``."""
    spec = resnet50_step.benchmark_spec(s.batch, s.width)
    if s.crop != 224:  # toy crops: the last pooling takes whatever is left
        pool5 = next(layer for layer in spec["layer"] if layer["name"] == "pool5")
        pool5["pooling_param"] = {"pool": "AVE", "global_pooling": True}
    if data is None:
        spec["layer"][0]["dummy_data_param"]["shape"][0]["dim"] = [s.batch, 3, s.crop, s.crop]
    else:
        spec["layer"][0] = data
    return spec


def solver_param(spec: dict, work: Path, name: str) -> SolverParameter:
    """The net and the benchmarks' SGD solver over it (bf16; channels_last, AUTO's choice on
    CUDA) as `cpy train` reads them (train_rate sets max_iter)."""
    return load_solver(write_solver(spec, work, name))


@contextlib.contextmanager
def our_feed(param: SolverParameter, device: torch.device, decode: DecodeOptions,
             seen: dict) -> Iterator[Solver]:
    """A Solver whose Data layer reads through its own feed (a pool with ``decode``);
    ``seen["who"]``: who decoded, at the end."""
    with ReaderPool(decode=decode) as pool, Solver(param, device=device, pool=pool) as solver:
        feed = feed_of(solver.net.data_layers()[0])
        pool.start()
        yield solver
        seen["who"] = decoder_of(feed, pool)
        report_phases(feed)


@contextlib.contextmanager
def the_peer(param: SolverParameter, db: Path, root: Path, s: Setup, device: torch.device,
             workers: int) -> Iterator[Solver]:
    """A Solver whose Data layer reads from the DataLoader peer (its own pool never starts)."""
    means = channel_means(root / "mean.binaryproto")
    with ReaderPool() as idle, Solver(param, device=device, pool=idle) as solver, \
            peer_feed(db, s.crop, s.batch, means, device, workers) as feed:
        swap_feed(solver.net.data_layers()[0], feed)
        yield solver


def train_rate(param: SolverParameter, device: torch.device, s: Setup, solver_of=None,
               warmup: int = 0) -> float:
    """Images/s of ResNet-50 iterations as `cpy train` runs them on one device (on CUDA whole
    iterations as CUDA graph replays, its default; no compile), after a warm-up of at least
    ``warmup`` iterations; ``solver_of(param)``: a context giving the Solver with its Data
    layer fed (None: the net's DummyData, a Solver of its own)."""
    warm = max(s.warmup, warmup)
    param = dataclasses.replace(param, max_iter=warm + s.steps)
    with (solver_of(param) if solver_of is not None else Solver(param, device=device)) \
            as solver:
        if device.type == "cuda":
            solver.runner = GraphedLoop(required=True)
        solver.start()
        solver.step(warm)
        sync([device])
        start = time.perf_counter()
        solver.step(s.steps)
        sync([device])
        seconds = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return s.batch * s.steps / seconds


def train_rows(root: Path, s: Setup, device: torch.device, peer_workers: int,
               out: Path, left_out: frozenset[str] = frozenset()) -> list:
    """(fed by, database, images/s) for every feed of the same ResNet-50 iteration, but the
    kinds of row in ``left_out`` (:data:`ROW_KINDS`)."""
    raw, jpeg = root / "raw_lmdb", root / "jpeg_lmdb"
    seen: dict = {}
    gpu_decode = (device.type == "cuda" and nvjpeg.unavailable() is None
                  and "nvjpeg" not in left_out)
    ours = [("raw", raw, DecodeOptions()), ("JPEG", jpeg, DecodeOptions())]  # the defaults
    if gpu_decode:  # the other decoders: nvJPEG, and the threads (torchvision's decoder)
        ours += [("JPEG", jpeg, DecodeOptions(gpu="on", processes="off")),
                 ("JPEG", jpeg, DecodeOptions(gpu="off", processes="off"))]
    runs: list = [("DummyData (constant), first", None, None, 0)]
    runs += [(f"Data, {name} LMDB", db,
              lambda param, d=decode: our_feed(param, device, d, seen), 0)
             for name, db, decode in ours]
    if peer_missing() is None and "peer" not in left_out:  # warm up past what it holds ahead
        runs += [(f"DataLoader peer, {name} LMDB", db,
                  lambda param, db=db: the_peer(param, db, root, s, device, peer_workers),
                  2 * peer_workers + 8) for name, db in (("raw", raw), ("JPEG", jpeg))]
    runs += [("DummyData (constant), last", None, None, 0)]
    rows = []
    for name, db, solver_of, warmup in runs:
        spec = net_spec(s, None if db is None else data_spec(db, root, s))
        param = solver_param(spec, out / "imagenet_specs", "dummy" if db is None
                             else db.name)
        seen.clear()
        images = train_rate(param, device, s, solver_of, warmup)
        rows.append((f"{name} ({seen['who']})" if "who" in seen else name, db, images))
        print(f"train: {rows[-1][0]}: {images:,.1f} images/s", flush=True)
    return rows


# --- training on several GPUs -----------------------------------------------------------------
MULTI_TRAINERS = ("cpy", "lockstep")
"""What runs caffe-py's rows on several GPUs (``--multi-trainer``): `cpy train --gpus`, or
benchmarks/multigpu.py caffe --graphs (the tree, one thread in lockstep), the older way."""
TRAINER_NOTE = {
    ("cpy", "cuda"): "`cpy train --gpus 0,...,N-1` with no flag: whole iterations captured on "
                     "every replica, NCCL's all-reduce",
    ("lockstep", "cuda"): "benchmarks/multigpu.py caffe --graphs: the reduction tree, CUDA "
                          "graphs, one thread (lockstep)",
    ("cpy", "cpu"): "`cpy train --gpus cpu:N` with no flag, eager",
    ("lockstep", "cpu"): "benchmarks/multigpu.py caffe, eager",
}
"""How the table's heading names the trainer of caffe-py's rows, per device type."""


def row_solver(s: Setup, root: Path, specs: Path, db: Path | None) -> Path:
    """The solver spec of a training row on several GPUs: ResNet-50 fed by constant DummyData
    (``db`` None) or by the database ``db`` of ``root``, written into ``specs``."""
    net = net_spec(s, None if db is None else data_spec(db, root, s))
    return write_solver(constant_dummy_data(net), specs, "dummy" if db is None else db.name)


def cpy_schedule(s: Setup) -> tuple[int, int]:
    """(display, max_iter) of a `cpy train` row: a display line every D = steps / 5
    iterations (1 to 10), and max_iter the warm-up and timed steps in whole intervals plus
    one, since the interval that ends at max_iter displays no rate."""
    display = max(1, min(10, s.steps // 5))
    return display, display * (-(-(s.warmup + s.steps) // display) + 1)


def cpy_solver(path: Path, s: Setup) -> Path:
    """The solver write_solver wrote (no test, no snapshot, not even at the end) with
    :func:`cpy_schedule`'s display and max_iter."""
    spec = yaml.safe_load(path.read_text())
    spec["display"], spec["max_iter"] = cpy_schedule(s)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def child_env() -> dict:
    """The rows' processes' environment: this one, NVLink multicast off, caffe_py importable."""
    return {**os.environ, "NCCL_NVLS_ENABLE": "0",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent),
                                                        os.environ.get("PYTHONPATH")]))}


@dataclass
class Replicas:
    """The processes of the rows on ``gpus`` GPUs (a CPU check: as many CPU replicas): each
    row's output goes into out/imagenet_multigpu.log, its result into
    out/imagenet_multigpu.jsonl."""

    s: Setup
    gpus: int
    cuda: bool
    out: Path
    env: dict = dataclasses.field(default_factory=child_env)

    @property
    def ids(self) -> str:
        return ",".join(str(i) for i in range(self.gpus)) if self.cuda else f"cpu:{self.gpus}"

    @property
    def results(self) -> Path:
        return self.out / "imagenet_multigpu.jsonl"

    def cpy_train(self, name: str, solver: Path, tag: str, extra_env: dict) -> dict:
        """`cpy train --gpus <ids>` with no other flag, on a copy of ``solver`` named by
        ``tag`` with a snapshot prefix of its own: images/s = the median display rate after
        the first two x batch x GPUs."""
        cmd = _train_command(solver, self.ids, solver.parent, tag)
        done = self._run(name, cmd, extra_env)
        result = {"run": "cpy train", "row": name, "gpus": self.gpus, "command": cmd,
                  **_rates(done.stdout + done.stderr, done.returncode,
                           self.s.batch * self.gpus)}
        with self.results.open("a") as f:
            f.write(json.dumps(result) + "\n")
        return result

    def lockstep(self, name: str, solver: Path, extra_env: dict) -> dict:
        """The older way: benchmarks/multigpu.py caffe (--graphs on GPUs) on ``solver``."""
        cmd = [sys.executable, str(HERE / "multigpu.py"), "caffe", "--gpus", self.ids,
               "--channels-last", *(["--graphs"] if self.cuda else [])]
        return self.script(name, cmd, solver, self.s.warmup, extra_env)

    def peer(self, name: str, solver: Path, peer_workers: int, extra_env: dict) -> dict:
        """torchrun DDP fed by the DataLoader peer (``peer_workers`` processes in all), warmed
        up past what its DataLoaders hold ahead (2 batches a worker)."""
        workers = max(1, peer_workers // self.gpus)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node", str(self.gpus), str(HERE / "ddp_baseline.py"),
               "--channels-last", "--peer-workers", str(workers),
               *([] if self.cuda else ["--cpu"])]
        warmup = self.s.warmup + 2 * peer_workers // self.gpus + 8
        return self.script(name, cmd, solver, warmup, extra_env)

    def script(self, name: str, cmd: list[str], solver: Path, warmup: int,
               extra_env: dict) -> dict:
        """A benchmark script's run of ``warmup`` + the timed steps: its JSON line's
        images/s."""
        done = self._run(name, [*cmd, "--solver", str(solver), "--warmup", str(warmup),
                                "--iters", str(self.s.steps), "--json", str(self.results)],
                         extra_env)
        if done.returncode != 0:
            return {"ok": False, "why": f"exit {done.returncode}; its last lines:\n"
                    + "\n".join(done.stderr.strip().splitlines()[-5:])}
        result = json.loads(self.results.read_text().strip().splitlines()[-1])
        return {"ok": True, "images_per_s": result["images_per_s"]}

    def _run(self, name: str, cmd: list[str], extra_env: dict) -> subprocess.CompletedProcess:
        done = subprocess.run(cmd, env={**self.env, **extra_env}, capture_output=True,
                              text=True)
        with (self.out / "imagenet_multigpu.log").open("a") as log:
            log.write(f"== {name}\n$ {' '.join(cmd)}\n{done.stdout}\n{done.stderr}\n")
        return done


def multi_train_rows(root: Path, s: Setup, gpus: int, peer_workers: int, out: Path,
                     device: torch.device, left_out: frozenset[str] = frozenset(),
                     trainer: str = "cpy") -> list:
    """(fed by, database, images/s) of ResNet-50 on ``gpus`` GPUs: caffe-py (``trainer``, one
    of :data:`MULTI_TRAINERS`: `cpy train --gpus 0,...` with no flag, or multigpu.py's
    lockstep run) fed by constant DummyData and by each LMDB, and torchrun DDP fed by the
    DataLoader peer (``peer_workers`` processes in all). Each row is its own process
    (:class:`Replicas`). The kinds of row in ``left_out`` (:data:`ROW_KINDS`) are left out."""
    out = out.resolve()  # the solvers name their nets by absolute paths
    specs = out / "imagenet_specs"
    raw, jpeg = root / "raw_lmdb", root / "jpeg_lmdb"
    cuda = device.type == "cuda"  # else a check of the script: CPU replicas, gloo
    replicas = Replicas(s, gpus, cuda, out)

    def solver(db: Path | None) -> Path:
        return row_solver(s, root, specs, db)

    def ours(name: str, db: Path | None, extra_env: dict, k: int) -> dict:
        if trainer == "lockstep":
            return replicas.lockstep(name, solver(db), extra_env)
        return replicas.cpy_train(name, cpy_solver(solver(db), s), f"x{gpus}_{k}", extra_env)

    runs: list = [("DummyData (constant), first", None, "ours", {})]
    runs += [(f"Data, {name} LMDB", db, "ours", {}) for name, db in (("raw", raw),
                                                                     ("JPEG", jpeg))]
    if cuda and nvjpeg.unavailable() is None and "nvjpeg" not in left_out:
        runs += [("Data, JPEG LMDB (nvJPEG)", jpeg, "ours", {"CPY_GPU_DECODE": "on"})]
    if peer_missing() is None and "peer" not in left_out:
        runs += [(f"DataLoader peer, {name} LMDB (DDP)", db, "peer", {})
                 for name, db in (("raw", raw), ("JPEG", jpeg))]
    runs += [("DummyData (constant), last", None, "ours", {})]
    rows = []
    for k, (name, db, who, extra_env) in enumerate(runs):
        result = (replicas.peer(name, solver(db), peer_workers, extra_env) if who == "peer"
                  else ours(name, db, extra_env, k))
        if not result["ok"]:
            print(f"train x{gpus}: {name}: failed: {result['why']}", flush=True)
            continue
        if any("CUDA graphs off" in note for note in result.get("notes", [])):
            name += " (graphs fell back to eager)"
        rows.append((name, db, result["images_per_s"]))
        series = result.get("rates")  # a `cpy train` row's display lines, iterations/s
        print(f"train x{gpus}: {name}: {result['images_per_s']:,.1f} images/s"
              + (f" (display lines: {' '.join(f'{r:.2f}' for r in series)} iter/s)"
                 if series else ""), flush=True)
    return rows


# --- the table --------------------------------------------------------------------------------
def header(args: argparse.Namespace, s: Setup, device: torch.device, info: dict) -> list[str]:
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "no GPU"
    if device.type == "cuda" and args.replicas > 1:
        gpu = f"{args.replicas} x {gpu}"
    try:
        import torchvision
        vision = f"torchvision {torchvision.__version__}"
    except ImportError:
        vision = "no torchvision"
    when = datetime.datetime.now(datetime.timezone.utc)
    load = f", load average {os.getloadavg()[0]:.1f} at the start" if hasattr(os, "getloadavg") \
        else ""
    return [f"Machine: {gpu}, {usable_cores()} CPU cores ({platform.machine()}{load}), Python "
            f"{platform.python_version()}, torch {torch.__version__}, {vision}. Date: "
            f"{when:%Y-%m-%d %H:%M} UTC. Command: `python {' '.join(sys.argv)}`"
            + (" (toy sizes: a check of the script, not a measurement)" if args.smoke else "")
            + ".", "",
            f"Data: {info['images']:,} synthetic photo-like {s.size} x {s.size} images "
            "(gradients, 1/f textures, shapes with gratings, grain: "
            "benchmarks/make_imagenet_lmdb.py), raw and JPEG quality 90 (mean "
            f"{info['jpeg_kb_mean']} KB, 10-90% {info['jpeg_kb_p10_p90'][0]}-"
            f"{info['jpeg_kb_p10_p90'][1]} KB); batch {s.batch}, crop {s.crop}, mirror, "
            "mean_file."]


def decode_only_table(rows: list) -> list[str]:
    return ["", "The CPU workers alone (decode and crop of JPEG records into a host buffer; "
            "no reader, no transform):", "", "| decoder | workers | images/s |",
            "|---|---:|---:|",
            *(f"| {decoder} | {n} | {images:,.0f} |" for decoder, n, images in rows)]


def decode_table(rows: list, replicas: int, device: str) -> list[str]:
    peers = {r[0]: r[3] for r in rows if r[1] == "DataLoader peer"}
    where = f"{replicas} GPUs' feeds sharing one reader" if replicas > 1 else "one feed"
    lines = ["", f"Decode throughput ({where}; images/s a Data layer delivers, transformed on "
             f"{device}, nothing computing):", "",
             "| records | decoded by | workers | images/s | vs DataLoader peer |",
             "|---|---|---|---:|---:|"]
    for records, who, workers, images in rows:
        peer = peers.get(records)
        ratio = f"{images / peer:.2f}x" if images and peer and who != "DataLoader peer" else ""
        value = "-" if images is None else f"{images:,.0f}"
        lines.append(f"| {records} | {who} | {workers} | {value} | {ratio} |")
    return lines


def train_table(rows: list, s: Setup, gpus: int = 1, device_type: str = "cuda",
                trainer: str = "cpy") -> list[str]:
    """The training rows' table; ``trainer`` (:data:`MULTI_TRAINERS`): what ran caffe-py's
    rows on several devices."""
    dummy = [r[2] for r in rows if r[1] is None]
    if not dummy:
        return ["", "ResNet-50 training: no DummyData row ran (see the log)."]
    base = sum(dummy) / len(dummy)
    peers = {r[1]: r[2] for r in rows if r[0].startswith("DataLoader")}
    where = (f" on {gpus} GPUs (batch {s.batch} per GPU; caffe-py: "
             f"{TRAINER_NOTE[trainer, 'cuda']}; the peer under torchrun DDP)"
             if gpus > 1 and device_type == "cuda" else
             f" on {gpus} CPU replicas (batch {s.batch} each; caffe-py: "
             f"{TRAINER_NOTE[trainer, 'cpu']}; the peer under torchrun DDP over gloo)"
             if gpus > 1 else
             " on one GPU (the Solver's iterations as `cpy train` runs them: whole iterations "
             "as CUDA graph replays; the peer's batches go into the same iterations)"
             if device_type == "cuda" else " (the Solver's iterations, eager)")
    steps = f"{s.warmup} warm-up + {s.steps} timed steps per row"
    if gpus > 1 and trainer == "cpy":
        display, max_iter = cpy_schedule(s)
        steps = (f"caffe-py's rows: `cpy train` to max_iter {max_iter}, the median of its "
                 f"display rates (every {'' if display == 1 else f'{display} '}iteration"
                 f"{'s' * (display != 1)}) after the first two; the peer's: "
                 f"{steps}")
    lines = ["", f"ResNet-50 training steps{where} (bf16 autocast, channels_last, Caffe's SGD; "
             f"{steps}; ratios against the mean of the DummyData rows):", "",
             "| fed by | images/s | ms/step | vs DummyData | vs DataLoader peer | goal |",
             "|---|---:|---:|---:|---:|---|"]
    for name, db, images in rows:
        ours = name.startswith("Data,")
        peer = peers.get(db) if ours else None
        vs_peer = f"{images / peer:.2f}x" if peer else ""
        goal = ""
        if ours:
            need = 0.97 if db.name.startswith("raw") else 0.95
            if peer is None:  # only the first half of the goal can be judged
                goal = (f">= {need}: {'met' if images / base >= need else 'not met'} "
                        "(no peer row)")
            else:
                met = images / base >= need and images / peer >= 1.2
                goal = f">= {need} and >= 1.2x peer: {'met' if met else 'not met'}"
        lines.append(f"| {name} | {images:,.1f} | {1000 * s.batch * gpus / images:.1f} | "
                     f"{images / base:.3f} | {vs_peer} | {goal} |")
    return lines


# --- the run ----------------------------------------------------------------------------------
def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true",
                    help="toy sizes on the CPU (48 images of 40 x 40): checks the script")
    ap.add_argument("--data", type=Path, help="where the databases are made or reused "
                    "(default /tmp/cpy_imagenet; --smoke: a temporary folder)")
    ap.add_argument("--images", type=int, help="images to make (default 32,000)")
    ap.add_argument("--device", help="cuda (the default where there is one) or cpu")
    ap.add_argument("--replicas", type=int, default=1,
                    help="decode rows with one feed per GPU on this many GPUs")
    ap.add_argument("--peer-workers", type=int, default=usable_cores(),
                    help="the DataLoader peer's worker processes (default: one per core)")
    ap.add_argument("--steps", type=int, help="timed training steps per row")
    ap.add_argument("--warmup", type=int, help="warm-up training steps per row")
    ap.add_argument("--seconds", type=float, help="per decode measurement")
    ap.add_argument("--skip-decode", action="store_true")
    ap.add_argument("--skip-train", action="store_true")
    ap.add_argument("--specs-only", action="store_true",
                    help="make the databases and write the training rows' solver specs "
                         "(OUT/imagenet_specs: dummy, raw_lmdb, jpeg_lmdb), then stop: for "
                         "replica_profile.py --solver")
    ap.add_argument("--leave-out", default="", help="training rows to leave out, comma "
                    "separated: nvjpeg (the GPU decoder's rows), peer (the DataLoader's)")
    ap.add_argument("--multi-trainer", choices=MULTI_TRAINERS, default="cpy",
                    help="with --replicas N > 1, what runs caffe-py's rows: cpy (`cpy train "
                    "--gpus 0,...,N-1` with no flag, the default) or lockstep (the older "
                    "benchmarks/multigpu.py caffe --graphs; saved as its own section)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/cpy_gpu")))
    ap.add_argument("--save", type=Path, help="write the tables into this markdown file")
    return ap.parse_args()


def run(args: argparse.Namespace, root: Path) -> str:
    left_out = frozenset(filter(None, args.leave_out.split(",")))
    if left_out - set(ROW_KINDS):
        raise SystemExit(f"--leave-out: {', '.join(sorted(left_out - set(ROW_KINDS)))} is "
                         f"not a row kind ({', '.join(ROW_KINDS)})")
    if args.multi_trainer != "cpy" and args.replicas < 2:
        raise SystemExit(f"--multi-trainer {args.multi_trainer}: it runs the rows of several "
                         "GPUs; add --replicas N (N > 1)")
    base = SMOKE if args.smoke else REAL
    s = dataclasses.replace(base, **{k: getattr(args, k) for k in
                                     ("images", "steps", "warmup", "seconds")
                                     if getattr(args, k) is not None})
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not
                                          args.smoke else "cpu"))
    args.device_type = device.type
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    # An ImageNet-size database is never kept decoded (it is far over CACHE_BYTES); smaller
    # ones made here are not either, so every pass is read and decoded as ImageNet's would be.
    reader.CACHE_BYTES = 0
    info = make_data(root, s)
    if args.specs_only:
        specs = args.out.resolve() / "imagenet_specs"
        return "\n".join(f"{name}: {row_solver(s, root, specs, db)}" for name, db in
                         (("dummy", None), ("raw", root / "raw_lmdb"),
                          ("jpeg", root / "jpeg_lmdb")))
    lines = header(args, s, device, info)
    if not args.skip_decode:
        devices = ([torch.device("cuda", i) for i in range(args.replicas)]
                   if device.type == "cuda" else [device] * args.replicas)
        lines += decode_table(decode_rows(root, s, devices, args.peer_workers), len(devices),
                              device.type)
        lines += decode_only_table(decode_only_rows(root, s))
        if device.type == "cuda":
            lines += ["", pixel_agreement(root)]
    if not args.skip_train and args.replicas > 1:
        lines += train_table(multi_train_rows(root, s, args.replicas, args.peer_workers,
                                              args.out, device, left_out, args.multi_trainer),
                             s, args.replicas, device.type, args.multi_trainer)
    elif not args.skip_train:
        lines += train_table(train_rows(root, s, device, args.peer_workers, args.out,
                                        left_out), s, device_type=device.type)
    if peer_missing() is not None:
        lines += ["", f"The DataLoader peer was not run: {peer_missing()}."]
    return "\n".join(lines)


def main() -> None:
    args = arguments()
    threads_before = threading.active_count()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.data or (Path(tmp) if args.smoke else Path("/tmp/cpy_imagenet"))
        table = run(args, root)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "imagenet_data.md").write_text(table + "\n")
    print("\n" + table, flush=True)
    if args.save:
        tag = "imagenet-smoke" if args.smoke else f"imagenet-{args.device_type}"
        if args.replicas > 1:
            tag += f"-x{args.replicas}" + ("-lockstep" if args.multi_trainer == "lockstep"
                                           else "")
        save(args.save, tag, table)
    assert threading.active_count() == threads_before, "a pipeline thread outlived its pool"


if __name__ == "__main__":
    main()
