"""The arithmetic benchmarks/replica_profile.py takes a trace apart with (made-up kernels with
known times), and its run syntax."""
from __future__ import annotations

import pytest
from support import load_benchmark

rp = load_benchmark("replica_profile")
MS = 1_000_000   # ns


def test_union_and_overlap_of_intervals():
    assert rp.union([(5, 9), (0, 3), (2, 4), (9, 10)]) == [(0, 4), (5, 10)]
    assert rp.length(rp.union([(5, 9), (0, 3), (2, 4)])) == 8
    assert rp.overlap([(0, 4), (6, 10)], [(3, 7), (9, 12)]) == 1 + 1 + 1


def test_two_iterations_taken_apart():
    # per iteration: backward 0-10 ms on stream 1, NCCL 8-12 ms on stream 2, the 1/N multiply
    # 12-12.5 on stream 2, the update 13-13.5 on stream 1; the next iteration 20 ms later
    one = [("conv_dgrad", 1, 0, 10 * MS), ("ncclDevKernel_AllReduce", 2, 8 * MS, 12 * MS),
           ("mul", 2, 12 * MS, 12 * MS + MS // 2),
           ("sgd_update_kernel", 1, 13 * MS, 13 * MS + MS // 2)]
    events = one + [(n, k, s + 20 * MS, e + 20 * MS) for n, k, s, e in one]
    d = rp.device_breakdown(events, 2)
    assert d["period_ms"] == pytest.approx(33.5 / 2)
    assert d["busy_ms"] == pytest.approx(10 + 2 + 0.5 + 0.5)
    assert d["idle_ms"] == pytest.approx(33.5 / 2 - 13)
    assert d["compute_ms"] == pytest.approx(11)
    assert d["nccl_ms"] == pytest.approx(4)
    assert d["nccl_exposed_ms"] == pytest.approx(2)
    assert d["side_ms"] == pytest.approx(0.5)
    assert d["update_ms"] == pytest.approx(0.5)
    assert d["before_update_ms"] == pytest.approx(1.0)
    assert d["gaps"][0] == (pytest.approx(6.5 / 2), "sgd_update_kernel", "conv_dgrad")
    assert d["gaps"][1] == (pytest.approx(0.5), "mul", "sgd_update_kernel")


def test_short_iterations_taken_apart_at_their_own_scale():
    # LeNet-like: 0.3 ms iterations; NCCL's last all-reduce ends at 0.24 ms, the update runs
    # 0.25-0.26 ms, then 6 us idle before the last layer's kernel and 6 us before the next
    # iteration's first: the joins and the few-microsecond gaps are found (ResNet-50's 1 ms
    # and 20 us thresholds would merge the iterations and miss the gaps)
    US = 1_000
    one = [("conv", 1, 0, 200 * US), ("ncclDevKernel_AllReduce", 2, 150 * US, 240 * US),
           ("sgd_update_kernel", 1, 250 * US, 260 * US), ("fc", 1, 266 * US, 294 * US)]
    events = [(n, k, s + j * 300 * US, e + j * 300 * US) for j in range(3) for n, k, s, e in one]
    d = rp.device_breakdown(events, 3)
    assert d["before_update_ms"] == pytest.approx(0.010)
    assert d["idle_ms"] == pytest.approx((894 - 3 * 278) / 3 / 1000)
    assert d["gaps"][0] == (pytest.approx(0.010), "ncclDevKernel_AllReduce", "sgd_update_kernel")
    assert d["gaps"][1] == (pytest.approx(0.006), "sgd_update_kernel", "fc")
    assert d["gaps"][2] == (pytest.approx(0.006 * 2 / 3), "fc", "conv")


def test_graph_launches_against_their_first_kernels():
    # three graph launches (ids 7, 8, 9): each called 30 ms before the previous graph's last
    # kernel ends and returning after 1 ms; each graph's first kernel 0.5 ms after the call
    # returns where the device was free, else when the previous graph ends
    calls = [(7, 0, 1 * MS), (8, 15 * MS, 16 * MS), (9, 60 * MS, 61 * MS)]
    kernels = [(7, int(1.5 * MS), 20 * MS), (7, 20 * MS, 45 * MS),
               (8, 45 * MS, 90 * MS), (9, 90 * MS, 135 * MS), (42, 0, 10)]
    got = rp.launch_delays(calls, kernels)
    assert got["graphs"] == 3
    assert got["ahead_ms"] == pytest.approx(30.0)        # 45 - 15 and 90 - 60
    assert got["to_first_kernel_ms"] == pytest.approx(29.0)   # 0.5, 29, 29
    assert rp.launch_delays([], kernels)["graphs"] == 0


def test_grown_kernels_leave_nccl_out():
    run = {"devices": [{"kernels": {"conv": 2.5, "nccl": 9.0, "bn": 1.0}}]}
    one = {"devices": [{"kernels": {"conv": 2.0, "bn": 1.1}}]}
    assert rp.grown(run, one) == [("conv", pytest.approx(0.5)), ("bn", pytest.approx(-0.1))]


def test_events_between_the_last_two_markers():
    events = [("spin_kernel", 1, 0, 10), ("a", 1, 20, 30), ("spin_kernel", 1, 40, 50),
              ("b", 1, 60, 70), ("spin_kernel", 1, 80, 90), ("c", 1, 95, 99)]
    assert rp.between_marks(events) == [("b", 1, 60, 70)]
    assert rp.between_marks(events[:2]) == []


def test_run_syntax():
    assert rp.parse_run("4+noreduce+NCCL_PROTO=Simple") == (
        4, ["noreduce"], {"NCCL_PROTO": "Simple"})
    assert rp.parse_run("2+buffers4+threads+reverse") == (
        2, ["buffers4", "threads", "reverse"], {})
    assert rp.parse_run("1+flat+heuristic") == (1, ["flat", "heuristic"], {})
    assert rp.parse_run("2+divide+threads") == (2, ["divide", "threads"], {})
    assert rp.parse_run("2+parts8") == (2, ["parts8"], {})
    assert rp.parse_run("2+noreduce+solo+monitor256+addmm") == (
        2, ["noreduce", "solo", "monitor256", "addmm"], {})
    assert rp.parse_run("1+ctx+peer") == (1, ["ctx", "peer"], {})
    assert rp.parse_run("4+nccl") == (4, ["nccl"], {})
    with pytest.raises(SystemExit, match=r"--runs: '2\+parts0' is not COUNT"):
        rp.parse_run("2+parts0")
    with pytest.raises(SystemExit, match=r"--runs: '2\+monitor0' is not COUNT"):
        rp.parse_run("2+monitor0")
    with pytest.raises(SystemExit, match=r"--runs: '4\+fast' is not COUNT"):
        rp.parse_run("4+fast")


def test_the_events_around_the_longest_gap():
    # a 2 us gap after "a", a 10 us one after "c" (while "b" on another stream ends earlier)
    US = 1_000
    events = [("a", 1, 0, 5 * US), ("b", 2, 3 * US, 8 * US), ("c", 1, 10 * US, 12 * US),
              ("d", 1, 22 * US, 25 * US), ("e", 2, 23 * US, 30 * US)]
    got = rp.around_longest_gap(events, k=2)
    assert got == [("b", 2, -9.0, -4.0), ("c", 1, -2.0, 0.0),
                   ("d", 1, 10.0, 13.0), ("e", 2, 11.0, 18.0)]
    assert rp.around_longest_gap([("a", 1, 0, 5), ("b", 1, 3, 9)]) == []


def test_one_iteration_runs_from_the_second_update_to_the_third():
    US = 1_000
    one = [("conv", 1, 0, 50 * US), ("sgd_update_kernel", 1, 60 * US, 70 * US)]
    events = [(n, k, s + j * 100 * US, e + j * 100 * US) for j in range(4) for n, k, s, e in one]
    assert rp.one_iteration(events) == [("conv", 1, 0.0, 50.0),
                                        ("sgd_update_kernel", 1, 60.0, 70.0)]
    assert rp.one_iteration(events, most=1) == []
    assert rp.one_iteration(events[:4]) == []
    assert rp.parse_run("2+twin+chunk20") == (2, ["twin", "chunk20"], {})


def test_the_hosts_calls_before_the_longest_gap():
    # the device idles 20-50 us; the host launched this device's graph (id 9) at 45 us, after
    # waiting on an event from 5 to 44 us; a call 4 ms earlier is left out
    US = 1_000
    events = [("a", 1, 0, 20 * US), ("b", 1, 50 * US, 60 * US)]
    calls = [("cudaLaunchKernel", 1, -4000 * US, -3999 * US),
             ("cudaEventSynchronize", 2, 5 * US, 44 * US),
             ("cudaGraphLaunch", 9, 45 * US, 48 * US)]
    got = rp.host_around_gap(events, calls, mine={9})
    assert got == [("cudaEventSynchronize", False, -15.0, 24.0),
                   ("cudaGraphLaunch", True, 25.0, 28.0)]


def test_time_inside_and_between_graphs_per_iteration():
    # three 2.5 ms graphs of 10 iterations, 0.1 ms and 0.3 ms apart: the first one's gap is
    # before the window
    times = [(2.5, None), (2.5, 0.1), (2.5, 0.3)]
    assert rp.replay_times(times, 30) == pytest.approx(
        {"in_graphs_ms": 0.25, "between_ms": 0.4 / 30, "graphs": 3})


def test_replay_spans_per_device():
    """Events from two devices in launch order, each device's gaps from its own previous
    graph (stand-in events: the device and a clock in ms)."""
    class Ev:
        def __init__(self, device, t):
            self.device, self.t = type("D", (), {"index": device})(), t

        def elapsed_time(self, other):
            return other.t - self.t

    spans = [(Ev(0, 0.0), Ev(0, 2.0)), (Ev(1, 0.5), Ev(1, 2.4)),
             (Ev(0, 2.1), Ev(0, 4.1)), (Ev(1, 3.0), Ev(1, 4.8))]
    out = rp.replay_spans(spans, 4)
    assert [d["device"] for d in out] == [0, 1]
    assert out[0]["in_graphs_ms"] == pytest.approx(4.0 / 4)
    assert out[0]["between_ms"] == pytest.approx(0.1 / 4)
    assert out[1]["in_graphs_ms"] == pytest.approx((1.9 + 1.8) / 4)
    assert out[1]["between_ms"] == pytest.approx(0.6 / 4)


def test_a_given_solver_is_run_long_enough_for_the_windows(tmp_path):
    given = tmp_path / "raw_lmdb_solver.yaml"
    given.write_text("net: /data/specs/raw_lmdb_net.yaml\nbase_lr: 0.01\nmax_iter: 190\n"
                     "display: 10\nsnapshot_prefix: /data/specs/raw_snap\n")
    path = rp._solver(tmp_path, "resnet50", "4+noreduce", True, given)
    spec = rp.yaml.safe_load(path.read_text())
    assert path == tmp_path / "profile_4_noreduce.yaml"
    assert spec == {"net": "/data/specs/raw_lmdb_net.yaml", "base_lr": 0.01,
                    "max_iter": 40 + rp.WARM + rp.PROFILED + rp.TIMED["resnet50"],
                    "display": 0, "snapshot_prefix": str(tmp_path / "snap_4_noreduce" / "s"),
                    "layer_wise_reduce": False}
