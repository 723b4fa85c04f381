"""--set KEY=VALUE on train, test and time; the resolved solver and net written beside the
snapshots, printed at start, and a run repeated from them."""
from __future__ import annotations

import yaml
from click.testing import CliRunner
from support import TINY_NET as NET
from support import TINY_SOLVER as SOLVER

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
    lines = first.stdout.splitlines()
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
    assert losses(again.stdout) == losses(first.stdout) and len(losses(first.stdout)) == 2


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
        assert (result.exit_code, result.stderr.strip()) == (1, message)
    result = run("time", "--model", "net.yaml", "--iterations", "1", "--set",
                 "net.ip.inner_product_param.num_output=7")
    assert result.exit_code == 0, result.output
    result = run("time", "--model", "net.yaml", "--set", "base_lr=1")
    assert (result.exit_code, result.stderr.strip()) == (
        1, "Error: --set base_lr: this command takes a net, so only net fields: --set "
           "net.LAYER.FIELD=VALUE")
