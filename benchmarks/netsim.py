"""A simulated network of several hosts on one machine, for the slow-network benchmark.

Each "host" is a network namespace with one veth pair to a bridge in the root namespace
(10.77.0.1, .2, ... on the inner ends). Every host's link is shaped with ``tc``:

* **delay**: ``tc qdisc ... netem delay <RTT/2>`` on each host's veth (so a round trip
  between two hosts crosses two links: RTT), as ``netem`` does it. A kernel built without
  ``sch_netem`` (``CONFIG_NET_SCH_NETEM`` unset, e.g. a minimal VM kernel) gets the same
  delay from user space instead: an ``iptables -j NFQUEUE`` rule on each host's INPUT sends
  what arrives from the bridge to a small process in that namespace (``python netsim.py
  delay``) that gives each packet its verdict RTT/2 after it arrived, in order (the receive
  path, so the sender's socket is not charged for packets held in the queue);
* **rate**: ``netem rate`` with netem, else ``tc qdisc ... tbf rate R`` on each veth's egress
  (the host's uplink).

``SimNet.available()`` says why a network cannot be built here (not root, no ``ip`` or
``tc``, no network namespaces, no delay mechanism), so tests and the benchmark skip cleanly.
Run as root, :func:`install_missing` installs Debian's ``iproute2`` (and ``iptables`` when the
kernel has no netem) with apt-get, and reports what it installed.

    with SimNet(hosts=2, rtt_ms=20, rate="1gbit") as net:
        subprocess.run(net.argv(0, ["python", "-c", "..."]))     # runs in host 0's namespace
"""
from __future__ import annotations

import argparse
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

SUBNET = "10.77.0"
QUEUE = 7
_made = [0]
"""Networks made by this process (each gets its own interface names: a deleted namespace
frees its veth pair asynchronously)."""


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def install_missing() -> list[str]:
    """apt-get install what the simulated network needs and lacks (root only); the packages
    installed, for the benchmark's notes."""
    wanted = []
    if not (shutil.which("ip") and shutil.which("tc")):
        wanted.append("iproute2")
    if os.geteuid() == 0 and shutil.which("tc") and not netem_available() \
            and not shutil.which("iptables-legacy"):
        wanted.append("iptables")
    if not wanted or os.geteuid() != 0 or not shutil.which("apt-get"):
        return []
    if _run("apt-get", "install", "-y", "-q", *wanted, check=False).returncode != 0:
        _run("apt-get", "update", "-q", check=False)
        _run("apt-get", "install", "-y", "-q", *wanted, check=False)
    return wanted


def netem_available() -> bool:
    """Whether this kernel has the netem qdisc (tried on a throwaway namespace's loopback)."""
    name = f"cpyprobe{os.getpid()}"
    if _run("ip", "netns", "add", name, check=False).returncode != 0:
        return False
    try:
        return _run("ip", "netns", "exec", name, "tc", "qdisc", "add", "dev", "lo", "root",
                    "netem", "delay", "1ms", check=False).returncode == 0
    finally:
        _run("ip", "netns", "del", name, check=False)


