"""Untrusted specs and files, as an attacker or an unlucky colleague on a shared machine would
hand them over: snapshot zips that would make a check inflate gigabytes, prototxts nested
hundreds deep, planted symlinks, tables that are not UTF-8, overrides of list fields, specs
whose sizes ask the allocator for petabytes, and specs of a million layers. Each is one line
on stderr (exit 1) or a clean run, quickly; never a traceback or a hang."""
from __future__ import annotations

import copy
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import pytest
import torch
import yaml
from support import ROOT, error_line, log_lines, tiny_net

from caffe_py.errors import SolverError
from caffe_py.solver import snapshot as snap


def cpy(cwd, *args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "cli.py"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    """The command failed with exit 1 and one line, 'Error: ...', ending stderr (after the
    log lines), no traceback."""
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    return error_line(done.stderr)


# --- snapshot zips ---------------------------------------------------------------------------
def rezipped(path: Path, extra: list[tuple[str, bytes, int]] = (),
             directory=None) -> bytes:
    """``path`` (a torch.save zip) with the local records ``extra`` (name, stored payload,
    compression method) appended after its own, and a central directory of
    ``directory(entries)`` where ``entries`` lists (name, offset, method, crc, compressed
    size, size) for every record."""
    with zipfile.ZipFile(path) as archive:
        infos = archive.infolist()
        body = path.read_bytes()[:archive.start_dir]
    entries = [(i.filename, i.header_offset, i.compress_type, i.CRC, i.compress_size,
                i.file_size) for i in infos]
    for name, (payload, size, crc), method in ((n, p, m) for n, p, m in extra):
        entries.append((name, len(body), method, crc, len(payload), size))
        body += struct.pack(zipfile.structFileHeader, b"PK\x03\x04", 20, 0, 0, method, 0, 0,
                            crc, len(payload), size, len(name), 0) + name.encode() + payload
    entries = directory(entries) if directory else entries
    start, central = len(body), b""
    for name, offset, method, crc, csize, size in entries:
        central += struct.pack(zipfile.structCentralDir, b"PK\x01\x02", 20, 3, 20, 0, 0,
                               method, 0, 0, crc, csize, size, len(name), 0, 0, 0, 0, 0,
                               offset) + name.encode()
    return body + central + struct.pack(zipfile.structEndArchive, b"PK\x05\x06", 0, 0,
                                        len(entries), len(entries), len(central), start, 0)


def deflated_zeros(mib: int) -> tuple[bytes, int, int]:
    """(the deflate stream of ``mib`` MiB of zeros, its size, its CRC-32)."""
    squeeze, chunk, crc = zlib.compressobj(9, zlib.DEFLATED, -15), bytes(1 << 20), 0
    out = b"".join(squeeze.compress(chunk) for _ in range(mib)) + squeeze.flush()
    for _ in range(mib):
        crc = zlib.crc32(chunk, crc)
    return out, mib << 20, crc


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "w_iter_2.pt"
    snap.save_weights({"ip": [torch.ones(3, 6), torch.zeros(3)]}, path)
    return path


@pytest.mark.slow
def test_a_zip_bomb_snapshot_is_refused_before_anything_is_inflated(tmp_path, weights):
    """5,000 directory entries naming one deflated 64 MiB record (320 GiB to inflate): the
    checksum check used to inflate every one, hanging --weights, --snapshot and --snapshot
    latest; torch.load never reads them. Refused from the directory alone, at once."""
    bomb = deflated_zeros(64)

    def many(entries):
        record = entries[-1]
        return entries[:-1] + [(f"archive/junk/{k}", *record[1:]) for k in range(5000)]

    weights.write_bytes(rezipped(weights, [("archive/junk/0", bomb, zipfile.ZIP_DEFLATED)],
                                 many))
    state = tmp_path / "w_iter_2.solverstate.pt"
    state.write_bytes(weights.read_bytes())
    (tmp_path / "net.yaml").write_text(tiny_net())
    (tmp_path / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.1\nmax_iter: 4\n"
                                          "snapshot_prefix: w\n")
    why = "its zip directory is not torch.save's (record 'archive/junk/0' is compressed)"
    fix = ("the file is damaged or was not written by caffe-py: use an earlier snapshot, or "
           "give a file written by cpy train")
    done = cpy(tmp_path, "test", "--model", "net.yaml", "--weights", weights.name,
               "--iterations", "1", timeout=60)
    assert one_line_error(done) == f"Error: {weights.name}: {why}; {fix}"
    done = cpy(tmp_path, "train", "--solver", "solver.yaml", "--snapshot", state.name,
               timeout=60)
    assert one_line_error(done) == f"Error: {state.name}: {why}; {fix}"
    done = cpy(tmp_path, "train", "--solver", "solver.yaml", "--snapshot", "latest",
               timeout=60)
    assert one_line_error(done) == (f"Error: --snapshot latest: no solver state of "
                                    f"snapshot_prefix {tmp_path / 'w'} loads (1 found); start "
                                    "without --snapshot")


@pytest.mark.parametrize("case", ["twice", "overlap", "past the end"])
def test_a_snapshot_zip_torch_save_would_not_write_is_refused(weights, case):
    with zipfile.ZipFile(weights) as archive:
        offset = archive.getinfo("archive/data/0").header_offset

    def twice(entries):
        return entries + [e for e in entries if e[0] == "archive/data/0"]

    def overlap(entries):  # another name for the same record
        return entries + [("archive/extra", *e[1:]) for e in entries
                          if e[0] == "archive/data/0"]

    def past_the_end(entries):
        return [(*e[:4], 4_000_000_000, 4_000_000_000) if e[0] == "archive/data/0" else e
                for e in entries]

    edit = {"twice": twice, "overlap": overlap, "past the end": past_the_end}[case]
    weights.write_bytes(rezipped(weights, directory=edit))
    why = {"twice": "record 'archive/data/0' is named twice",
           "overlap": "records 'archive/data/0' and 'archive/extra' overlap",
           "past the end": f"record 'archive/data/0' claims 4,000,000,000 bytes at offset "
                           f"{offset:,} of a {weights.stat().st_size:,}-byte file"}[case]
    with pytest.raises(SolverError) as caught:
        snap.load_weights(weights)
    assert str(caught.value) == (
        f"{weights}: its zip directory is not torch.save's ({why}); the file is damaged or "
        "was not written by caffe-py: use an earlier snapshot, or give a file written by cpy "
        "train")


# --- files planted at a run's names -----------------------------------------------------------
def test_a_symlink_planted_at_the_metrics_table_is_not_followed(tmp_path):
    (tmp_path / "net.yaml").write_text(tiny_net())
    (tmp_path / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.1\nmax_iter: 2\n"
                                          "snapshot_prefix: snaps/tiny\n")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "snaps").mkdir()
    table = tmp_path / "snaps" / "tiny_metrics.csv"
    table.symlink_to(victim)
    line = one_line_error(cpy(tmp_path, "train", "--solver", "solver.yaml"))
    assert line == (f"Error: {table} is a symbolic link; the metrics table is not written "
                    "through one (it could overwrite any file it points to): remove the link")
    assert victim.read_text() == "precious\n"
    assert table.is_symlink()


