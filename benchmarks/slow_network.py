"""Iteration rate over a slow network: synchronous all-reduce, periodic and asynchronous model
averaging between simulated hosts (benchmarks/netsim.py), LeNet on Fashion-MNIST.

Each "host" is one process in its own network namespace, with ``--replicas`` CPU replicas
(``cpu:N``), gloo between the hosts over veth links through a bridge, each link delayed by half
the round trip and limited to the link's rate (tc). For every host count, replica count and
link it trains configs/mnist.yaml (LeNet, batch 64 per replica) three ways:

* ``sync``: ``host_average_period: 0``, the gradient all-reduced between hosts every iteration;
* ``periodic``: ``host_average_period: K`` (16), the hosts' models averaged synchronously;
* ``async``: ``host_average_period: K`` and ``host_average_async: true``, the exchange
  overlapped with the next K iterations and folded in one period late.

The rate is rank 0's iterations per second over ``--measure`` iterations after ``--warmup``
(whole periods; the run's final synchronous average at max_iter is outside the window), and
the ratio is to the same run's rate on the same link with no delay (0 ms RTT, same rate).
Needs root (network namespaces); installs iproute2 (and iptables, for the user-space delay
on kernels without netem) with apt-get when missing, and says so in the notes::

    sudo python benchmarks/slow_network.py                       # the whole grid (long)
    sudo python benchmarks/slow_network.py --hosts 2 --replicas 1 --rtts 0,20 --rates 1gbit

``--curve`` instead trains each mode over one link for ``--curve-iters`` iterations, testing
every ``--curve-every`` (``--curve-test-iter`` batches of 100), and writes accuracy against
wall time as JSON (and a PNG plot when matplotlib, not a caffe-py dependency, imports).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

MODES = ("sync", "periodic", "async")


def mode_fields(mode: str, period: int) -> dict:
    return {"sync": {"host_average_period": 0},
            "periodic": {"host_average_period": period},
            "async": {"host_average_period": period, "host_average_async": True}}[mode]


# --- one host's process -----------------------------------------------------------------------
def host_main(args: argparse.Namespace) -> None:
    """Train one host's part (RANK etc. in the environment); rank 0 writes its timings."""
    import torch

    from caffe_py.devices import parse_devices
    from caffe_py.options import TrainOptions
    from caffe_py.parallel.multihost import MultiHostRun, _agreed_param, init_hosts
    from caffe_py.parallel.replicated import Tuning
    from caffe_py.spec.solver_spec import load_solver

    torch.set_num_threads(1)
    fields = dict(mode_fields(args.mode, args.period), max_iter=args.iters, display=0,
                  snapshot=0, snapshot_after_train=False, random_seed=1701,
                  test_interval=args.test_every, test_initialization=False,
                  test_iter=[args.test_iter] if args.test_every else [])
    param = dataclasses.replace(load_solver(args.solver), **fields)
    devices = parse_devices(f"cpu:{args.replicas}")
    stamps: dict[int, float] = {}
    tests: list[tuple[int, float, float]] = []

    class Clock:
        seen: object = None

        def on_start(self, solver):
            stamps.setdefault(solver.iter, time.perf_counter())
            if solver.last_test and solver.last_test is not self.seen:   # a test just ran
                self.seen = solver.last_test
                tests.append((solver.iter, time.perf_counter(),
                              float(solver.last_test[0]["accuracy"])))

        def on_gradient_ready(self, solver):
            pass

    hosts = init_hosts(devices, None, 300.0)
    param = _agreed_param(param, hosts)
    tuning = Tuning(timeout=300.0, extra_callbacks=lambda i: [Clock()] if i == 0 else [])
    with MultiHostRun(param, devices, hosts, TrainOptions(dist_timeout=300.0),
                      tuning=tuning) as run:
        started = time.perf_counter()
        root = run.run()
        ended = time.perf_counter()
        exchange = run.averaging.exchange if run.averaging is not None else None
        if root.last_test:
            tests.append((root.iter, ended, float(root.last_test[0]["accuracy"])))
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    if hosts.rank == 0:
        w, e = args.warmup, args.warmup + args.measure
        rate = (e - w) / (stamps[e] - stamps[w]) if e in stamps and w in stamps else None
        Path(args.out).write_text(json.dumps({
            "rate": rate, "seconds": ended - started,
            "exchanges": exchange.exchanges if exchange else None,
            "exchange_wait_s": round(exchange.wait_s, 3) if exchange else None,
            "stamps": {k: round(v - started, 4) for k, v in sorted(stamps.items())},
            "curve": [(it, t - started, acc) for it, t, acc in tests]}))


