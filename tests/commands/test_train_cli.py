"""cpy train / test / time / device-query from the command line: output, errors, signals."""
from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from support import bare_lines, cli_process, error_line, tiny_net, wait_for

from caffe_py.cli import cli

ROOT = Path(__file__).resolve().parents[2]
NET = tiny_net(extra="""\
  - name: prob
    type: Softmax
    bottom: ip
    top: prob
    include: {phase: TEST}
""")
SOLVER = """\
net: net.yaml
base_lr: 0.05
momentum: 0.9
max_iter: {max_iter}
display: {display}
snapshot_prefix: snaps/tiny
random_seed: 3
"""


@pytest.fixture
def work(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(NET)
    (tmp_path / "solver.yaml").write_text(SOLVER.format(max_iter=4, display=2))
    return tmp_path


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_train_then_test_json(work):
    result = invoke("train", "--solver", "solver.yaml", "--gpus", "cpu")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # the log is on stderr, as Caffe's
    out = result.stderr.splitlines()
    assert out[:3] == ["Using cpu", "Random seed: 3", "Initializing solver from parameters:"]
    assert ("Batch: 4 per replica x 1 replica x iter_size 1 = 4 per update (device cpu, "
            "precision FLOAT32)") in out
    assert "Iteration 2, lr = 0.05" in out and out[-1] == "Optimization Done."
    assert (work / "snaps" / "tiny_iter_4.pt").is_file()
    result = invoke("test", "--model", "net.yaml", "--weights", "snaps/tiny_iter_4.pt",
                    "--iterations", "3", "--json")
    assert result.exit_code == 0, result.output
    scores = json.loads(result.stdout)
    assert list(scores) == ["loss", "prob"]
    assert len(scores["prob"]) == 12 and sum(scores["prob"]) == pytest.approx(4.0, rel=1e-5)
    assert "Batch 2, loss = " in result.stderr and "Loss: " in result.stderr


def test_test_prints_batches_then_means_as_caffe(work):
    invoke("train", "--solver", "solver.yaml")
    result = invoke("test", "--model", "net.yaml", "--weights", "snaps/tiny_iter_4.pt",
                    "--iterations", "2")
    lines = result.stderr.splitlines()
    assert lines[1].startswith("Batch 0, loss = ")
    loss_lines = [ln for ln in lines if ln.startswith("loss = ")]
    assert len(loss_lines) == 1 and "(* 1 = " in loss_lines[0]
    batch = [float(ln.split(" = ")[1]) for ln in lines if ln.startswith("Batch ") and
             ", loss = " in ln]
    assert float(loss_lines[0].split(" = ")[1].split(" ")[0]) == pytest.approx(
        sum(batch) / 2, rel=1e-4)


@pytest.mark.parametrize("args, message", [
    (["--weights", "a.pt", "--snapshot", "a.solverstate.pt"],
     "--weights and --snapshot are exclusive"),
    (["--weights", "snaps/tiny_iter_4.solverstate.pt"],
     "Error: snaps/tiny_iter_4.solverstate.pt is a solver state, not weights; pass it to "
     "--snapshot to resume training"),
    (["--snapshot", "snaps/tiny_iter_4.pt"],
     "Error: snaps/tiny_iter_4.pt is not a solver state (its name has no '.solverstate'); "
     "pass weights to --weights, or give the <prefix>_iter_<N>.solverstate.pt file to "
     "--snapshot"),
    (["--gpus", "cpu:0"], "Error: --gpus cpu:0: expected cpu:N with N >= 1 CPU replicas, "
                          "e.g. cpu:2"),
    (["--weights", "missing.pt"], "Error: missing.pt: file not found; check the path"),
])
def test_train_flag_errors_are_one_line(work, args, message):
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml", *args])
    assert result.exit_code in (1, 2)
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_missing_solver_and_unwritable_snapshot_dir(work):
    result = CliRunner().invoke(cli, ["train", "--solver", "nope.yaml"])
    assert result.exit_code == 1
    assert result.stderr == ("Error: nope.yaml: file not found; check the path (relative to the "
                             "current directory)\n")
    (work / "snaps").write_text("a file where the directory should be")
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml"])
    assert result.exit_code == 1
    assert error_line(result.stderr).startswith(
        f"Error: cannot write snapshots to '{work / 'snaps'}'")
    assert error_line(result.stderr).endswith(   # it said "File exists"
        f"{work / 'snaps'} is a file, not a directory; make the directory writable or change "
        "snapshot_prefix")
    (work / "snaps").unlink()
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml", "--weights",
                                      "/dev/null"])   # it said "file not found"
    assert (result.exit_code, error_line(result.stderr)) == (
        1, "Error: /dev/null: is a device or a pipe, not a file; give weights written by cpy "
           "train (or Caffe)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_gpu_ids_without_cuda(work):
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml", "--gpus", "0,1"])
    assert result.exit_code == 1
    assert result.stderr == ("Error: --gpus 0,1: no CUDA device is available on this machine; "
                             "use --gpus cpu\n")


def test_time_lists_every_layer_and_the_totals(work):
    result = invoke("time", "--model", "net.yaml", "--iterations", "2")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert "Testing for 2 iterations." in lines
    for layer in ("data", "ip", "loss"):
        assert any(ln.strip().startswith(f"{layer}\tforward: ") for ln in lines)
        assert any(ln.strip().startswith(f"{layer}\tbackward: ") for ln in lines)
    for total in ("Average Forward pass: ", "Average Backward pass: ",
                  "Average Forward-Backward: ", "Total Time: "):
        assert any(ln.startswith(total) and ln.endswith(" ms.") for ln in lines)
    assert lines[-1] == "*** Benchmark ends ***"


def test_time_gives_layers_of_one_name_a_row_each(work):
    """Timings were kept by layer name: a ReLU named as the DummyData before it was called with
    the DummyData's bottoms (a TypeError), and two InnerProducts named alike shared one row."""
    (work / "dup.yaml").write_text(
        "name: dup\nlayer:\n"
        "  - {name: data, type: DummyData, top: [data, label], dummy_data_param: {shape: "
        "[{dim: [4, 3, 8, 8]}, {dim: [4]}], data_filler: [{type: gaussian}, {type: constant, "
        "value: 1}]}}\n"
        "  - {name: data, type: ReLU, bottom: data, top: a}\n"
        "  - {name: ip, type: InnerProduct, bottom: a, top: b, inner_product_param: "
        "{num_output: 3}}\n"
        "  - {name: ip, type: InnerProduct, bottom: b, top: c, inner_product_param: "
        "{num_output: 3}}\n"
        "  - {name: loss, type: SoftmaxWithLoss, bottom: [c, label], top: loss}\n")
    result = invoke("time", "--model", "dup.yaml", "--iterations", "1")
    assert result.exit_code == 0, result.output
    rows = [ln.strip().split("\t")[0] for ln in result.stderr.splitlines()
            if "\tforward: " in ln]
    assert [r.split()[-1] for r in rows] == ["data", "data", "ip", "ip", "loss"]


def test_device_query(work):
    result = invoke("device-query")
    assert result.exit_code == 0
    if not torch.cuda.is_available():
        assert result.stdout.startswith("No CUDA device is available: caffe-py runs on the CPU")


def _train_process(work: Path, *flags: str) -> subprocess.Popen:
    (work / "solver.yaml").write_text(SOLVER.format(max_iter=10**7, display=20))
    return cli_process(work, "train", "--solver", "solver.yaml", *flags)


@pytest.mark.slow
def test_sighup_snapshots_and_sigint_stops_with_a_final_snapshot(work):
    proc = _train_process(work)
    seen: list[str] = []
    try:
        wait_for(proc, "Train net output", seen)
        proc.send_signal(signal.SIGHUP)
        hup = wait_for(proc, "Snapshotting to", seen)
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=60)
    finally:
        proc.kill()
    seen += bare_lines(rest)
    assert proc.returncode == 0, rest[-2000:]
    assert seen[-1] == "Optimization stopped early."
    snaps = sorted(p.name for p in (work / "snaps").glob("*.solverstate.pt"))
    assert len(snaps) == 2  # the SIGHUP one, and the final one written on stop
    hup_iter = int(hup.split("_iter_")[1].split(".")[0])
    assert f"tiny_iter_{hup_iter}.solverstate.pt" in snaps