@pytest.mark.parametrize("name, content, problem", [
    ("latin1_metrics.csv", b"iteration,seconds,phase,lr,loss\n1,0.5,train,0.01,2.3\n"
                           b"2,1.0,train,0.01,1.9 \xe9t\xe9\n",
     "latin1_metrics.csv: not UTF-8 text; give the <snapshot_prefix>_metrics.csv a run wrote"),
    ("float_metrics.csv", b"iteration,seconds,phase,lr,loss\n1,0.5,train,0.01,2.3\n"
                          b"2.5,1.0,train,0.01,1.9\n",
     "float_metrics.csv:3: column 'iteration' holds '2.5', not an integer; the table is "
     "damaged or not a metrics table"),
    ("word_metrics.csv", b"iteration,seconds,phase,lr,loss\n1,0.5,train,0.01,lots\n",
     "word_metrics.csv:2: column 'loss' holds 'lots', not a number; the table is damaged or "
     "not a metrics table"),
    ("run.log", b"I1127 15:13:10.869346 10223 solver.py:280] Solving x\n"
                b"I1127 15:13:11.000000 10223 solver.py:453] Iteration 5, loss = ...\n",
     "run.log:2: the numbers of this line do not read ('I1127 15:13:11.000000 10223 "
     "solver.py:453] Iteration 5, loss'); the log is damaged"),
])
def test_cpy_plot_on_a_damaged_table_or_log_is_one_line(tmp_path, name, content, problem):
    (tmp_path / name).write_bytes(content)
    line = one_line_error(cpy(tmp_path, "plot", name, "-o", "curves.png"))
    assert line == f"Error: {problem}"
    assert not (tmp_path / "curves.png").exists()