# --- the orchestrator -------------------------------------------------------------------------
def run_hosts(net, hosts: int, replicas: int, mode: str, args, *, iters: int, port: int,
              test_every: int = 0) -> dict:
    """One training run on ``net``: a process per host; rank 0's result."""
    out = Path(tempfile.mkdtemp(prefix="cpy_slownet_")) / "rank0.json"
    procs = []
    for k in range(hosts):
        env = {**os.environ, "RANK": str(k), "WORLD_SIZE": str(hosts), "LOCAL_RANK": "0",
               "MASTER_ADDR": net.address(0), "MASTER_PORT": str(port),
               "GLOO_SOCKET_IFNAME": net.ifname(k), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(ROOT)}
        argv = [sys.executable, __file__, "host", "--mode", mode, "--replicas", str(replicas),
                "--iters", str(iters), "--warmup", str(args.warmup), "--measure",
                str(args.measure), "--period", str(args.period), "--solver", args.solver,
                "--test-every", str(test_every), "--test-iter", str(args.curve_test_iter),
                "--out", str(out)]
        procs.append(subprocess.Popen(net.argv(k, argv), env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    logs = []
    deadline = time.monotonic() + args.timeout
    for p in procs:
        try:
            logs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            p.kill()
            logs.append(p.communicate()[0])
    if any(p.returncode for p in procs) or not out.exists():
        tail = "\n".join(log[-1500:] for log in logs)
        raise RuntimeError(f"{hosts} hosts x cpu:{replicas} {mode} failed:\n{tail}")
    return json.loads(out.read_text())


def grid(args) -> list[dict]:
    from netsim import SimNet

    rows = []
    port = 29600
    iters = args.warmup + args.measure + 2
    for hosts in _ints(args.hosts):
        for replicas in _ints(args.replicas):
            for rate in args.rates.split(","):
                for rtt in _floats(args.rtts):
                    with SimNet(hosts, rtt, rate) as net:
                        for mode in MODES:
                            rates = []
                            for _ in range(args.repeat):
                                port += 1
                                rates.append(run_hosts(net, hosts, replicas, mode, args,
                                                       iters=iters, port=port)["rate"])
                            row = {"hosts": hosts, "replicas": replicas, "rate": rate,
                                   "rtt_ms": rtt, "mode": mode, "delay_by": net.delay_by,
                                   "it_s": statistics.median(rates), "runs": rates}
                            print(json.dumps(row), flush=True)
                            rows.append(row)
    return rows


def table(rows: list[dict]) -> list[str]:
    base = {(r["hosts"], r["replicas"], r["rate"], r["mode"]): r["it_s"]
            for r in rows if r["rtt_ms"] == 0}
    out = ["| hosts x replicas | link | RTT ms | sync it/s (vs 0 ms) | periodic it/s (vs 0 ms) "
           "| async it/s (vs 0 ms) |", "|---|---|---|---|---|---|"]
    keys = sorted({(r["hosts"], r["replicas"], r["rate"], r["rtt_ms"]) for r in rows},
                  key=lambda k: (k[0], k[1], -_bits(k[2]), k[3]))
    for hosts, replicas, rate, rtt in keys:
        cells = []
        for mode in MODES:
            hit = [r for r in rows if (r["hosts"], r["replicas"], r["rate"], r["rtt_ms"],
                                       r["mode"]) == (hosts, replicas, rate, rtt, mode)]
            if not hit:
                cells.append("-")
                continue
            b = base.get((hosts, replicas, rate, mode))
            ratio = f" ({hit[0]['it_s'] / b:.2f})" if b else ""
            cells.append(f"{hit[0]['it_s']:.2f}{ratio}")
        out.append(f"| {hosts} x cpu:{replicas} | {rate} | {rtt:g} | {' | '.join(cells)} |")
    return out


def curve(args) -> None:
    """Accuracy against wall time for each mode over one link (--curve-rtt, --curve-rate)."""
    from netsim import SimNet

    results = {}
    with SimNet(args.curve_hosts, args.curve_rtt, args.curve_rate) as net:
        for k, mode in enumerate(MODES):
            res = run_hosts(net, args.curve_hosts, args.curve_replicas, mode, args,
                            iters=args.curve_iters, port=29900 + k,
                            test_every=args.curve_every)
            results[mode] = res["curve"]
            print(json.dumps({"mode": mode, "seconds": res["seconds"], "curve": res["curve"]}),
                  flush=True)
        delay_by = net.delay_by
    out = Path(args.curve_out)
    out.write_text(json.dumps({"link": f"{args.curve_rtt:g} ms RTT, {args.curve_rate}",
                               "hosts": args.curve_hosts, "replicas": args.curve_replicas,
                               "delay_by": delay_by, "curves": results}, indent=1))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, points in results.items():
        ax.plot([p[1] for p in points], [p[2] for p in points], marker="o", label=mode)
    ax.set_xlabel("wall time (s)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"LeNet, Fashion-MNIST: {args.curve_hosts} hosts x cpu:{args.curve_replicas}, "
                 f"{args.curve_rtt:g} ms RTT, {args.curve_rate}")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    print(f"plot: {out.with_suffix('.png')}")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",")]


