"""The replicas' gradient sum by bucket size, N GPUs of one host: csrc/peer_sum.cu (every GPU
reads every replica's bucket over peer access) against NCCL's all-reduce, each as the captured
replicas run them (one CUDA graph a GPU, the captures open at once, on side streams).

    python benchmarks/peer_sum.py [--gpus 2,4] [--out DIR]

Each cell: CALLS calls of one bucket size captured in one graph a GPU, the N graphs replayed
together until about 0.2 s have passed; the time per call is GPU 0's, from CUDA events around
its replays (every GPU waits for the slowest at each call). The peer sums are checked against
the host's sum in replica order first. The table says which is faster per size and N, and where
PEER_SUM_BYTES (caffe_py/parallel/peer_sum.py) sends each size.
"""
from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from caffe_py.parallel.peer_sum import PeerCollectives, replica_sum  # noqa: E402

SIZES_KIB = [4, 16, 64, 256, 512, 1024, 2048, 4096, 8192]
CALLS = 20


def graphs_of(devices: list[torch.device], call: Callable[..., None]
              ) -> list[torch.cuda.CUDAGraph]:
    """CALLS calls of ``call(streams=...)`` captured in one graph per device (after two eager)."""
    streams = [torch.cuda.Stream(d) for d in devices]
    for s, d in zip(streams, devices, strict=True):
        s.wait_stream(torch.cuda.current_stream(d))
    for _ in range(2):
        call(streams=streams)
    for d in devices:
        torch.cuda.synchronize(d)
    graphs = [torch.cuda.CUDAGraph() for _ in devices]
    for d, graph, stream in zip(devices, graphs, streams, strict=True):
        with torch.cuda.device(d), torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="relaxed")
    for _ in range(CALLS):
        call(streams=streams)
    for d, graph, stream in zip(devices, graphs, streams, strict=True):
        with torch.cuda.device(d), torch.cuda.stream(stream):
            graph.capture_end()
    return graphs


def call_us(devices: list[torch.device], graphs: list[torch.cuda.CUDAGraph],
            seconds: float = 0.2) -> float:
    """Device time per call: GPU 0's events around replays of every device's graph."""
    def replay() -> None:
        for d, graph in zip(devices, graphs, strict=True):
            with torch.cuda.device(d):
                graph.replay()

    replay()
    for d in devices:
        torch.cuda.synchronize(d)
    with torch.cuda.device(devices[0]):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reps, began = 0, time.perf_counter()
        start.record()
        while time.perf_counter() - began < seconds:
            replay()
            reps += 1
        end.record()
        end.synchronize()
    for d in devices:
        torch.cuda.synchronize(d)
    return start.elapsed_time(end) * 1e3 / (reps * CALLS)


def rows_for(devices: list[torch.device]) -> list[str]:
    import torch.cuda.nccl as nccl

    n = len(devices)
    default = PeerCollectives.on(devices, nccl)   # what a run gets: its limit says "where"
    if default is None:
        raise SystemExit("peer_sum.py: these GPUs have no peer access over an NVLink-class "
                         "link, or the CUDA kernels do not build (`cpy build-ext` says why)")
    peers = PeerCollectives(devices, nccl, default.ext,   # every size through the kernel
                            max_bytes=max(SIZES_KIB) * 1024 * (n - 1))
    rows = []
    for kib in SIZES_KIB:
        numel = kib * 256
        parts = [torch.randn(numel, device=d) for d in devices]
        want = replica_sum(parts)
        peers.all_reduce(parts)
        for d in devices:
            torch.cuda.synchronize(d)
        exact = all(torch.equal(p.cpu(), want) for p in parts)
        peer = call_us(devices, graphs_of(devices, partial(peers.all_reduce, parts)))
        ring = call_us(devices, graphs_of(devices, partial(nccl.all_reduce, parts)))
        where = "peer" if default.takes(parts[0]) else "NCCL"
        faster = "peer" if peer < ring else "NCCL"
        rows.append(f"| {n} | {kib:,} KiB | {peer:.1f} | {ring:.1f} | {ring / peer:.2f}x | "
                    f"{faster} | {where} | {'yes' if exact else 'NO'} |")
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", default=None, help="GPU counts, e.g. 2,4 (default: 2 and all)")
    ap.add_argument("--out", type=Path, default=None, help="also write DIR/peer_sum.md")
    args = ap.parse_args()
    count = torch.cuda.device_count()
    if count < 2:
        raise SystemExit("peer_sum.py: needs 2 or more GPUs")
    ns = sorted({int(k) for k in args.gpus.split(",")} if args.gpus else {2, count})
    if any(not 2 <= k <= min(count, 8) for k in ns):
        raise SystemExit(f"--gpus: each count must be 2..{min(count, 8)} on this host")
    head = [f"{torch.cuda.get_device_name(0)} x {count}, torch {torch.__version__}, "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
            f"`python benchmarks/peer_sum.py --gpus {','.join(map(str, ns))}`", "",
            "| GPUs | bucket | peer sum us | NCCL us | NCCL / peer | faster | PEER_SUM_BYTES "
            "sends it to | peer sum bit-exact |", "|---|---|---|---|---|---|---|---|"]
    print("\n".join(head), flush=True)
    rows = [row for k in ns for row in rows_for([torch.device("cuda", i) for i in range(k)])]
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "peer_sum.md").write_text("\n".join(head + rows) + "\n")


if __name__ == "__main__":
    main()