@pytest.mark.parametrize("param", ["", "    param: [{lr_mult: 1}, {lr_mult: 2}]\n"])
def test_a_list_index_in_set_runs(tmp_path, param):
    """--set net.ip.param.0.lr_mult=0, with the layer's param list absent or written: it
    used to be an AttributeError traceback (a block made for the index lacked its marks); now
    the run takes it (list indices in --set)."""
    (tmp_path / "net.yaml").write_text(tiny_net().replace(
        "    inner_product_param:", param + "    inner_product_param:"))
    (tmp_path / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.1\nmax_iter: 2\n"
                                          "snapshot_prefix: snaps/tiny\n")
    done = cpy(tmp_path, "train", "--solver", "solver.yaml",
               "--set", "net.ip.param.0.lr_mult=0")
    assert done.returncode == 0, done.stderr[-2000:]
    resolved = yaml.safe_load((tmp_path / "snaps" / "tiny_net.yaml").read_text())
    ip = next(layer for layer in resolved["layer"] if layer["name"] == "ip")
    assert ip["param"][0]["lr_mult"] == 0


# --- what a spec can make the tools print or parse ----------------------------------------------
def test_suggested_commands_are_quoted_for_the_shell(tmp_path):
    """A solver prototxt naming its net '$(touch PWNED) x.prototxt': the note's command, pasted
    into a shell, runs cpy and nothing else."""
    (tmp_path / "solver.prototxt").write_text('net: "$(touch PWNED) x.prototxt"\n'
                                              "base_lr: 0.1\nmax_iter: 10\n")
    done = cpy(tmp_path, "import-prototxt", "solver.prototxt", "solver.yaml")
    assert done.returncode == 0, done.stderr
    note = next(line for line in done.stderr.splitlines() if "import it too: " in line)
    suggested = note.split("import it too: ", 1)[1]
    assert suggested == ("cpy import-prototxt '$(touch PWNED) x.prototxt' "
                         "'$(touch PWNED) x.yaml'")
    subprocess.run(["bash", "-c", suggested.replace("cpy ", f"{sys.executable} "
                                                           f"{ROOT / 'cli.py'} ", 1)],
                   cwd=tmp_path, capture_output=True, timeout=60)
    assert not (tmp_path / "PWNED").exists()
    # a Data layer's top named by the spec, in cpy net's suggestion of --input-shape
    (tmp_path / "net.yaml").write_text(tiny_net(data="""\
  - name: data
    type: Data
    top: ["$(touch PWNED)", label]
    data_param: {source: missing_db, batch_size: 2}
""").replace("bottom: data", "bottom: $(touch PWNED)"))
    line = one_line_error(cpy(tmp_path, "net", "net.yaml"))
    assert line.endswith("give it, e.g. cpy net --input-shape '$(touch PWNED)=C,H,W' (or "
                         "create the database)")