def _bits(rate: str) -> int:
    from netsim import _bits as bits

    return bits(rate)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", nargs="?", default="bench", choices=("bench", "host"))
    ap.add_argument("--solver", default=str(ROOT / "configs" / "mnist.yaml"))
    ap.add_argument("--hosts", default="2,4")
    ap.add_argument("--replicas", default="1,2")
    ap.add_argument("--rtts", default="0,5,20,50")
    ap.add_argument("--rates", default="1gbit,100mbit")
    ap.add_argument("--period", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--measure", type=int, default=64, help="iterations timed (whole periods)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell (the median is shown)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per training run")
    ap.add_argument("--out", default="", help="host: rank 0's JSON; bench: the rows as JSON")
    ap.add_argument("--curve", action="store_true")
    ap.add_argument("--curve-hosts", type=int, default=2)
    ap.add_argument("--curve-replicas", type=int, default=1)
    ap.add_argument("--curve-rtt", type=float, default=20.0)
    ap.add_argument("--curve-rate", default="1gbit")
    ap.add_argument("--curve-iters", type=int, default=800)
    ap.add_argument("--curve-every", type=int, default=100)
    ap.add_argument("--curve-test-iter", type=int, default=20)
    ap.add_argument("--curve-out", default="/tmp/slow_network_curve.json")
    # the host role's own options
    ap.add_argument("--mode", choices=MODES, default="sync")
    ap.add_argument("--iters", type=int, default=82)
    ap.add_argument("--test-every", type=int, default=0)
    ap.add_argument("--test-iter", type=int, default=20)
    args = ap.parse_args()
    if args.role == "host":
        host_main(args)
        return
    from netsim import SimNet, install_missing

    installed = install_missing()
    why = SimNet.available()
    if why:
        print(f"skipped: {why}")
        return
    if args.curve:
        curve(args)
        return
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    rows = grid(args)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"\nmachine: {platform.node()}, {os.cpu_count()} CPUs, "
          f"{platform.platform()}; date: {started}")
    print(f"command: {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    delays = sorted({r['delay_by'] for r in rows if r["rtt_ms"] > 0})
    print(f"delay: {', '.join(delays) or '-'}; rate: tc; installed: "
          f"{', '.join(installed) or 'nothing'}; K = {args.period}; {args.measure} iterations "
          f"timed after {args.warmup}\n")
    print("\n".join(table(rows)))


if __name__ == "__main__":
    main()
