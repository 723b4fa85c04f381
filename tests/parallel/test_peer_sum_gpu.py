"""The peer sum (csrc/peer_sum.cu) on 2 or more GPUs of one host: every replica's bucket
replaced by the float32 sum in replica order, bit for bit on every device; called again and
again (the flags' epochs), captured in CUDA graphs, and beside NCCL's all-reduce for the
buckets it does not take. Skipped below 2 GPUs; run with `pytest -m gpu`."""
from __future__ import annotations

import pytest
import torch

from caffe_py.parallel.peer_sum import PEER_SUM_BYTES, PeerCollectives, replica_sum

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")]


@pytest.fixture(scope="module")
def devices():
    return [torch.device("cuda", i) for i in range(min(4, torch.cuda.device_count()))]


@pytest.fixture(scope="module")
def peers(devices):
    import torch.cuda.nccl as nccl

    collectives = PeerCollectives.on(devices, nccl)
    assert collectives is not None, "peer access between the test's GPUs"
    return collectives


def draw(devices, numel, seed, offset=0):
    """Per device, ``numel`` values (a view ``offset`` elements into a longer tensor)."""
    parts = []
    for r, d in enumerate(devices):
        g = torch.Generator(device=d).manual_seed(seed * 31 + r)
        parts.append(torch.randn(offset + numel, generator=g, device=d)[offset:])
    return parts


def sync(devices):
    for d in devices:
        torch.cuda.synchronize(d)


@pytest.mark.parametrize("numel", [1, 3, 4, 1000, 25_000, 131_075])
def test_every_replica_gets_the_sum_in_replica_order_bit_for_bit(devices, peers, numel):
    parts = draw(devices, numel, seed=numel)
    want = replica_sum(parts)
    assert peers.takes(parts[0])
    peers.all_reduce(parts)
    sync(devices)
    for part in parts:
        assert torch.equal(part.cpu(), want)


def test_a_view_off_the_16_byte_grid_takes_the_one_value_path(devices, peers):
    parts = draw(devices, 4099, seed=5, offset=1)
    want = replica_sum(parts)
    peers.all_reduce(parts)
    sync(devices)
    assert all(torch.equal(part.cpu(), want) for part in parts)


def test_calls_in_a_row_on_side_streams_keep_meeting(devices, peers):
    """100 calls of two sizes on each device's own stream, without a host sync between them:
    each call's flags are the next epoch of every block, whatever the grid."""
    streams = [torch.cuda.Stream(d) for d in devices]
    wants, results = [], []
    for k in range(100):
        parts = draw(devices, 777 if k % 2 else 60_001, seed=100 + k)
        wants.append(replica_sum(parts))
        for stream, d in zip(streams, devices, strict=True):
            stream.wait_stream(torch.cuda.current_stream(d))
        peers.all_reduce(parts, streams=streams)
        results.append(parts)
    sync(devices)
    for want, parts in zip(wants, results, strict=True):
        assert all(torch.equal(part.cpu(), want) for part in parts)


def test_captured_in_one_graph_per_device_and_replayed(devices, peers):
    n = len(devices)
    buffers = draw(devices, 9_000, seed=7)
    sources = [torch.empty_like(b) for b in buffers]
    graphs = [torch.cuda.CUDAGraph() for _ in devices]
    streams = [torch.cuda.Stream(d) for d in devices]
    sync(devices)
    for d, graph, stream in zip(devices, graphs, streams, strict=True):
        with torch.cuda.device(d), torch.cuda.stream(stream):
            graph.capture_begin(capture_error_mode="relaxed")
    for r in range(n):
        with torch.cuda.device(devices[r]), torch.cuda.stream(streams[r]):
            buffers[r].copy_(sources[r])
    peers.all_reduce(buffers, streams=streams)
    for d, graph, stream in zip(devices, graphs, streams, strict=True):
        with torch.cuda.device(d), torch.cuda.stream(stream):
            graph.capture_end()
    for k in range(20):
        fresh = draw(devices, 9_000, seed=200 + k)
        for src, value in zip(sources, fresh, strict=True):
            src.copy_(value)
        sync(devices)
        for d, graph in zip(devices, graphs, strict=True):
            with torch.cuda.device(d):
                graph.replay()
        sync(devices)
        want = replica_sum(fresh)
        assert all(torch.equal(b.cpu(), want) for b in buffers), k


def test_a_bucket_too_long_for_peer_reads_goes_to_nccl(devices, peers):
    n = len(devices)
    numel = PEER_SUM_BYTES // (4 * (n - 1)) + 1
    parts = draw(devices, numel, seed=9)
    assert not peers.takes(parts[0]) and peers.takes(parts[0][:-1])
    want = torch.stack([p.double().cpu() for p in parts]).sum(0)
    peers.all_reduce(parts)
    sync(devices)
    for part in parts:   # NCCL's ring order: float rounding against the float64 sum
        torch.testing.assert_close(part.double().cpu(), want, rtol=1e-6, atol=1e-5)
    assert all(torch.equal(part.cpu(), parts[0].cpu()) for part in parts[1:])


def test_bad_arguments_are_one_line_errors(devices, peers):
    parts = draw(devices, 100, seed=11)
    with pytest.raises(RuntimeError, match="peer_sum: every part must be a contiguous float32 "
                                           "CUDA tensor of one size"):
        peers.ext.peer_sum([parts[0], parts[1][:50], *parts[2:]], 0, peers.flags,
                           peers.scratch[0], peers.counters[0])
    with pytest.raises(RuntimeError, match="peer_sum: one flag tensor a replica"):
        peers.ext.peer_sum(parts, 0, peers.flags[:1], peers.scratch[0], peers.counters[0])
    with pytest.raises(RuntimeError, match="peer_sum: the scratch must be float32 on the "
                                           "rank's device"):
        peers.ext.peer_sum(parts, 0, peers.flags, peers.scratch[1], peers.counters[0])
    with pytest.raises(RuntimeError, match="peer_sum: the timeout must be above 0 and at most "
                                           "3600 s"):
        peers.ext.peer_sum(parts, 0, peers.flags, peers.scratch[0], peers.counters[0], 0.0)


TRAP_CHILD = r"""
import time
import torch
import torch.cuda.nccl as nccl
from caffe_py.parallel.peer_sum import PeerCollectives

devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
peers = PeerCollectives.on(devices, nccl)
parts = [torch.ones(1000, device=d) for d in devices]
for d in devices:
    torch.cuda.synchronize(d)
start = time.monotonic()
with torch.cuda.device(0):
    peers.ext.peer_sum(parts, 0, peers.flags, peers.scratch[0], peers.counters[0], 1.0)
try:
    torch.cuda.synchronize(0)
    print("no error")
except RuntimeError as e:
    print(f"{time.monotonic() - start:.1f} s: {str(e).splitlines()[0]}")
"""


def test_a_peer_that_never_calls_traps_instead_of_hanging():
    """Replica 0 sums while replica 1 never calls: its kernel traps after the 1 s timeout and
    the host sees a CUDA error (in a child process: the trap ends its CUDA context)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", TRAP_CHILD], capture_output=True, text=True,
                          timeout=120, cwd=root)
    lines = done.stdout.strip().splitlines()
    assert done.returncode == 0 and lines, done.stderr[-2000:]
    seconds, said = lines[-1].split(" s: ", 1)
    assert said.startswith("CUDA error: "), lines[-1]
    assert 1.0 <= float(seconds) < 20.0, lines[-1]
