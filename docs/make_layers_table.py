"""Write docs/layers.md: every BVLC Caffe 1.0 layer type, its parameter fields with their status
in caffe-py, and the golden comparison with Caffe per type.

Run from the repository root (it reads Caffe's caffe.proto for the fields caffe-py lacks, the
spec's table for the ones it has, and the golden fixtures for the errors)::

    PYTHONPATH=$PWD python docs/make_layers_table.py [--proto PATH/caffe.proto]

(``--proto`` defaults to /opt/caffe-src/caffe/src/caffe/proto/caffe.proto.)
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "golden")]

from test_golden import NOT_COMPARED  # noqa: E402

from caffe_py.layers import registry  # noqa: E402
from caffe_py.spec import layer_params  # noqa: E402
from caffe_py.spec.layer_params.forks import BVLC_TYPES, REPOSITORIES, forks_of  # noqa: E402
from caffe_py.spec.net_spec import LayerParameter  # noqa: E402
from caffe_py.spec.schema import field_names  # noqa: E402

# The blocks Caffe's layers read, for the BVLC types caffe-py does not have (the others: the
# spec's table).
CAFFE_BLOCKS = {
    "HDF5Data": ["hdf5_data_param"], "HDF5Output": ["hdf5_output_param"],
    "ImageData": ["image_data_param", "transform_param"],
    "MemoryData": ["memory_data_param", "transform_param"],
    "WindowData": ["window_data_param", "transform_param"],
}

_ONE_IMPL = "ignored: one implementation (PyTorch's)"
# (message, field) -> status, where it is not plain "supported".
NOTES = {
    ("ConvolutionParameter", "engine"): _ONE_IMPL,
    ("ConvolutionParameter", "force_nd_im2col"): "ignored: picks Caffe's im2col code path, "
                                                 "not the result",
    ("PoolingParameter", "engine"): _ONE_IMPL,
    ("LRNParameter", "engine"): _ONE_IMPL,
    ("SPPParameter", "engine"): _ONE_IMPL,
    ("SoftmaxParameter", "engine"): _ONE_IMPL,
    ("ReLUParameter", "engine"): "supported: picks the backend (docs/kernels.md)",
    ("SigmoidParameter", "engine"): "supported: picks the backend (docs/kernels.md)",
    ("TanHParameter", "engine"): "supported: picks the backend (docs/kernels.md)",
    ("ELUParameter", "engine"): "caffe-py's own: picks the backend (docs/kernels.md)",
    ("EltwiseParameter", "stable_prod_grad"): "ignored: PROD's gradient is always the stable "
                                              "product of the other bottoms (Caffe's false "
                                              "form, top / bottom, differs only where a "
                                              "bottom is 0)",
    ("PythonParameter", "share_in_parallel"): "ignored (deprecated in Caffe)",
    ("DropoutParameter", "scale_train"): "caffe-py's own (the Fast R-CNN fork's): false "
                                         "scales by 1 - ratio in TEST instead of "
                                         "1 / (1 - ratio) in TRAIN",
    ("LayerParameter", "blobs"): "not supported: weights come from a .caffemodel or a "
                                 "snapshot (--weights)",
    ("ConvolutionParameter", "hole"): "caffe-py's own (DeepLab v1's fork): read as dilation",
    ("ConvolutionParameter", "hole_h"): "caffe-py's own (DeepLab v1's fork): dilation along H",
    ("ConvolutionParameter", "hole_w"): "caffe-py's own (DeepLab v1's fork): dilation along W",
    ("LossParameter", "pre_fixed_normalizer"): "caffe-py's own (R-FCN's fork): the divisor of "
                                               "normalization PRE_FIXED",
    ("LossParameter", "weight_by_label_freqs"): "caffe-py's own (SegNet's fork): "
                                                "SoftmaxWithLoss weights each position by "
                                                "its label's class_weighting",
    ("LossParameter", "class_weighting"): "caffe-py's own (SegNet's fork)",
    ("SegAccuracyParameter", "metric"): "ignored: read but unused by the fork (the top always "
                                        "holds all three metrics)",
    ("LabelSpecificAddParameter", "transform_test"): "ignored: without effect in the fork",
    ("DenseImageDataParameter", "mean_file"): "ignored: read but unused by the fork "
                                              "(transform_param's mean applies)",
    ("BNParameter", "engine"): "ignored: one implementation",
}


def proto_messages(text: str) -> dict[str, list[str]]:
    """Message name -> its field names, in order (nested enums skipped)."""
    out: dict[str, list[str]] = {}
    for match in re.finditer(r"^message (\w+) \{", text, re.M):
        depth, i = 1, match.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        body = re.sub(r"//[^\n]*", "", text[match.end():i - 1])
        body = re.sub(r"\benum \w+ \{[^}]*\}", "", body)
        out[match.group(1)] = re.findall(
            r"\b(?:optional|repeated|required)\s+[\w.]+\s+(\w+)\s*=", body)
    return out


def block_messages(text: str) -> dict[str, str]:
    """LayerParameter's block key -> its message name (e.g. 'pooling_param' -> ...)."""
    return dict((key, name) for name, key in re.findall(
        r"optional (\w+Parameter) (\w+_param) = \d+;", text))


