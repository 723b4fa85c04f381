"""The simulated network (benchmarks/netsim.py: namespaces, veth pairs on a bridge, tc delay and
rate) and the slow-network benchmark's table. The network tests need root, ``ip`` and ``tc``
and skip cleanly without them."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import load_benchmark

netsim = load_benchmark("netsim")
slow = load_benchmark("slow_network")
WHY = netsim.SimNet.available()
needs_net = pytest.mark.skipif(WHY is not None, reason=f"simulated network: {WHY}")

PING = r"""
import socket, sys, time
if sys.argv[1] == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 5999)); s.listen(1); print("up", flush=True)
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(9):
        c.sendall(c.recv(1))
    n = 0
    while n < int(sys.argv[2]):
        n += len(c.recv(1 << 20))
    c.sendall(b"k")
else:
    c = socket.create_connection((sys.argv[2], 5999))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(9):
        t = time.perf_counter(); c.sendall(b"x"); c.recv(1); rtts.append(time.perf_counter() - t)
    t = time.perf_counter(); c.sendall(bytes(int(sys.argv[3]))); c.recv(1)
    print(sorted(rtts)[4] * 1000, time.perf_counter() - t)
"""


def _ping(net, size: int) -> tuple[float, float]:
    """(median round trip in ms, seconds to send ``size`` bytes) from host 0 to host 1."""
    server = subprocess.Popen(net.argv(1, [sys.executable, "-c", PING, "serve", str(size)]),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "up"
        out = subprocess.run(net.argv(0, [sys.executable, "-c", PING, "ping", net.address(1),
                                          str(size)]),
                             capture_output=True, text=True, timeout=60, check=True)
        server.wait(10)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    rtt, seconds = out.stdout.split()
    return float(rtt), float(seconds)


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@needs_net
@pytest.mark.timeout(120)
def test_links_delay_by_half_the_round_trip_and_limit_the_rate():
    with netsim.SimNet(2) as plain:
        fast_rtt, _ = _ping(plain, 1000)
    with netsim.SimNet(2, rtt_ms=20, rate="100mbit") as net:
        rtt, seconds = _ping(net, 4_000_000)
        names = {net.ns(0), net.ns(1)}
        assert names <= _namespaces()
    assert fast_rtt < 5
    assert 19.5 < rtt < 35                    # two links of 10 ms each
    assert seconds > 4_000_000 * 8 / 100e6 * 0.8          # 100 Mbit/s: at least ~0.26 s
    assert not names & _namespaces()          # the namespaces are gone


GLOO = r"""
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.full((3,), float(dist.get_rank() + 1))
dist.all_reduce(t)
dist.barrier()
print(t.tolist(), flush=True)
dist.destroy_process_group()
"""


@needs_net
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_gloo_between_two_namespaces_over_a_slow_link():
    with netsim.SimNet(2, rtt_ms=10, rate="1gbit") as net:
        procs = []
        for k in range(2):
            env = {**os.environ, "RANK": str(k), "WORLD_SIZE": "2", "MASTER_ADDR": net.address(0),
                   "MASTER_PORT": "29577", "GLOO_SOCKET_IFNAME": net.ifname(k)}
            procs.append(subprocess.Popen(net.argv(k, [sys.executable, "-c", GLOO]), env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.strip().splitlines()[-1] for o in outs] == ["[3.0, 3.0, 3.0]"] * 2


@pytest.mark.skipif(os.geteuid() == 0, reason="checks the message without root")
def test_without_root_the_network_says_why():
    assert netsim.SimNet.available() == "needs root (network namespaces, tc)"


def test_rates_in_bits():
    assert netsim._bits("1gbit") == 10**9 and netsim._bits("100mbit") == 10**8
    with pytest.raises(ValueError, match="use e.g. 1gbit"):
        netsim._bits("fast")


def test_the_table_gives_each_mode_its_ratio_to_the_same_link_without_delay():
    rows = [{"hosts": 2, "replicas": 1, "rate": rate, "rtt_ms": rtt, "mode": mode, "it_s": v}
            for rate, rtt, mode, v in [
                ("1gbit", 0, "sync", 10.0), ("1gbit", 0, "periodic", 12.0),
                ("1gbit", 0, "async", 12.0), ("1gbit", 20, "sync", 4.0),
                ("1gbit", 20, "periodic", 9.0), ("1gbit", 20, "async", 11.7),
                ("100mbit", 0, "sync", 5.0)]]
    lines = slow.table(rows)
    assert lines[2] == "| 2 x cpu:1 | 1gbit | 0 | 10.00 (1.00) | 12.00 (1.00) | 12.00 (1.00) |"
    assert lines[3] == "| 2 x cpu:1 | 1gbit | 20 | 4.00 (0.40) | 9.00 (0.75) | 11.70 (0.97) |"
    assert lines[4] == "| 2 x cpu:1 | 100mbit | 0 | 5.00 (1.00) | - | - |"


def test_the_benchmark_modes_are_the_solver_fields():
    assert slow.mode_fields("sync", 16) == {"host_average_period": 0}
    assert slow.mode_fields("async", 8) == {"host_average_period": 8,
                                            "host_average_async": True}
    assert slow.MODES == ("sync", "periodic", "async")
