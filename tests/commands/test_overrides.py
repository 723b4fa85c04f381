"""--set KEY=VALUE on train, test and time; the resolved solver and net written beside the
snapshots, printed at start, and a run repeated from them."""
from __future__ import annotations

import yaml
from click.testing import CliRunner
from support import TINY_NET as NET
from support import TINY_SOLVER as SOLVER
from support import error_line

from caffe_py.cli import cli


def run(*args):
    return CliRunner().invoke(cli, list(args))


def losses(output: str) -> list[str]:
    return [line for line in output.splitlines() if "Train net output" in line]


def test_overrides_reach_the_run_and_the_resolved_files_repeat_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(NET)
    (tmp_path / "solver.yaml").write_text(SOLVER.replace("random_seed: 3", "random_seed: -1"))
    first = run("train", "--solver", "solver.yaml", "--set", "base_lr=0.02", "--set",
                "net.ip.inner_product_param.num_output=5", "--set", "max_iter=10")
    assert first.exit_code == 0, first.output
    lines = first.stderr.splitlines()
    seed = int(lines[lines.index(next(x for x in lines if x.startswith("Random seed: ")))]
               .split(": ")[1])
    assert "Initializing solver from parameters:" in lines
    assert "Initializing net from parameters:" in lines
    solver = yaml.safe_load((tmp_path / "snaps" / "tiny_solver.yaml").read_text())
    assert (solver["base_lr"], solver["max_iter"], solver["random_seed"], solver["net"]) == (
        0.02, 10, seed, "tiny_net.yaml")
    net = yaml.safe_load((tmp_path / "snaps" / "tiny_net.yaml").read_text())
    assert net["layer"][1]["inner_product_param"]["num_output"] == 5
    assert [line for line in lines if ", lr = " in line][0] == "Iteration 0, lr = 0.02"
    again = run("train", "--solver", "snaps/tiny_solver.yaml")
    assert again.exit_code == 0, again.output
    assert losses(again.stderr) == losses(first.stderr) and len(losses(first.stderr)) == 2