def field_rows(message: str, ours: type | None, proto: dict[str, list[str]]) -> list[str]:
    caffe = proto.get(message, [])
    mine = field_names(ours) if ours is not None else []
    rows = []
    for name in caffe + [n for n in mine if n not in caffe]:
        if (message, name) in NOTES:
            status = NOTES[(message, name)]
        elif name not in mine:
            status = "not supported"
        elif name not in caffe:
            status = "caffe-py's own"
        else:
            status = "supported"
        rows.append(f"| `{name}` | {status} |")
    return rows


def golden_summary() -> dict[str, tuple[int, float]]:
    """Type -> (cases, largest error) from the golden fixtures."""
    from test_golden import CASES, run_case  # the same comparison as the tests
    out: dict[str, tuple[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for type_name, case in CASES:
            errors = run_case(type_name, case, Path(tmp))
            n, worst = out.get(type_name, (0, 0.0))
            out[type_name] = (n + 1, max([worst, *errors.values()]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--proto", default="/opt/caffe-src/caffe/src/caffe/proto/caffe.proto")
    args = parser.parse_args()
    text = Path(args.proto).read_text()
    proto, blocks = proto_messages(text), block_messages(text)
    golden = golden_summary()
    lines = [HEAD, "| type | in caffe-py | module | blocks | golden cases | max error |",
             "|---|---|---|---|---|---|"]
    for type_name in sorted(BVLC_TYPES, key=str.lower):
        ours = layer_params.LAYER_PARAMS.get(type_name)
        keys = list(ours) if ours is not None else CAFFE_BLOCKS.get(type_name, [])
        module = (registry.lookup(type_name).__module__.replace(".", "/") + ".py"
                  if ours is not None else "-")
        n, err = golden.get(type_name, (0, None))
        proof = f"{n}" if n else "-"
        lines.append(f"| [{type_name}](#{type_name.lower()}) | "
                     f"{'yes' if ours is not None else 'not yet'} | {module} | "
                     f"{', '.join(keys) or '-'} | {proof} | "
                     f"{f'{err:.1e}' if err is not None else '-'} |")
    lines += ["", NOT_COMPARED_NOTE, *[f"- {t}: {why}." for t, why in
                                      sorted(NOT_COMPARED.items())], "", COMMON, "",
              "| field | status |", "|---|---|",
              *[row for row in field_rows("LayerParameter", LayerParameter, {
                  "LayerParameter": [n for n in proto["LayerParameter"]
                                     if not n.endswith("_param")]})
                if not row.startswith("| `params`")], ""]
    for type_name in sorted(BVLC_TYPES, key=str.lower):
        ours = layer_params.LAYER_PARAMS.get(type_name)
        keys = list(ours) if ours is not None else CAFFE_BLOCKS.get(type_name, [])
        lines += [f"### {type_name}", ""]
        if ours is None:
            lines += ["Not in caffe-py yet: a net using it fails to load, naming it.", ""]
        if not keys:
            lines += ["No parameter block.", ""]
        for key in keys:
            lines += [f"`{key}` ({blocks[key]}):", "", "| field | status |", "|---|---|",
                      *field_rows(blocks[key], ours.get(key) if ours else None, proto), ""]
    lines += fork_lines()
    lines.append(TAIL)
    (ROOT / "docs" / "layers.md").write_text("\n".join(lines))


def fork_proofs() -> dict[str, str]:
    """Type -> how it is proven: its fork's fixtures (cases, largest error), its data batches,
    or the test module of its plain reference."""
    sys.path.insert(0, str(ROOT / "tests" / "golden" / "forks"))
    from test_fork_golden import DATA_CASES, DATA_TYPES, FORK_REFERENCES, OTHER_PROOFS, summary

    out: dict[str, str] = {}
    for (fork, type_name), (n, err) in sorted(summary().items()):
        proof = f"{n} cases against {fork}'s fork, max error {err:.1e}"
        out[type_name] = f"{out[type_name]}; {proof}" if type_name in out else proof
    for type_name, fork in DATA_TYPES.items():
        n = sum(c["layer"]["type"] == type_name for c in DATA_CASES[fork].values())
        out[type_name] = f"{n} batch sequences against {fork}'s fork, equal"
    for type_name, module in FORK_REFERENCES.items():
        out[type_name] = f"reference from the fork's source ({module})"
    for type_name, (fork, what, module) in OTHER_PROOFS.items():
        out[type_name] = f"{what} against {fork}'s fork ({module})"
    return out


def fork_lines() -> list[str]:
    """The section of the forks' types caffe-py has: the table, then each type's fields."""
    ours = sorted((t for t in layer_params.LAYER_PARAMS if t not in BVLC_TYPES
                   and registry.lookup(t).__module__.startswith("caffe_py.layers.")),
                  key=str.lower)
    proofs = fork_proofs()
    lines = ["", FORK_HEAD, "", "| type | forks (repository) | module | blocks | proof |",
             "|---|---|---|---|---|"]
    for type_name in ours:
        forks = ", ".join(f"{f} ({REPOSITORIES[f]})" for f in forks_of(type_name))
        module = registry.lookup(type_name).__module__.replace(".", "/") + ".py"
        blocks = ", ".join(layer_params.LAYER_PARAMS[type_name]) or "-"
        lines.append(f"| [{type_name}](#{type_name.lower()}) | {forks} | {module} | {blocks} | "
                     f"{proofs.get(type_name, '-')} |")
    lines.append("")
    for type_name in ours:
        cls = registry.lookup(type_name)
        lines += [f"### {type_name}", "", (cls.__doc__ or "").strip().split("\n\n")[0], ""]
        blocks = layer_params.LAYER_PARAMS[type_name]
        if not blocks:
            lines += ["No parameter block.", ""]
        for key, message in blocks.items():
            rows = [f"| `{name}` | {NOTES.get((message.__name__, name), 'supported')} |"
                    for name in field_names(message)]
            lines += [f"`{key}` ({message.__name__}):", "", "| field | status |", "|---|---|",
                      *rows, ""]
    return lines


HEAD = """# Layers

Every layer type of BVLC Caffe 1.0 (`src/caffe/layers`, and `Python` from
`layer_factory.cpp`), whether caffe-py has it, the module that implements it, the parameter
blocks it reads and the status of each of their fields. "Golden cases" counts the fixtures
that compare caffe-py with the genuine Caffe for the type (see [Proof against
Caffe](#proof-against-caffe)); "max error" is the largest error over every array of those
cases. A field is *supported* (read and honoured, with Caffe's default), *ignored* (accepted
and without effect, with the reason), *caffe-py's own* (not in Caffe's proto) or *not
supported* (an unknown key: the spec is refused, naming it).

This page is written by `PYTHONPATH=$PWD python docs/make_layers_table.py` (it reads Caffe's
caffe.proto, caffe-py's spec table and the golden fixtures); change the script, not the page.

## Types
"""

FORK_HEAD = """## Types of Caffe forks

Layer types BVLC Caffe never had, from the forks of Caffe that published nets use, each with its
fork's semantics (forward, and backward where the fork has one; its module's docstring says
how). Two forks that use one name for two layers (`BN`, `Upsample`) are told apart by the
fields the layer writes (or its bottoms), and a layer that fits neither is an error naming
both. "Proof": the genuine fork's fixtures (`tests/golden/forks`: the fork built by
`tools/oracles/build_fork.sh` or `tools/oracles/ssd`, run on seeded inputs; for Faster
R-CNN's and R-FCN's GPU-only layers, the forks' own CUDA kernels compiled for the CPU; the
cases and the largest error, 1e-5 at most) or, for a fork not built here, the test module that
holds the type to a plain reference written from the fork's source and a float64 gradcheck.
Where a fork's backward is not the exact derivative of its forward, caffe-py computes the
fork's (SSD's Normalize with one scale per channel, MultiBoxLoss's
`encode_variance_in_target`, a one-weight SmoothL1Loss, ROIPooling's inverted regions;
[detection.md](detection.md) lists them). Fork fields on BVLC types (DeepLab
v1's `convolution_param.hole`, a fork's `pooling_param.ceil_mode`, Faster R-CNN's
`dropout_param.scale_train`, R-FCN's `loss_param.pre_fixed_normalizer`, SegNet's
`loss_param.class_weighting`) are in those types' tables above."""

NOT_COMPARED_NOTE = "Types with no golden case:"

COMMON = """## Fields every layer has (LayerParameter)

Plus the type's own blocks below. A block that does not apply to the layer's type is an
error naming the blocks the type takes."""

TAIL = """
## Python layers

`type: Python` with `python_param {module, layer, param_str}` runs a class of the user's:

- **Caffe's form** (pycaffe's `caffe.Layer`): `setup(bottom, top)`, `reshape(bottom, top)`,
  `forward(bottom, top)`, `backward(top, propagate_down, bottom)` over blobs whose `.data` and
  `.diff` are numpy arrays (`.reshape(*shape)`, `.shape`, `.count`, `.num` ...). Existing files
  run unchanged: when pycaffe is not imported in the process, `import caffe` gets caffe-py's
  stand-in (`caffe_py/layers/pycaffe.py`: `Layer`, `TRAIN`, `TEST`). `self.param_str` and
  `self.phase` (0 TRAIN, 1 TEST) are set before `setup`; `self.blobs.add_blob(*shape)` adds a
  learnable blob (trained, saved in snapshots, its diff accumulating as in Caffe). caffe-py
  calls `setup` and `reshape` when the net is built and `reshape` then `forward` at each
  forward, as Caffe does; the class's `backward` is wired into autograd, with `propagate_down`
  telling which bottoms need a gradient. Each call copies the bottoms to numpy and the tops
  back (to the net's device).
- **torch-native form** (`caffe_py.layers.python.TorchLayer`): `setup(bottom_shapes)` returns
  the top shapes, `forward(*bottoms)` takes and returns tensors under autograd, on the net's
  device, with no copy and no hand-written backward; `self.add_blob(shape, filler)` adds a
  blob. The fast form for new layers.

```python
from caffe_py.layers.python import TorchLayer

class ChannelScale(TorchLayer):
    def setup(self, bottom_shapes):               # [(N, C, H, W)] -> top shapes
        self.add_blob((bottom_shapes[0][1],), {"type": "constant", "value": 1.0})
        return [bottom_shapes[0]]

    def forward(self, x):
        return x * self.blobs[0].view(1, -1, 1, 1)
```

The module is imported from `sys.path` (PYTHONPATH, as Caffe's embedded interpreter) and,
failing that, from the spec file's directory (then added to the end of `sys.path`). A module
that does not import, a missing class and an exception in the class's code are one error
naming the layer, the module and the file and line where it was raised.

## Types caffe-py does not have

A net that uses types caffe-py lacks fails to load with one error naming every such type and
the lines using it. A type of a known Caffe fork is named with its fork ("'MKLBatchNorm' is a
layer of Intel's Caffe fork, not of BVLC Caffe; use BatchNorm followed by Scale with
bias_term: true, or port it as a Python layer"), read from the forks' sources: SSD, SegNet,
Fast/Faster R-CNN, R-FCN, PSPNet, DeepLab v2, OpenPose (CPM), FlowNet 2.0, NVIDIA's NVCaffe,
Intel's Caffe, SphereFace, center loss, AM-Softmax, ShuffleNet, caffe-mobilenet, SENet,
DepthwiseConvolution and MobileNet-YOLO (`caffe_py/spec/layer_params/forks.py`). A near miss
of a caffe-py type gets a did-you-mean.

## Proof against Caffe

`tests/golden/make_golden.py` runs the genuine BVLC Caffe 1.0 (pycaffe, CPU) on every case of
`tests/golden/cases.py`: seeded bottoms and blobs, a forward, seeded top diffs, a backward.
It writes the tops, the bottoms' and blobs' gradients and the blobs after the pass to
`tests/golden/fixtures/<Type>.npz` (committed, about 0.5 MB). Regenerate them with Caffe built
by `../shared/caffe/build_caffe.sh` into /opt/caffe:

    GLOG_minloglevel=2 PYTHONPATH=/opt/caffe/python:$PWD python tests/golden/make_golden.py

`tests/golden/test_golden.py` (CI; it never runs Caffe) builds each case's layer in caffe-py
with the same blobs and compares everything in float32. The error of an array is
max|caffe-py - Caffe| / max(max|Caffe|, 1e-6); each must be at most 1e-5.
`python tests/golden/test_golden.py` prints the largest error per type and where it occurs.
"""


if __name__ == "__main__":
    main()