@pytest.mark.parametrize("command", ["import-prototxt", "net", "draw"])
def test_a_prototxt_nested_hundreds_deep_is_one_line(tmp_path, command):
    depth = 400
    (tmp_path / "deep.prototxt").write_text(
        'name: "deep"\nlayer {\n  name: "a"\n  type: "ReLU"\n' + "relu_param { " * depth
        + "} " * depth + "\n}\n")
    args = {"import-prototxt": ["deep.yaml"], "net": [], "draw": ["-o", "deep.dot"]}[command]
    line = one_line_error(cpy(tmp_path, command, "deep.prototxt", *args))
    assert line == ("Error: deep.prototxt:5:1299: blocks nested deeper than 100 levels, not "
                    "a spec; a net or solver nests a few levels; check the braces")


# --- specs that ask the allocator for petabytes ---------------------------------------------
LENET = yaml.safe_load((ROOT / "configs" / "lenet.yaml").read_text())
LENET["layer"][:2] = [{"name": "data", "type": "DummyData", "top": ["data", "label"],
                       "dummy_data_param": {"shape": [{"dim": [8, 1, 28, 28]}, {"dim": [8]}]}}]
# (constant tops: DummyData fills them once, when it is built)


def lenet_with(edit) -> str:
    net = copy.deepcopy(LENET)
    edit({layer["name"]: layer for layer in net["layer"]})
    return yaml.safe_dump(net, sort_keys=False)


def train_briefly(tmp_path: Path, net: str) -> subprocess.CompletedProcess:
    (tmp_path / "net.yaml").write_text(net)
    (tmp_path / "solver.yaml").write_text("net: net.yaml\nbase_lr: 0.01\nmax_iter: 2\n"
                                          "display: 1\nsnapshot_prefix: snaps/lenet\n")
    return cpy(tmp_path, "train", "--solver", "solver.yaml")


@pytest.mark.parametrize("stride", [10_000_000, 1 << 40])
def test_a_pooling_stride_past_the_input_trains_as_caffe_would(tmp_path, stride):
    """pool2's second window starts past its 8 x 8 input: Caffe leaves it at -FLT_MAX, which
    makes the loss infinite; the run says so in one line (it asked for petabytes of padding)."""
    done = train_briefly(tmp_path, lenet_with(
        lambda layers: layers["pool2"]["pooling_param"].update(stride=stride)))
    assert one_line_error(done) == (
        "Error: iteration 0: the loss is not finite (NaN or inf); training stopped and no "
        "snapshot was written after it; lower base_lr, set clip_gradients, or check the data")


def test_a_convolution_stride_past_the_input_trains(tmp_path):
    """conv2's stride 100,000: one output per axis; the run used to die without a line."""
    done = train_briefly(tmp_path, lenet_with(
        lambda layers: layers["conv2"]["convolution_param"].update(stride=100000)))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Optimization Done." in done.stderr


@pytest.mark.parametrize("case", ["dummy", "nan"])
def test_sizes_and_fillers_are_checked_before_anything_is_allocated(tmp_path, case):
    def dummy(layers):
        layers["data"]["dummy_data_param"]["shape"][0]["dim"] = [8, 1, 1 << 20, 1 << 20]

    def nan(layers):
        layers["conv1"]["convolution_param"]["weight_filler"] = {"type": "uniform",
                                                                 "min": float("nan")}

    (tmp_path / "net.yaml").write_text(lenet_with({"dummy": dummy, "nan": nan}[case]))
    line = one_line_error(cpy(tmp_path, "net", "net.yaml"))
    memory = line.split("more than the cpu memory (")[-1]
    assert line == {
        "dummy": "Error: net.yaml:3: layer[0]: layer 'data' (DummyData): top 'data' of shape "
                 "[8, 1, 1048576, 1048576] needs 32,768.0 GiB, more than the cpu memory "
                 f"({memory}",
        "nan": "Error: net.yaml:30: layer[1].convolution_param.weight_filler.min: min nan is "
               "not a finite number; give a finite value"}[case]