def test_bad_overrides_are_one_line_named_after_the_flag(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(NET)
    (tmp_path / "solver.yaml").write_text(SOLVER)
    cases = {
        "base_lr=abc": "Error: --set base_lr: expected a number, got 'abc'",
        "lr_policy=fixd": "Error: --set lr_policy: 'fixd' is not one of fixed, step, exp, inv, "
                          "multistep, poly, sigmoid; did you mean 'fixed'?",
        "net.nope.x=1": f"Error: --set net.nope.x: {tmp_path / 'net.yaml'} has no layer 'nope' "
                        "(its layers: data, ip, loss, acc)",
        "net.ip.inner_product_param.num_output=-3": "Error: --set net.ip.inner_product_param."
                                                    "num_output: -3 is below the minimum 0; use "
                                                    "a value >= 0",
        "foo": "Error: --set foo: expected KEY=VALUE (e.g. --set base_lr=0.05 or --set "
               "net.conv1.convolution_param.num_output=32)",
    }
    for flag, message in cases.items():
        result = run("train", "--solver", "solver.yaml", "--set", flag)
        assert (result.exit_code, error_line(result.stderr)) == (1, message)
    result = run("time", "--model", "net.yaml", "--iterations", "1", "--set",
                 "net.ip.inner_product_param.num_output=7")
    assert result.exit_code == 0, result.output
    result = run("time", "--model", "net.yaml", "--set", "base_lr=1")
    assert (result.exit_code, error_line(result.stderr)) == (
        1, "Error: --set base_lr: this command takes a net, so only net fields: --set "
           "net.LAYER.FIELD=VALUE")


PHASED_DATA = """\
name: phased
layer:
  - name: data
    type: DummyData
    top: [data, label]
    include: {phase: TRAIN}
    dummy_data_param: {shape: [{dim: [4, 6]}, {dim: [4]}]}
  - name: data
    type: DummyData
    top: [data, label]
    include: {phase: TEST}
    dummy_data_param: {shape: [{dim: [4, 6]}, {dim: [4]}]}
  - name: ip
    type: InnerProduct
    bottom: data
    top: ip
    inner_product_param: {num_output: 3, weight_filler: {type: xavier}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
"""


def resolved_net(tmp_path) -> dict:
    return yaml.safe_load((tmp_path / "snaps" / "tiny_net.yaml").read_text())


def test_a_name_two_layers_share_is_refused_until_one_is_picked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(PHASED_DATA)
    (tmp_path / "solver.yaml").write_text(SOLVER)
    key = "dummy_data_param.data_filler"
    result = run("train", "--solver", "solver.yaml", "--set", f"net.data.{key}={{type: xavier}}")
    assert (result.exit_code, error_line(result.stderr)) == (1, (
        f"Error: --set net.data.{key}: 2 layers of {tmp_path / 'net.yaml'} are named 'data' "
        f"(lines 3 and 8: TRAIN, TEST); pick one: net.data@TRAIN.{key} or "
        f"net.data@TEST.{key}"))
    assert not (tmp_path / "snaps").exists()
    result = run("train", "--solver", "solver.yaml", "--set",
                 f"net.data@TEST.{key}={{type: constant, value: 2}}", "--set", "max_iter=1")
    assert result.exit_code == 0, result.output
    train, test = resolved_net(tmp_path)["layer"][:2]
    assert "data_filler" not in train["dummy_data_param"]
    assert test["dummy_data_param"]["data_filler"] == {"type": "constant", "value": 2}
    result = run("train", "--solver", "solver.yaml", "--overwrite", "--set",
                 f"net.data@0.{key}={{type: constant, value: 1}}", "--set", "max_iter=1")
    assert result.exit_code == 0, result.output
    train, test = resolved_net(tmp_path)["layer"][:2]
    assert (train["dummy_data_param"]["data_filler"]["value"], "data_filler" in
            test["dummy_data_param"]) == (1, False)
    result = run("train", "--solver", "solver.yaml", "--set", f"net.data@2.{key}=[]")
    assert (result.exit_code, error_line(result.stderr)) == (1, (
        f"Error: --set net.data@2.{key}: {tmp_path / 'net.yaml'} has 2 layer(s) named 'data'; "
        "pick one of net.data@0 .. net.data@1"))


def test_list_indices_set_one_entry(tmp_path, monkeypatch):
    """net.ip.param.0.lr_mult=0 freezes ip's weights (the list made, and grown, as needed)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.yaml").write_text(NET)
    (tmp_path / "solver.yaml").write_text(SOLVER)
    result = run("train", "--solver", "solver.yaml", "--set", "net.ip.param.0.lr_mult=0",
                 "--set", "net.ip.param.1.decay_mult=0", "--set", "max_iter=3",
                 "--set", "snapshot_after_train=true")
    assert result.exit_code == 0, result.output
    assert resolved_net(tmp_path)["layer"][1]["param"] == [{"lr_mult": 0}, {"decay_mult": 0}]
    import caffe_py

    first = caffe_py.train_solver("solver.yaml", sets=["max_iter=0", "snapshot_prefix=zero/z",
                                                       "snapshot_after_train=true"])
    trained = caffe_py.load_net("net.yaml", weights="snaps/tiny_iter_3.pt", phase="TRAIN")
    assert trained.layer_blobs()["ip"][0].equal(first.net.layer_blobs()["ip"][0])
    assert not trained.layer_blobs()["ip"][1].equal(first.net.layer_blobs()["ip"][1])
    cases = {
        "stepvalue.2=5": "Error: --set stepvalue.2: 'stepvalue' has 0 entries; use an index up "
                         "to 0 (one past the end adds an entry)",
        "net.ip.inner_product_param.0.num_output=2": "Error: --set net.ip.inner_product_param."
                                                     "0.num_output: 'inner_product_param' holds "
                                                     "a block of fields, not a list; drop the "
                                                     "index 0",
        "net.ip.param.0.lr_mult=x": "Error: --set net.ip.param.0.lr_mult: expected a number, "
                                    "got 'x'",
    }
    for flag, message in cases.items():
        result = run("train", "--solver", "solver.yaml", "--overwrite", "--set", flag)
        assert (result.exit_code, error_line(result.stderr)) == (1, message)


def test_the_net_field_and_paths_on_the_command_line_are_from_here(tmp_path, monkeypatch):
    """--set net=other.yaml and --set snapshot_prefix=runs/x: relative to the current
    directory, not to the solver file's."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "net.yaml").write_text(NET)
    (tmp_path / "conf" / "solver.yaml").write_text(SOLVER)
    (tmp_path / "other.yaml").write_text(NET.replace("num_output: 3", "num_output: 4"))
    result = run("train", "--solver", "conf/solver.yaml", "--set", "net=other.yaml",
                 "--set", "snapshot_prefix=runs/other", "--set", "max_iter=1")
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "conf" / "runs").exists()
    solver = yaml.safe_load((tmp_path / "runs" / "other_solver.yaml").read_text())
    assert solver["snapshot_prefix"] == str(tmp_path / "runs" / "other")
    net = yaml.safe_load((tmp_path / "runs" / "other_net.yaml").read_text())
    assert net["layer"][1]["inner_product_param"]["num_output"] == 4
    result = run("train", "--solver", "conf/solver.yaml", "--set", "net=missing.yaml")
    assert (result.exit_code, error_line(result.stderr)) == (1, (
        f"Error: {tmp_path / 'missing.yaml'}: file not found; check the path (relative to the "
        "current directory)"))