class SimNet:
    """``hosts`` namespaces on one bridge; every link delays by ``rtt_ms / 2`` and runs at
    ``rate`` (a tc rate: "1gbit", "100mbit"); ``rtt_ms=0`` and ``rate=None`` leave the links
    as they are."""

    def __init__(self, hosts: int, rtt_ms: float = 0.0, rate: str | None = None,
                 prefix: str | None = None):
        self.hosts, self.rtt_ms, self.rate = hosts, rtt_ms, rate
        _made[0] += 1
        self.prefix = prefix or f"cpy{os.getpid() % 100000}n{_made[0] % 100}"
        self.bridge = f"{self.prefix}br"
        self.delayers: list[subprocess.Popen] = []
        self.netem = False
        self.delay_by = "none"

    @staticmethod
    def available() -> str | None:
        """None when a simulated network can be built here, else why not."""
        if os.geteuid() != 0:
            return "needs root (network namespaces, tc)"
        for tool in ("ip", "tc"):
            if not shutil.which(tool):
                return f"needs '{tool}' (apt-get install iproute2)"
        name = f"cpycheck{os.getpid()}"
        if _run("ip", "netns", "add", name, check=False).returncode != 0:
            return "cannot create network namespaces here"
        _run("ip", "netns", "del", name, check=False)
        if not netem_available() and not shutil.which("iptables-legacy"):
            return "the kernel has no netem and iptables-legacy is missing for the user-space delay"
        return None

    def ns(self, k: int) -> str:
        return f"{self.prefix}h{k}"

    def ifname(self, k: int) -> str:
        """Host k's interface, inside its namespace."""
        return f"{self.prefix}i{k}"

    def address(self, k: int) -> str:
        return f"{SUBNET}.{k + 1}"

    def argv(self, k: int, argv: list[str]) -> list[str]:
        """``argv`` run inside host k's namespace."""
        return ["ip", "netns", "exec", self.ns(k), *argv]

    def __enter__(self) -> SimNet:
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        self.netem = netem_available()
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        _run("ip", "link", "set", self.bridge, "up")
        for k in range(self.hosts):
            ns, inner, outer = self.ns(k), self.ifname(k), f"{self.prefix}o{k}"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", inner, "type", "veth", "peer", "name", outer)
            _run("ip", "link", "set", inner, "netns", ns)
            _run("ip", "link", "set", outer, "master", self.bridge)
            _run("ip", "link", "set", outer, "up")
            inside = ["ip", "netns", "exec", ns]
            _run(*inside, "ip", "addr", "add", f"{self.address(k)}/24", "dev", inner)
            _run(*inside, "ip", "link", "set", inner, "up")
            _run(*inside, "ip", "link", "set", "lo", "up")
            # windows for a long fat link (1 Gbit/s x 50 ms is 6.25 MB in flight), as a host
            # tuned for its network has them
            for key, value in (("net.ipv4.tcp_rmem", "4096 131072 67108864"),
                               ("net.ipv4.tcp_wmem", "4096 65536 67108864"),
                               ("net.ipv4.tcp_limit_output_bytes", "67108864")):
                _run(*inside, "sysctl", "-q", "-w", f"{key}={value}", check=False)
            self._shape(k)

    def _shape(self, k: int) -> None:
        """Host k's link: its delay (half the round trip) and its rate."""
        inside = ["ip", "netns", "exec", self.ns(k)]
        one_way = self.rtt_ms / 2
        if self.netem and (one_way > 0 or self.rate):
            args = ["delay", f"{one_way}ms"] + (["rate", self.rate] if self.rate else [])
            limit = ["limit", "100000"]
            _run(*inside, "tc", "qdisc", "add", "dev", self.ifname(k), "root", "netem",
                 *args, *limit)
            self.delay_by = "netem"
            return
        if self.rate:
            burst = max(64 * 1024, _bits(self.rate) // 8 // 250)
            _run(*inside, "tc", "qdisc", "add", "dev", self.ifname(k), "root", "tbf", "rate",
                 self.rate, "burst", str(burst), "latency", "50ms")
        if one_way > 0:
            self._user_space_delay(k, one_way)
            self.delay_by = "NFQUEUE (user space; the kernel has no netem)"

    def _user_space_delay(self, k: int, one_way_ms: float) -> None:
        inside = ["ip", "netns", "exec", self.ns(k)]
        proc = subprocess.Popen([*inside, sys.executable, str(Path(__file__).resolve()),
                                 "delay", "--ms", str(one_way_ms), "--queue", str(QUEUE)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.delayers.append(proc)
        line = proc.stdout.readline() if proc.stdout else ""
        if line.strip() != "ready":
            raise RuntimeError(f"the delay process of host {k} did not start: {line.strip()}")
        _run(*inside, "iptables-legacy", "-A", "INPUT", "-i", self.ifname(k), "-j", "NFQUEUE",
             "--queue-num", str(QUEUE))

    def close(self) -> None:
        for proc in self.delayers:
            proc.terminate()
        for proc in self.delayers:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.delayers = []
        for k in range(self.hosts):
            _run("ip", "link", "del", f"{self.prefix}o{k}", check=False)
            _run("ip", "netns", "del", self.ns(k), check=False)
        _run("ip", "link", "del", self.bridge, check=False)


def _bits(rate: str) -> int:
    """A tc rate ("1gbit", "100mbit", "500kbit") in bits per second."""
    units = {"gbit": 10**9, "mbit": 10**6, "kbit": 10**3, "bit": 1}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return int(float(rate[:-len(unit)]) * scale)
    raise ValueError(f"rate {rate!r}: use e.g. 1gbit, 100mbit")


# --- the user-space delay: nfnetlink_queue ---------------------------------------------------
NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
MSG_PACKET, MSG_CONFIG, MSG_VERDICT_BATCH = 0, 2, 3
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
CFG_CMD, CFG_PARAMS, CFG_QUEUE_MAXLEN, CFG_MASK, CFG_FLAGS = 1, 2, 3, 4, 5
CMD_BIND = 1
COPY_META = 1
F_GSO = 1 << 2
NF_ACCEPT = 1
SOL_NETLINK, NETLINK_NO_ENOBUFS = 270, 5


def _attr(kind: int, payload: bytes) -> bytes:
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + b"\0" * (-size % 4)


def _message(msg: int, queue: int, attrs: bytes, flags: int = NLM_F_REQUEST) -> bytes:
    body = struct.pack("=BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, 0,
                       0) + body


def _bind(sock: socket.socket, queue: int) -> None:
    """Bind the queue, copy only metadata, keep GSO packets whole, allow a long queue."""
    config = [
        _attr(CFG_CMD, struct.pack("=BBH", CMD_BIND, 0, socket.htons(socket.AF_INET))),
        _attr(CFG_PARAMS, struct.pack(">IB", 0, COPY_META)),
        _attr(CFG_QUEUE_MAXLEN, struct.pack(">I", 65536)),
        _attr(CFG_MASK, struct.pack(">I", F_GSO)) + _attr(CFG_FLAGS, struct.pack(">I", F_GSO)),
    ]
    for attrs in config:
        sock.send(_message(MSG_CONFIG, queue, attrs, NLM_F_REQUEST | NLM_F_ACK))
        for kind, payload in _messages(sock.recv(65536)):
            if kind == NLMSG_ERROR and struct.unpack("=i", payload[:4])[0] != 0:
                raise OSError(-struct.unpack("=i", payload[:4])[0], "nfqueue config refused")


def _messages(data: bytes):
    """(type, payload after the netlink header) of each message in ``data``."""
    pos = 0
    while pos + 16 <= len(data):
        size, kind = struct.unpack_from("=IH", data, pos)
        yield kind, data[pos + 16:pos + size]
        pos += (size + 3) & ~3


def _packet_id(payload: bytes) -> int | None:
    pos = 4                                   # after the nfgenmsg header
    while pos + 4 <= len(payload):
        size, kind = struct.unpack_from("=HH", payload, pos)
        if kind & 0x7FFF == 1:                # NFQA_PACKET_HDR: __be32 packet_id first
            return struct.unpack_from(">I", payload, pos + 4)[0]
        pos += (size + 3) & ~3
    return None


def delay_loop(one_way_ms: float, queue: int) -> None:
    """Accept every packet of ``queue`` ``one_way_ms`` after it arrived, in order."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, 33, 64 * 2**20)      # SO_RCVBUFFORCE (root)
    sock.setsockopt(SOL_NETLINK, NETLINK_NO_ENOBUFS, 1)
    sock.bind((0, 0))
    _bind(sock, queue)
    print("ready", flush=True)
    held: deque[tuple[float, int]] = deque()
    delay = one_way_ms / 1000.0
    while True:
        now = time.monotonic()
        last = None
        while held and held[0][0] <= now:
            last = held.popleft()[1]
        if last is not None:     # accept every packet up to this one
            sock.send(_message(MSG_VERDICT_BATCH, queue,
                               _attr(2, struct.pack(">II", NF_ACCEPT, last))))
        timeout = max(0.0, held[0][0] - time.monotonic()) if held else 1.0
        if select.select([sock], [], [], timeout)[0]:
            arrived = time.monotonic()
            for kind, payload in _messages(sock.recv(2**20)):
                if kind == (NFNL_SUBSYS_QUEUE << 8) | MSG_PACKET:
                    pid = _packet_id(payload)
                    if pid is not None:
                        held.append((arrived + delay, pid))


def main() -> None:
    ap = argparse.ArgumentParser(description="the user-space delay of one simulated host")
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("delay")
    d.add_argument("--ms", type=float, required=True)
    d.add_argument("--queue", type=int, default=QUEUE)
    args = ap.parse_args()
    try:
        delay_loop(args.ms, args.queue)
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        print(f"error: {exc}", flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