# --- spec size ------------------------------------------------------------------------------
def relu_chain(layers: int) -> str:
    """A net of an Input and ``layers`` ReLUs in a chain, one line each."""
    lines = ["name: chain", "layer:",
             "  - {name: data, type: Input, top: [data], input_param: {shape: [{dim: [1, 4]}]}}"]
    lines += [f"  - {{name: r{i}, type: ReLU, bottom: [{'data' if i == 0 else f'r{i - 1}'}], "
              f"top: [r{i}]}}" for i in range(layers)]
    return "\n".join(lines) + "\n"


def test_message_types_are_worked_out_once_per_class(monkeypatch):
    """get_type_hints evaluates every annotation's string: once per message class, not once
    per layer (it was most of a large spec's load time)."""
    import typing

    from caffe_py.spec import schema
    from caffe_py.spec.net_spec import parse_net
    from caffe_py.spec.yamlio import loads

    schema._schema_of.cache_clear()
    calls = []
    real = typing.get_type_hints
    monkeypatch.setattr(typing, "get_type_hints", lambda cls: calls.append(cls) or real(cls))
    net = parse_net(loads(relu_chain(300), "chain.yaml"), schema.Source("chain.yaml"))
    assert len(net.layer) == 301
    assert len(calls) == len(set(calls)) <= 10


def test_a_spec_past_the_caps_is_refused_before_it_is_built(tmp_path, monkeypatch):
    """More values than MAX_VALUES: refused from libyaml's event stream, before anything is
    constructed; more layers than MAX_LAYERS: refused before a layer is parsed (the caps are
    lowered here; tests/reliability's long run meets the real ones with a 64 MiB spec)."""
    from caffe_py.errors import SpecError
    from caffe_py.spec import net_spec, yamlio

    (tmp_path / "chain.yaml").write_text(relu_chain(300))
    monkeypatch.setattr(yamlio, "MAX_VALUES", 2000)
    with pytest.raises(SpecError) as caught:
        net_spec.load_net(tmp_path / "chain.yaml")
    assert str(caught.value) == (
        f"{tmp_path / 'chain.yaml'}:144: more than 2,000 YAML values, not a spec (the largest "
        "nets have a few hundred thousand); check the generator that wrote the spec")
    monkeypatch.setattr(yamlio, "MAX_VALUES", 2_000_000)
    monkeypatch.setattr(net_spec, "MAX_LAYERS", 100)
    with pytest.raises(SpecError) as caught:
        net_spec.load_net(tmp_path / "chain.yaml")
    assert str(caught.value) == (
        f"{tmp_path / 'chain.yaml'}:2: layer: 301 layers, more than caffe-py builds (100; the "
        "largest real nets have a few thousand); check the generator that wrote the spec")


@pytest.mark.long
def test_a_million_layers_and_the_largest_net_in_bounded_time(tmp_path):
    """A spec of a million layers under the 64 MiB cap is refused in one line, and the
    large net (20,000 layers) builds; each well under the
    minutes they took."""
    import time

    (tmp_path / "million.yaml").write_text(relu_chain(10**6 - 50_000))
    assert (tmp_path / "million.yaml").stat().st_size < 64 << 20
    start = time.monotonic()
    line = one_line_error(cpy(tmp_path, "net", "million.yaml", timeout=300))
    refused = time.monotonic() - start
    assert "more than 2,000,000 YAML values, not a spec" in line
    (tmp_path / "large.yaml").write_text(relu_chain(20_000))
    start = time.monotonic()
    done = cpy(tmp_path, "net", "large.yaml", timeout=300)
    built = time.monotonic() - start
    assert done.returncode == 0, done.stderr[-1000:]
    assert done.stdout.splitlines()[-2].startswith("20001 layers")
    print(f"\nmillion-layer spec refused in {refused:.1f} s; 20,000-layer net built in "
          f"{built:.1f} s")
    assert refused < 120 and built < 120