@pytest.mark.slow
def test_sigint_with_effect_none_keeps_training(work):
    proc = _train_process(work, "--sigint-effect", "none", "--sighup-effect", "stop")
    seen: list[str] = []
    try:
        wait_for(proc, "Train net output", seen)
        proc.send_signal(signal.SIGINT)
        wait_for(proc, "Train net output", seen)  # still training
        proc.send_signal(signal.SIGHUP)
        _, rest = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, rest[-2000:]
    assert bare_lines(rest)[-1] == "Optimization stopped early."


def test_weights_for_another_net_name_the_layer(work):
    invoke("train", "--solver", "solver.yaml")
    (work / "net.yaml").write_text(NET.replace("num_output: 3", "num_output: 5"))
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml", "--weights",
                                      "snaps/tiny_iter_4.pt", "--overwrite"])
    assert result.exit_code == 1
    assert error_line(result.stderr) == (
        "Error: snaps/tiny_iter_4.pt: layer 'ip' blob 0: shape [3, 6] in the weights, [5, 6] in "
        "the net; the weights are for another net (or rename the layer to start it afresh)")


def test_a_new_run_over_snapshots_is_refused_and_latest_resumes_the_newest_whole_state(work):
    (work / "solver.yaml").write_text(SOLVER.format(max_iter=4, display=2) + "snapshot: 2\n")
    assert invoke("train", "--solver", "solver.yaml").exit_code == 0
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml"])
    prefix = work / "snaps" / "tiny"
    assert (result.exit_code, error_line(result.stderr)) == (1, (
        f"Error: snapshot_prefix {prefix} already has snapshots (the newest: "
        "tiny_iter_4.solverstate.pt); resume with --snapshot latest, start over with "
        "--overwrite, or change snapshot_prefix"))
    # the newest state is damaged: latest takes the one before it, and says why
    newest = work / "snaps" / "tiny_iter_4.solverstate.pt"
    newest.write_bytes(newest.read_bytes()[:100])
    (work / "solver.yaml").write_text(SOLVER.format(max_iter=6, display=2) + "snapshot: 2\n")
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml", "--snapshot", "latest"])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert lines[1].startswith(f"Skipping {newest}: {newest}: ")
    assert lines[2] == f"--snapshot latest: {work / 'snaps' / 'tiny_iter_2.solverstate.pt'}"
    assert "Iteration 4, lr = 0.05" in lines and lines[-1] == "Optimization Done."
    assert invoke("train", "--solver", "solver.yaml", "--overwrite").exit_code == 0
    for path in (work / "snaps").glob("*.solverstate.pt"):
        path.unlink()
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml", "--snapshot", "latest"])
    assert (result.exit_code, error_line(result.stderr)) == (1, (
        f"Error: --snapshot latest: no solver state of snapshot_prefix {prefix} loads (0 "
        "found); start without --snapshot"))


def test_a_run_that_fails_at_start_leaves_nothing_behind(work):
    (work / "net.yaml").write_text(NET.replace("type: DummyData", "type: Data").replace(
        "    dummy_data_param:\n      shape: [{dim: [4, 6]}, {dim: [4]}]\n      data_filler: "
        "[{type: gaussian}, {type: uniform, min: 0, max: 2.99}]\n",
        "    data_param: {source: nodb, batch_size: 2}\n"))
    (work / "solver.yaml").write_text(SOLVER.format(max_iter=4, display=2).replace(
        "snapshot_prefix: snaps/tiny", "snapshot_prefix: out/run/tiny"))
    result = CliRunner().invoke(cli, ["train", "--solver", "solver.yaml"])
    assert result.exit_code == 1 and "nodb: database not found" in result.stderr
    assert not (work / "out").exists()
