"""Broken specs through the real CLI: each gives one exact line on stderr and exit status 1.

``{f}`` in an expected message is the spec file's path. Most cases run in-process through
click's CliRunner (where the toy layers of conftest exist); a few run ``python cli.py net`` in
a subprocess to show the installed entry point behaves the same.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from caffe_py.cli import cli

pytestmark = pytest.mark.usefixtures("toy_layers")
ROOT = Path(__file__).resolve().parents[1]

HEAD = "name: bad\ninput: data\ninput_shape: {dim: [2, 3]}\nlayer:\n"
SCALE = "  - {name: s, type: ToyScale, bottom: data, top: s}\n"

CASES = {
    "unknown key": (
        HEAD + "  - {name: s, type: ToyScale, botom: data, top: s}\n",
        "{f}:5: layer[0].botom: unknown key 'botom' in a ToyScale layer; did you mean "
        "'bottom'?"),
    "unknown net key": (
        "name: bad\nlayers: []\n",
        "{f}:2: layers: unknown key 'layers' in NetParameter; did you mean 'layer'?"),
    "unknown key in a param block": (
        HEAD + SCALE + "  - name: c\n    type: Convolution\n    bottom: s\n    top: c\n"
        "    convolution_param: {num_ouput: 3, kernel_size: 1}\n",
        "{f}:10: layer[1].convolution_param.num_ouput: unknown key 'num_ouput' in "
        "ConvolutionParameter; did you mean 'num_output'?"),
    "misspelt layer type": (
        HEAD + "  - name: c\n    type: Convolutoin\n",
        "{f}:6: layer[0].type: unknown layer type 'Convolutoin'; did you mean 'Convolution'?"),
    "duplicate key": (
        HEAD + "  - name: s\n    type: ToyScale\n    name: t\n",
        "{f}:7: duplicate key 'name' (first at line 5); remove one of the two; a repeated field "
        "is a YAML list"),
    "wrong type": (
        HEAD + "  - {name: s, type: ToyScale, bottom: data, top: s, toy_param: {value: big}}\n",
        "{f}:5: layer[0].toy_param.value: expected a number, got 'big'"),
    "bad enum": (
        HEAD + "  - {name: p, type: Pooling, bottom: data, top: p, pooling_param: {pool: MAXX}}\n",
        "{f}:5: layer[0].pooling_param.pool: 'MAXX' is not one of MAX, AVE, STOCHASTIC; did you "
        "mean 'MAX'?"),
    "bad phase": (
        HEAD + "  - {name: s, type: ToyScale, bottom: data, top: s, include: {phase: TRAINING}}\n",
        "{f}:5: layer[0].include[0].phase: 'TRAINING' is not one of TRAIN, TEST; did you mean "
        "'TRAIN'?"),
    "below minimum": (
        HEAD + "  - name: ip\n    type: InnerProduct\n    bottom: data\n    top: ip\n"
        "    inner_product_param: {num_output: -1}\n",
        "{f}:9: layer[0].inner_product_param.num_output: -1 is below the minimum 0; use a "
        "value >= 0"),
    "param block nobody has": (
        HEAD + "  - name: c\n    type: Convolution\n    pooling_parm: {pool: MAX}\n",
        "{f}:7: layer[0].pooling_parm: unknown key 'pooling_parm' in a Convolution layer; did "
        "you mean 'convolution_param'?"),
    "include and exclude": (
        HEAD + "  - name: s\n    type: ToyScale\n    include: {phase: TRAIN}\n"
        "    exclude: {phase: TEST}\n",
        "{f}:8: layer[0].exclude: a layer takes include rules or exclude rules, not both (as in "
        "Caffe); keep one of them"),
    "missing type": (
        HEAD + "  - {name: s, bottom: data}\n",
        "{f}:5: layer[0]: the layer has no 'type'; add e.g. 'type: Convolution'"),
    "missing name": (
        HEAD + "  - {type: ToyScale, bottom: data, top: s}\n",
        "{f}:5: layer[0]: the ToyScale layer has no name; add 'name: <unique name>'"),
    "invalid YAML": (
        HEAD + "  - {name: s, type: ToyScale\n",
        "{f}:6: invalid YAML: expected ',' or '}}', but got '<stream end>'; check the "
        "indentation and quoting near this line"),
    "not a mapping": (
        "- just\n- a list\n",
        "{f}:1: a net spec is a mapping with 'name' and 'layer'"),
    "missing bottom": (
        HEAD + "  - {name: s, type: ToyScale, bottom: nothing, top: s}\n",
        "{f}:5: layer[0].bottom: Unknown bottom blob 'nothing' (layer 's', bottom index 0); "
        "name a top of an earlier layer in this phase (blobs so far: data)"),
    "misspelt bottom": (
        HEAD + "  - {name: s, type: ToyScale, bottom: data, top: scaled}\n"
        "  - {name: t, type: ToyScale, bottom: [scaeld], top: t}\n",
        "{f}:6: layer[1].bottom: Unknown bottom blob 'scaeld' (layer 't', bottom index 0); did "
        "you mean 'scaled'? (blobs so far: data, scaled)"),
    "bottom of the other phase": (
        HEAD + "  - {name: s, type: ToyScale, bottom: data, top: s, include: {phase: TEST}}\n"
        "  - {name: t, type: ToyScale, bottom: s, top: t}\n",
        "{f}:6: layer[1].bottom: Unknown bottom blob 's' (layer 't', bottom index 0): only "
        "layer 's' (line 5) produces it, and its include/exclude rules leave it out of the TRAIN "
        "net; make both layers belong to the same phases"),
    "two producers": (
        HEAD + SCALE + "  - {name: t, type: ToyScale, bottom: data, top: s}\n",
        "{f}:6: layer[1].top: layer 't' (ToyScale): Top blob 's' produced by multiple sources: "
        "layer 's' (line 5) already produces it; rename one of the tops; in place needs "
        "top[k] == bottom[k]"),
    "cycle": (
        HEAD + "  - {name: a, type: ToyScale, bottom: b, top: a}\n"
        "  - {name: b, type: ToyScale, bottom: a, top: b}\n",
        "{f}:5: layer[0].bottom: Unknown bottom blob 'b' (layer 'a', bottom index 0): only the "
        "later layer 'b' (line 6) produces it; a layer reads only blobs produced above it: "
        "move it below 'b' or break the cycle"),
    "shape mismatch (Eltwise)": (
        HEAD + SCALE + "  - {name: d, type: DummyData, top: d, dummy_data_param: "
        "{shape: {dim: [2, 4]}}}\n  - {name: e, type: Eltwise, bottom: [s, d], top: e}\n",
        "{f}:7: layer[2]: layer 'e' (Eltwise): {eltwise}"),
    "shape mismatch (toy)": (
        HEAD + SCALE + "  - {name: d, type: ToySource, top: d, toy_param: {shape: [3, 3]}}\n"
        "  - {name: add, type: ToyAdd, bottom: [s, d], top: e}\n",
        "{f}:7: layer[2]: layer 'add' (ToyAdd): bottom 'd' (index 1) has shape [3, 3] but "
        "bottom 0 has [2, 3]; give equal shapes"),
    "propagate_down count": (
        HEAD + "  - {name: s, type: ToyScale, bottom: data, top: s, "
        "propagate_down: [true, false]}\n",
        "{f}:5: layer[0].propagate_down: layer 's' (ToyScale): propagate_down has 2 entries for "
        "1 bottoms; give one per bottom, or none"),
    "loss_weight count": (
        HEAD + "  - {name: l, type: ToyLoss, bottom: data, top: l, loss_weight: [1, 2]}\n",
        "{f}:5: layer[0].loss_weight: layer 'l' (ToyLoss): loss_weight has 2 entries for 1 tops; "
        "give one per top, or none"),
    "mismatched shared lr_mult": (
        HEAD + "  - {name: a, type: ToyScale, bottom: data, top: a, param: {name: w, lr_mult: 1}}"
        "\n  - {name: b, type: ToyScale, bottom: data, top: b, param: {name: w, lr_mult: 2}}\n",
        "{f}:6: layer[1].param: layer 'b' (ToyScale): Shared param 'w' has mismatched lr_mult: "
        "2 here, 1 in the owner layer 'a'; set the same lr_mult on every sharer, or set it only "
        "on the owner"),
    "legacy input_dim": (
        "name: bad\ninput: data\ninput_dim: [1, 2, 3]\n",
        "{f}:1: 1 input(s) need 4 input_dim values, got 3; give input_shape (one per input) or "
        "4 input_dim per input"),
    "missing database": (
        "name: bad\nlayer:\n  - name: mnist\n    type: Data\n    top: [data, label]\n"
        "    data_param: {source: ../data/fashion_mnist/train_lmdb, batch_size: 4}\n",
        "{f}:3: layer[0]: layer 'mnist' (Data): database {db} does not exist, so its record "
        "shape is unknown; give it, e.g. cpy net --input-shape data=C,H,W (or create the "
        "database)"),
}


def expected(case: str, path: Path) -> str:
    from caffe_py.layers import registry
    message = CASES[case][1]
    eltwise = ""
    if "{eltwise}" in message:  # the Eltwise layer's own words, checked in its own tests
        from caffe_py.errors import NetError
        from caffe_py.layers.base import BuildContext
        from caffe_py.spec.net_spec import LayerParameter
        spec = LayerParameter(name="e", type="Eltwise", bottom=["s", "d"], top=["e"])
        spec.params = {"eltwise_param": registry.lookup("Eltwise").params["eltwise_param"]()}
        with pytest.raises(NetError) as err:
            registry.lookup("Eltwise")(spec, [(2, 3), (2, 4)], BuildContext())
        eltwise = str(err.value).split("(Eltwise): ", 1)[1]
    db = path.parent.parent / "data" / "fashion_mnist" / "train_lmdb"
    return message.format(f=path, eltwise=eltwise, db=db)


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "configs").mkdir(exist_ok=True)
    path = tmp_path / "configs" / "bad.yaml"
    path.write_text(text)
    return path


def test_the_table_is_big_enough():
    assert len(CASES) >= 20


@pytest.mark.parametrize("case", list(CASES))
def test_cli_reports_one_line(case, tmp_path):
    path = write(tmp_path, CASES[case][0])
    result = CliRunner().invoke(cli, ["net", str(path)])
    assert result.exit_code == 1, result.output
    assert result.stderr == f"Error: {expected(case, path)}\n"
    assert "Traceback" not in result.output and result.exception.__class__ is SystemExit


def test_python_tag_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"
    path = write(tmp_path, f"name: !!python/object/apply:os.system ['touch {marker}']\n")
    result = CliRunner().invoke(cli, ["net", str(path)])
    assert (result.exit_code, result.stderr) == (1, (
        f"Error: {path}:1: tag 'tag:yaml.org,2002:python/object/apply:os.system' is not allowed;"
        " specs are plain data; remove the tag\n"))
    assert not marker.exists()


def test_missing_file():
    result = CliRunner().invoke(cli, ["net", "no/such/net.yaml"])
    assert (result.exit_code, result.stderr) == (
        1, "Error: no/such/net.yaml: file not found; check the path (relative to the current "
           "directory)\n")


# --- the same through `python cli.py net` in a subprocess (no toy layers there) ------------
SUBPROCESS = {
    "python tag": (
        "name: !!python/object/apply:os.system ['touch {marker}']\n",
        "{f}:1: tag 'tag:yaml.org,2002:python/object/apply:os.system' is not allowed; specs are "
        "plain data; remove the tag"),
    "cycle": (
        "name: bad\nlayer:\n  - {name: a, type: Eltwise, bottom: [b, b], top: a}\n"
        "  - {name: b, type: DummyData, top: b, dummy_data_param: {shape: {dim: [1]}}}\n",
        "{f}:3: layer[0].bottom: Unknown bottom blob 'b' (layer 'a', bottom index 0): only the "
        "later layer 'b' (line 4) produces it; a layer reads only blobs produced above it: "
        "move it below 'b' or break the cycle"),
    "missing database": (CASES["missing database"][0], CASES["missing database"][1]),
}


@pytest.mark.parametrize("case", list(SUBPROCESS))
def test_subprocess_reports_one_line(case, tmp_path):
    marker = tmp_path / "pwned"
    text, message = SUBPROCESS[case]
    path = write(tmp_path, text.replace("{marker}", str(marker)))
    run = subprocess.run([sys.executable, "cli.py", "net", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    db = tmp_path / "data" / "fashion_mnist" / "train_lmdb"
    assert (run.returncode, run.stdout, run.stderr) == (
        1, "", f"Error: {message.format(f=path, db=db)}\n")
    assert not marker.exists()