# --- inspection runs nothing ------------------------------------------------------------------
MARKER_LAYER = '''\
from pathlib import Path

from caffe_py.layers.python import TorchLayer

Path(__file__).with_name("IMPORTED").write_text("the module ran")


class Double(TorchLayer):
    def setup(self, bottom_shapes):
        return [bottom_shapes[0]]

    def forward(self, x):
        return 2 * x
'''
INSPECTED_NET = """\
name: inspected
layer:
  - {name: data, type: Input, top: [data, label],
     input_param: {shape: [{dim: [2, 3]}, {dim: [2]}]}}
  - {name: double, type: Python, bottom: data, top: doubled,
     python_param: {module: marker_layer, layer: Double}}
  - {name: ip, type: InnerProduct, bottom: doubled, top: ip,
     inner_product_param: {num_output: 2}}
  - {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}
  - {name: out, type: HDF5Output, bottom: [doubled, label],
     hdf5_output_param: {file_name: victim.h5}}
"""


@pytest.fixture
def inspected(tmp_path):
    """A net whose Python layer's module (beside the spec) leaves IMPORTED when it is
    imported, and whose HDF5Output names a file that holds someone's data."""
    (tmp_path / "marker_layer.py").write_text(MARKER_LAYER)
    (tmp_path / "net.yaml").write_text(INSPECTED_NET)
    (tmp_path / "victim.h5").write_bytes(b"someone's results")
    return tmp_path


def untouched(work: Path) -> bool:
    return (work / "victim.h5").read_bytes() == b"someone's results" and \
        not (work / "IMPORTED").exists()


@pytest.mark.slow
def test_inspection_creates_no_file_and_imports_no_module(inspected):
    """cpy net refuses the Python layer naming the file it would run; cpy draw, the deploy
    spec and the import of the prototxt form compute nothing that runs; HDF5Output's file
    stays as it was. --allow-python imports it (and still writes no file)."""
    line = one_line_error(cpy(inspected, "net", "net.yaml"))
    assert line == (
        "Error: net.yaml:5: layer[1]: layer 'double' (Python): its top shapes come from "
        f"running python_param.module 'marker_layer' ({inspected / 'marker_layer.py'} (beside "
        "the spec: its directory joins sys.path)), which this inspection does not import; "
        "pass --allow-python to import it")
    assert untouched(inspected)
    done = cpy(inspected, "draw", "net.yaml", "-o", "net.dot")
    assert done.returncode == 0, done.stderr
    (inspected / "net.prototxt").write_text(
        'name: "inspected"\n'
        'layer { name: "double" type: "Python" bottom: "data" top: "doubled"\n'
        '  python_param { module: "marker_layer" layer: "Double" } }\n'
        'layer { name: "out" type: "HDF5Output" bottom: "doubled" bottom: "label"\n'
        '  hdf5_output_param { file_name: "victim.h5" } }\n')
    done = cpy(inspected, "import-prototxt", "net.prototxt", "imported.yaml")
    assert done.returncode == 0, done.stderr
    script = ("import caffe_py, sys\n"
              "spec = caffe_py.deploy_spec('net.yaml', {'data': (1, 3)})\n"
              "print(len(spec.layer), 'marker_layer' in sys.modules)\n")
    deployed = subprocess.run([sys.executable, "-c", script], cwd=inspected,
                              capture_output=True, text=True, timeout=60)
    assert deployed.stdout.split() == ["4", "False"], deployed.stderr
    assert untouched(inspected)
    done = cpy(inspected, "net", "net.yaml", "--allow-python")
    assert done.returncode == 0, done.stderr
    assert "double  Python" in done.stdout
    assert (inspected / "victim.h5").read_bytes() == b"someone's results"
    assert (inspected / "IMPORTED").exists()


def test_a_run_says_once_which_python_file_it_imports(inspected):
    """cpy time builds the net (the Python layer's module runs, as in Caffe): one line says
    which file before it is imported."""
    done = cpy(inspected, "time", "--model", "net.yaml", "--iterations", "1")
    assert done.returncode == 0, done.stderr
    lines = [line for line in log_lines(done.stderr) if "importing module" in line]
    assert lines == [f"Python layer 'double': importing module 'marker_layer' from "
                     f"{inspected / 'marker_layer.py'} (beside the spec: its directory joins "
                     "sys.path)"]
    assert (inspected / "IMPORTED").exists()
