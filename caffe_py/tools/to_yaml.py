"""Caffe .prototxt (a net or a solver) -> caffe-py YAML, with the field names unchanged.

The YAML follows the prototxt line for line: key order, comments and one-line blocks are kept
(``include { phase: TRAIN }`` becomes ``include: [{phase: TRAIN}]``), enums become bare words
and strings plain scalars (quoted only where YAML would read them as something else).
caffe-py's own schema decides the shapes: a repeated message field (``layer``, ``param``,
``include``, ``input_shape``, ...) is always a list; a repeated scalar written once stays a
scalar (``bottom: data``, ``kernel_size: 5``), which the loader accepts as a one-item list.
Fields the schema does not know are carried over as written, so the loader can name them.

Legacy nets are upgraded as Caffe's ``UpgradeNetAsNeeded`` does: V1 ``layers`` blocks become
``layer`` (enum types to type strings, ``blobs_lr`` / ``weight_decay`` / ``param`` /
``blob_share_mode`` into ``param`` blocks, data-layer transform fields into
``transform_param``); ``input_dim`` becomes one ``input_shape`` per input; a solver's
``solver_type`` enum becomes ``type``.

Caffe resolves relative paths against the directory it runs from, caffe-py against the spec
file's directory, so relative paths are rewritten from ``root`` (where Caffe ran) to the output
file's directory. A solver's net files become ``<stem>.yaml`` beside the output, with a note
saying which file to import next.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

import yaml

from ..errors import SpecError
from ..fileio import atomic_write_bytes
from ..spec import layer_params, yamlio
from ..spec.layer_params.caffe_proto import CAFFE_PATH_FIELDS
from ..spec.net_spec import LayerParameter, NetParameter, parse_net, unknown_types
from ..spec.schema import Source, suggest
from ..spec.solver_spec import SolverParameter, load_solver
from .prototxt import BOOL_WORDS, Field, Ident, Message, PrototxtError, parse_file
from .upgrade_v0 import is_v0, upgrade_v0_net
from .yaml_writer import Entry, Node, Writer, emit_map

# Caffe's UpgradeV1LayerType (upgrade_proto.cpp): V1 enum name -> V2 type string.
V1_LAYER_TYPES = {
    "NONE": "", "ABSVAL": "AbsVal", "ACCURACY": "Accuracy", "ARGMAX": "ArgMax", "BNLL": "BNLL",
    "CONCAT": "Concat", "CONTRASTIVE_LOSS": "ContrastiveLoss", "CONVOLUTION": "Convolution",
    "DECONVOLUTION": "Deconvolution", "DATA": "Data", "DROPOUT": "Dropout",
    "DUMMY_DATA": "DummyData", "EUCLIDEAN_LOSS": "EuclideanLoss", "ELTWISE": "Eltwise",
    "EXP": "Exp", "FLATTEN": "Flatten", "HDF5_DATA": "HDF5Data", "HDF5_OUTPUT": "HDF5Output",
    "HINGE_LOSS": "HingeLoss", "IM2COL": "Im2col", "IMAGE_DATA": "ImageData",
    "INFOGAIN_LOSS": "InfogainLoss", "INNER_PRODUCT": "InnerProduct", "LRN": "LRN",
    "MEMORY_DATA": "MemoryData", "MULTINOMIAL_LOGISTIC_LOSS": "MultinomialLogisticLoss",
    "MVN": "MVN", "POOLING": "Pooling", "POWER": "Power", "RELU": "ReLU", "SIGMOID": "Sigmoid",
    "SIGMOID_CROSS_ENTROPY_LOSS": "SigmoidCrossEntropyLoss", "SILENCE": "Silence",
    "SOFTMAX": "Softmax", "SOFTMAX_LOSS": "SoftmaxWithLoss", "SPLIT": "Split", "SLICE": "Slice",
    "TANH": "TanH", "WINDOW_DATA": "WindowData", "THRESHOLD": "Threshold",
}
# V1 layer types of Caffe forks whose nets caffe-py reads (DeconvNet's V1 prototxts): the
# type string each becomes. DeconvNet's UNPOOLING (MAX, with the pooling mask) is SegNet's
# Upsample: each value goes to the position its mask names (see _unpooling_block).
FORK_V1_LAYER_TYPES = {"BN": "BN", "UNPOOLING": "Upsample"}
# caffe.proto's numbering of V1LayerParameter.LayerType (a prototxt may write `type: 4`).
V1_LAYER_NUMBERS = {
    0: "NONE", 1: "ACCURACY", 2: "BNLL", 3: "CONCAT", 4: "CONVOLUTION", 5: "DATA", 6: "DROPOUT",
    7: "EUCLIDEAN_LOSS", 8: "FLATTEN", 9: "HDF5_DATA", 10: "HDF5_OUTPUT", 11: "IM2COL",
    12: "IMAGE_DATA", 13: "INFOGAIN_LOSS", 14: "INNER_PRODUCT", 15: "LRN",
    16: "MULTINOMIAL_LOGISTIC_LOSS", 17: "POOLING", 18: "RELU", 19: "SIGMOID", 20: "SOFTMAX",
    21: "SOFTMAX_LOSS", 22: "SPLIT", 23: "TANH", 24: "WINDOW_DATA", 25: "ELTWISE", 26: "POWER",
    27: "SIGMOID_CROSS_ENTROPY_LOSS", 28: "HINGE_LOSS", 29: "MEMORY_DATA", 30: "ARGMAX",
    31: "THRESHOLD", 32: "DUMMY_DATA", 33: "SLICE", 34: "MVN", 35: "ABSVAL", 36: "SILENCE",
    37: "CONTRASTIVE_LOSS", 38: "EXP", 39: "DECONVOLUTION",
}
# V1LayerParameter's per-blob repeated fields -> the ParamSpec field each one sets, by index.
_V1_PARAM_FIELDS = {"param": "name", "blob_share_mode": "share_mode", "blobs_lr": "lr_mult",
                    "weight_decay": "decay_mult"}
# UpgradeNetDataTransformation: these data layers' transform fields move to transform_param.
_V1_DATA_BLOCKS = {"DATA": "data_param", "IMAGE_DATA": "image_data_param",
                   "WINDOW_DATA": "window_data_param"}
_TRANSFORM_KEYS = ("scale", "mean_file", "crop_size", "mirror")
# UpgradeSolverType: the SolverParameter.SolverType enum -> the type string.
SOLVER_TYPES_V1 = {"SGD": "SGD", "NESTEROV": "Nesterov", "ADAGRAD": "AdaGrad",
                   "RMSPROP": "RMSProp", "ADADELTA": "AdaDelta", "ADAM": "Adam"}
_NET_FILE_KEYS = ("net", "train_net", "test_net")
_NET_MARKS = ("layer", "layers")
_SOLVER_MARKS = ("base_lr", "net", "train_net", "net_param", "train_net_param")
WIDTH = 100


@dataclass
class Conversion:
    """The YAML text, which prototxt line each YAML line came from, and notes for the user."""

    kind: str
    text: str
    source_lines: dict[int, int]
    notes: list[str]

    def source_line(self, yaml_line: int | None) -> int | None:
        """The prototxt line behind ``yaml_line`` (the nearest mapped line above it)."""
        if yaml_line is None:
            return None
        earlier = [n for n in self.source_lines if n <= yaml_line]
        return self.source_lines[max(earlier)] if earlier else None


@dataclass
class ImportReport:
    """What ``import_file`` wrote: the kind, a one-line summary and the notes."""

    out: Path
    kind: str
    summary: str
    notes: list[str]
    warnings: list[str] = dataclasses.field(default_factory=list)
    """What keeps OUT from building yet (layer types caffe-py does not have)."""


def detect_kind(msg: Message, source: str) -> str:
    """'net' for a file with layer/layers, 'solver' for one with base_lr/net/train_net."""
    names = set(msg.names())
    if names & set(_NET_MARKS):
        return "net"
    if names & set(_SOLVER_MARKS):
        return "solver"
    raise SpecError("cannot tell whether this is a net or a solver: it has no "
                    "'layer'/'layers' and no 'base_lr'/'net'/'train_net'", file=source,
                    fix="pass --kind net or --kind solver")


def convert(msg: Message, kind: str, *, source: str, root: Path | None = None,
            out: Path | None = None) -> Conversion:
    """Convert a parsed prototxt of ``kind`` ('net' or 'solver') to YAML text.

    ``root`` is where Caffe ran (relative paths resolve there) and ``out`` the YAML file to be
    written (paths are rewritten relative to its directory); without both, paths stay as written.
    """
    conv = _Converter(source, root, out.parent if out is not None else None, out)
    node = conv.message(msg, NetParameter if kind == "net" else SolverParameter, "")
    if conv.rebased:
        conv.notes.append(f"relative paths were rewritten from {conv.root} (where Caffe ran; "
                          f"--caffe-root) to be relative to {conv.out_dir}")
    writer = Writer()
    writer.add(0, f"# Imported from {source} by cpy import-prototxt.")
    if not node.entries and not node.tail:
        writer.add(0, "{}")
    emit_map(node, 0, writer)
    notes = list(dict.fromkeys(conv.notes))  # two data layers moving 'scale' say it once
    return Conversion(kind, "\n".join(writer.lines) + "\n", writer.sources, notes)


def import_file(source: str | Path, out: str | Path, kind: str = "auto",
                root: str | Path | None = None) -> ImportReport:
    """Convert ``source`` to ``out`` (written atomically), then load ``out`` to validate it.

    A spec that does not load is a :class:`SpecError` naming both the YAML line and the
    prototxt line it came from; ``out`` stays written so that it can be fixed in place.
    """
    source, out = Path(source), Path(out)
    if out.exists() and source.exists() and out.resolve() == source.resolve():
        raise SpecError("the output would overwrite the input", file=str(out),
                        fix="name a .yaml file as OUT")
    msg = parse_file(source)
    kind = detect_kind(msg, str(source)) if kind == "auto" else kind
    root = Path(root if root is not None else Path.cwd()).resolve()
    conv = convert(msg, kind, source=str(source), root=root, out=out.resolve())
    atomic_write_bytes(out, conv.text.encode("utf-8"))
    warnings: list[str] = []
    try:
        with _spec_messages(conv.notes, warnings):
            summary = _check(out, kind, conv, source, warnings)
    except SpecError as exc:
        raise _validation_error(exc, conv, source, out) from None
    return ImportReport(out, kind, summary, list(dict.fromkeys(conv.notes)), warnings)


def _check(out: Path, kind: str, conv: Conversion, source: Path, warnings: list[str]) -> str:
    """Load OUT with caffe-py's loader (leaving out layers of types it lacks, which a
    warning names); returns the one-line summary."""
    if kind == "net":
        node = yamlio.load(out)
        missing = unknown_types(node)
        net = parse_net(node, Source.of(out), skip_unknown=True)
        if missing:
            warnings.append(_missing_types(missing, conv, source))
        count = len(net.layer) + len(missing)
        return f"{count} layer{'s' if count != 1 else ''}"
    solver = load_solver(out)
    return f"solver {solver.type}, lr_policy {solver.lr_policy}, max_iter {solver.max_iter}"


@contextlib.contextmanager
def _spec_messages(notes: list[str], warnings: list[str]) -> Iterator[None]:
    """The loader's notes and warnings (a fork's ceil_mode, a block of another type) go into
    the import's own lists while OUT is checked, instead of the log."""
    logger = logging.getLogger("caffe_py.spec")

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage()
            for prefix in ("Warning: ", "note: "):
                text = text.removeprefix(prefix)
            (warnings if record.levelno >= logging.WARNING else notes).append(text)

    handler, propagate = Collect(logging.INFO), logger.propagate
    level = logger.level
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        logger.setLevel(level)


def _missing_types(missing: list[tuple[str, str, int]], conv: Conversion, source: Path) -> str:
    """One line naming each type caffe-py lacks, with its first layer's prototxt line."""
    by_type: dict[str, list[tuple[str, int]]] = {}
    for type_name, name, line in missing:
        by_type.setdefault(type_name, []).append((name, line))
    parts = []
    for type_name, layers in by_type.items():
        name, line = layers[0]
        at = f"'{name}' at {source}:{conv.source_line(line) or '?'}"
        parts.append(f"{type_name} ({at})" if len(layers) == 1 else
                     f"{type_name} ({len(layers)} layers, first {at})")
    return (f"the net uses layer type(s) caffe-py does not have yet: {', '.join(parts)}; "
            "the rest was checked, and `cpy net` / `cpy train` will build it once those types "
            "exist")


def _validation_error(exc: SpecError, conv: Conversion, source: Path, out: Path) -> SpecError:
    line = conv.source_line(exc.line) if exc.file == str(out) else None
    where = f"{source}:{line}" if line else str(source)
    fix = f"{exc.fix}; " if exc.fix else ""
    return SpecError(exc.problem, file=exc.file, line=exc.line, path=exc.path,
                     fix=f"{fix}it comes from {where}; {out} was written, so fix it there "
                         f"(or fix the prototxt and import again)")


# --- schema-driven conversion ---------------------------------------------------------------
@dataclass(frozen=True)
class _Kind:
    """What the schema says about one field."""

    repeated: bool
    tp: Any            # a scalar type (int, float, str, bool) or a message class
    path: bool = False


def _schema(cls: type) -> dict[str, _Kind]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or f.name == "params":
            continue
        tp = hints[f.name]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        repeated = typing.get_origin(tp) is list
        if repeated:
            (tp,) = typing.get_args(tp)
        out[f.name] = _Kind(repeated, tp, bool(f.metadata.get("path")))
    return out


class _Converter:
    def __init__(self, source: str, root: Path | None, out_dir: Path | None,
                 out: Path | None):
        self.source, self.root, self.out_dir, self.out = source, root, out_dir, out
        self.notes: list[str] = []
        self.rebased = False

    def fail(self, at: Field | Message, problem: str, fix: str | None = None) -> PrototxtError:
        return PrototxtError(problem, file=self.source, line=at.line, column=at.column, fix=fix)

    def message(self, msg: Message, cls: type | None, path: str) -> Node:
        if cls is NetParameter:
            return self.fields(self.upgrade_net(msg), _schema(NetParameter), path)
        if cls is LayerParameter:
            return self.fields(self.default_backend(msg), self.layer_schema(msg), path)
        if cls is SolverParameter:
            return self.fields(self.upgrade_solver(msg), _schema(SolverParameter), path)
        return self.fields(msg, _schema(cls) if cls is not None else None, path)

    def layer_schema(self, msg: Message) -> dict[str, _Kind]:
        """LayerParameter's fields plus the blocks the layer's type takes."""
        schema = _schema(LayerParameter)
        type_field = msg.first("type")
        if type_field is not None and isinstance(type_field.value, str):
            # an unknown type takes no block here: the loader names it with the known ones
            declared = layer_params.LAYER_PARAMS.get(type_field.value, {})
            schema.update({k: _Kind(False, cls) for k, cls in declared.items()})
        return schema

    def fields(self, msg: Message, schema: dict[str, _Kind] | None, path: str) -> Node:
        node = Node([], msg.line, msg.one_line, list(msg.tail))
        for name in msg.names():
            kind = schema.get(name) if schema is not None else None
            node.entries.append(self.entry(name, msg.all(name), kind, path))
        return node

    def entry(self, name: str, group: list[Field], kind: _Kind | None, path: str) -> Entry:
        key_path = f"{path}.{name}" if path else name
        if kind is not None and not kind.repeated and len(group) > 1:
            raise self.fail(group[1], f"'{name}' is given {len(group)} times (first at line "
                                      f"{group[0].line}) but it is not a repeated field",
                            "keep one of them")
        values = [self.value(f, kind, f"{key_path}[{i}]" if len(group) > 1 else key_path)
                  for i, f in enumerate(group)]
        first = group[0]
        as_list = (kind.repeated and dataclasses.is_dataclass(kind.tp)) if kind is not None \
            else len(group) > 1
        if any(isinstance(v, Node) for v in values) and as_list:
            for f, v in zip(group, values, strict=True):
                if isinstance(v, Node):
                    v.comments, v.trailing = list(f.comments), f.trailing
            return Entry(name, values, first.line, [], None)
        comments = [c for f in group for c in f.comments]
        trailing = "; ".join(f.trailing.strip() for f in group if f.trailing) or None
        if trailing is not None:
            trailing = " " + trailing
        value = values[0] if len(values) == 1 else values
        return Entry(name, value, first.line, comments, trailing)

    def value(self, f: Field, kind: _Kind | None, path: str) -> Any:
        if isinstance(f.value, Message):
            cls = kind.tp if kind is not None and isinstance(kind.tp, type) \
                and dataclasses.is_dataclass(kind.tp) else None
            if cls is None and f.name in CAFFE_PATH_FIELDS:
                # a block caffe-py has no message for here (its type is not supported yet,
                # or it is ignored on this type): its paths move all the same
                paths = {k: _Kind(False, str, path=True) for k in CAFFE_PATH_FIELDS[f.name]}
                return self.fields(f.value, paths, path)
            return self.message(f.value, cls, path)
        return self.scalar(f.value, kind, path)

    def scalar(self, v: Any, kind: _Kind | None, path: str) -> Any:
        tp = kind.tp if kind is not None else None
        if tp is bool:
            if isinstance(v, Ident) and v in BOOL_WORDS:
                return BOOL_WORDS[v]
            if type(v) is int and v in (0, 1):
                return bool(v)
        if kind is None and isinstance(v, Ident) and v.lower() in ("true", "false"):
            return v.lower() == "true"
        if isinstance(v, Ident):
            return str(v)
        if isinstance(v, str) and re.sub(r"\[\d+\]$", "", path) in _NET_FILE_KEYS:
            return self.net_file(path, v)
        if kind is not None and kind.path and isinstance(v, str):
            return self.rebase(v)
        return v

    def rebase(self, value: str) -> str:
        """A path relative to where Caffe ran -> relative to the output file's directory."""
        if not value or self.root is None or self.out_dir is None or Path(value).is_absolute():
            return value
        new = os.path.relpath(os.path.normpath(self.root / value), self.out_dir)
        new = new.replace(os.sep, "/") + ("/" if value.endswith("/") else "")
        self.rebased |= new != value
        return new

    def net_file(self, key: str, value: str) -> str:
        """A solver's net file: <stem>.yaml beside the output, and a note to import it too."""
        new = PurePath(value).stem + ".yaml"
        caffe_path = os.path.normpath(self.root / value) if self.root is not None else value
        shown = os.path.relpath(caffe_path) if self.root is not None else value
        target = os.path.relpath(self.out_dir / new) if self.out_dir is not None else new
        self.notes.append(f"{key.split('[')[0]}: {value} is now {new}; import it too: "
                          f"cpy import-prototxt {shown} {target}")
        return new

    # --- Caffe's upgrades, on the parsed prototxt (positions kept for errors) ---------------
    def upgrade_net(self, msg: Message) -> Message:
        if is_v0(msg):
            msg = upgrade_v0_net(msg, self.fail, self.notes)
        v1, v2 = msg.all("layers"), msg.all("layer")
        if v1 and v2:
            raise self.fail(v1[0], "the net has both 'layer' (current) and 'layers' (V1) "
                                   "blocks; Caffe refuses to upgrade it too",
                            "write every layer as 'layer { ... }'")
        fields = []
        for f in msg.fields:
            if f.name == "layers" and isinstance(f.value, Message):
                f = dataclasses.replace(f, name="layer", value=self.upgrade_v1_layer(f.value))
            fields.append(f)
        if v1:
            self.notes.append(f"upgraded {len(v1)} V1 'layers' blocks to 'layer' "
                              "(as Caffe's UpgradeV1Net)")
        fields = self.upgrade_input_dim(msg, fields)
        return dataclasses.replace(msg, fields=fields)

    def upgrade_input_dim(self, msg: Message, fields: list[Field]) -> list[Field]:
        """input_dim (4 per input: N, C, H, W) -> one input_shape { dim ... } per input."""
        dims = msg.all("input_dim")
        if not dims:
            return fields
        inputs = msg.all("input")
        if msg.first("input_shape") is not None:
            raise self.fail(dims[0], "both input_dim and input_shape are given",
                            "keep input_shape")
        if len(dims) != 4 * len(inputs):
            raise self.fail(dims[0], f"{len(dims)} input_dim values for {len(inputs)} "
                                     f"input(s); Caffe takes 4 (N, C, H, W) per input",
                            "give 4 input_dim values per input")
        shapes = [Field("input_shape", Message([dataclasses.replace(d, name="dim", comments=[])
                                                for d in dims[4 * i:4 * i + 4]],
                                               line=dims[4 * i].line, one_line=True),
                        dims[4 * i].line, dims[4 * i].column, dims[4 * i].comments if i else
                        [c for d in dims for c in d.comments])
                  for i in range(len(inputs))]
        at = fields.index(dims[0])
        rest = [f for f in fields if f.name != "input_dim"]
        return rest[:at] + shapes + rest[at:]

    def upgrade_v1_layer(self, m: Message) -> Message:
        """Caffe's UpgradeV1LayerParameter (and UpgradeNetDataTransformation) on one block."""
        out: list[Field | None] = []
        specs: dict[int, list[Field]] = {}
        counts = dict.fromkeys(_V1_PARAM_FIELDS, 0)
        spec_at, v1_type = None, None
        for f in m.fields:
            if f.name == "type" and type(f.value) is int and f.value in V1_LAYER_NUMBERS:
                f = dataclasses.replace(f, value=Ident(V1_LAYER_NUMBERS[f.value]))
            if f.name == "type" and isinstance(f.value, Ident) and \
                    f.value in FORK_V1_LAYER_TYPES:
                v1_type = str(f.value)
                f = dataclasses.replace(f, value=FORK_V1_LAYER_TYPES[v1_type])
            elif f.name == "type" and isinstance(f.value, Ident):
                v1_type = self.v1_type(f)
                f = dataclasses.replace(f, value=V1_LAYER_TYPES[v1_type])
            elif f.name in _V1_PARAM_FIELDS:
                spec_at = len(out) if spec_at is None else spec_at
                if spec_at == len(out):
                    out.append(None)
                specs.setdefault(counts[f.name], []).append(
                    dataclasses.replace(f, name=_V1_PARAM_FIELDS[f.name], comments=[]))
                counts[f.name] += 1
                continue
            out.append(f)
        params = [Field("param", Message(specs[i], line=specs[i][0].line, one_line=True),
                        specs[i][0].line, specs[i][0].column) for i in sorted(specs)]
        fields = [x for f in out for x in ([f] if f is not None else params)]
        if v1_type in _V1_DATA_BLOCKS:
            fields = self.move_transform(fields, _V1_DATA_BLOCKS[v1_type])
        if v1_type == "UNPOOLING":
            fields = self.unpooling_block(m, fields)
        return dataclasses.replace(m, fields=fields)

    def unpooling_block(self, m: Message, fields: list[Field]) -> list[Field]:
        """DeconvNet's unpooling_param -> SegNet's upsample_param: MAX unpooling of a pooling
        mask into unpool_size (or unpool_h x unpool_w) is SegNet's Upsample exactly."""
        found = _block_field(fields, "unpooling_param")
        at = found[0] if found is not None else m
        block = found[1] if found is not None else Message([], line=m.line)
        method = block.first("unpool")
        if method is not None and str(method.value) not in ("MAX", "0"):
            raise self.fail(method, f"DeconvNet's UNPOOLING with unpool: {method.value} has no "
                                    "caffe-py form (MAX unpooling is SegNet's Upsample)",
                            "use unpool: MAX with the pooling mask as the second bottom")
        if len(m.all("bottom")) != 2:
            raise self.fail(at, "DeconvNet's UNPOOLING without the pooling mask as its second "
                                "bottom has no caffe-py form",
                            "give the Pooling layer's mask top as the second bottom")
        size, height, width = (block.first(k) for k in ("unpool_size", "unpool_h", "unpool_w"))
        if size is None and (height is None or width is None):
            raise self.fail(at, "DeconvNet's UNPOOLING gives no unpool_size (nor unpool_h and "
                                "unpool_w); its size from the kernel and stride has no caffe-py "
                                "form", "give unpool_size: the pooling layer's input size")
        h_field = height if size is None else size
        w_field = width if size is None else size
        assert h_field is not None and w_field is not None
        upsample = Field("upsample_param", Message(
            [dataclasses.replace(h_field, name="upsample_h", comments=[]),
             dataclasses.replace(w_field, name="upsample_w", comments=[])],
            line=at.line, one_line=True), at.line, at.column)
        self.notes.append("read DeconvNet's UNPOOLING (MAX, with the pooling mask) as SegNet's "
                          "Upsample, which unpools the same way")
        if found is None:
            return [*fields, upsample]
        return [upsample if f is found[0] else f for f in fields]

    def v1_type(self, f: Field) -> str:
        if not isinstance(f.value, str) or f.value not in V1_LAYER_TYPES:
            near = suggest(str(f.value), V1_LAYER_TYPES)
            hint = f"did you mean {near}? " if near else ""
            raise self.fail(f, f"unknown V1 layer type '{f.value}'",
                            f"{hint}V1 types: {', '.join(sorted(set(V1_LAYER_TYPES) - {'NONE'}))}")
        if f.value == "NONE":
            raise self.fail(f, "V1 layer type NONE has no V2 type", "give the layer a type")
        return str(f.value)

    def move_transform(self, fields: list[Field], block: str) -> list[Field]:
        """scale/mean_file/crop_size/mirror of a V1 data block -> transform_param (they win)."""
        found = _block_field(fields, block)
        if found is None:
            return fields
        data, data_msg = found
        moved = [f for f in data_msg.fields if f.name in _TRANSFORM_KEYS]
        if not moved:
            return fields
        kept = [f for f in data_msg.fields if f.name not in _TRANSFORM_KEYS]
        new_data = dataclasses.replace(data, value=dataclasses.replace(data_msg, fields=kept))
        existing = _block_field(fields, "transform_param")
        old = existing[0] if existing is not None else None
        names = {f.name for f in moved}
        if existing is not None:
            old_msg = existing[1]
            merged = [f for f in old_msg.fields if f.name not in names] + moved
            transform = dataclasses.replace(existing[0], value=dataclasses.replace(
                old_msg, fields=merged))
        else:
            transform = Field("transform_param", Message(moved, line=moved[0].line),
                              moved[0].line, moved[0].column)
        self.notes.append(f"moved {', '.join(f.name for f in moved)} from {block} to "
                          "transform_param (as Caffe's UpgradeNetDataTransformation)")
        out = []
        for f in fields:
            if f is data:
                out += [transform, new_data] if old is None else [new_data]
            elif f is old:
                out.append(transform)
            else:
                out.append(f)
        return out

    def default_backend(self, layer: Message) -> Message:
        """A Data (or SSD's AnnotatedData) layer whose data_param gives no backend reads
        LEVELDB in Caffe (caffe.proto's default); caffe-py's YAML defaults to LMDB, so the
        import writes Caffe's default out."""
        type_field, found = layer.first("type"), _block_field(layer.fields, "data_param")
        if type_field is None or type_field.value not in ("Data", "DATA", "AnnotatedData") \
                or found is None:
            return layer
        data, data_msg = found
        if data_msg.first("backend") is not None:
            return layer
        backend = Field("backend", Ident("LEVELDB"), data.line, data.column,
                        trailing="Caffe's default: the prototxt gives no backend")
        self.notes.append("a Data layer's data_param gives no backend, so Caffe reads LEVELDB "
                          "(caffe.proto's default); the YAML says backend: LEVELDB (write "
                          "LMDB there if the database is an LMDB)")
        new_data = dataclasses.replace(data, value=dataclasses.replace(
            data_msg, fields=[*data_msg.fields, backend], one_line=False))
        return dataclasses.replace(layer, fields=[new_data if f is data else f
                                                  for f in layer.fields])

    def upgrade_solver(self, msg: Message) -> Message:
        """Caffe's UpgradeSolverType: solver_type: NESTEROV -> type: Nesterov."""
        old = msg.first("solver_type")
        if old is None:
            return msg
        if msg.first("type") is not None:
            raise self.fail(old, "both solver_type (the old enum) and type are given; Caffe "
                                 "refuses this too", "keep type")
        if type(old.value) is int and 0 <= old.value < len(SOLVER_TYPES_V1):  # the enum's number
            old = dataclasses.replace(old, value=list(SOLVER_TYPES_V1)[old.value])
        if old.value not in SOLVER_TYPES_V1:
            raise self.fail(old, f"unknown solver_type '{old.value}'",
                            f"use one of {', '.join(SOLVER_TYPES_V1)}")
        new = dataclasses.replace(old, name="type", value=SOLVER_TYPES_V1[old.value])
        return dataclasses.replace(msg, fields=[new if f.name == "solver_type" else f
                                                for f in msg.fields])


def _block_field(fields: list[Field], name: str) -> tuple[Field, Message] | None:
    """The first field ``name`` whose value is a block, and that block."""
    for f in fields:
        if f.name == name and isinstance(f.value, Message):
            return f, f.value
    return None


__all__ = ["Conversion", "ImportReport", "V1_LAYER_TYPES", "SOLVER_TYPES_V1", "convert",
           "detect_kind", "import_file"]


def prototxt_as_yaml(path: Path, kind: str = "auto") -> str:
    """A Caffe prototxt (net or solver, or as ``kind`` says) as the YAML text `cpy
    import-prototxt` writes, its relative paths (Caffe's, from the directory Caffe runs in:
    here, the current one) rewritten for the prototxt's own directory, as a YAML file there
    would hold them."""
    msg = parse_file(path)
    kind = detect_kind(msg, str(path)) if kind == "auto" else kind
    conv = convert(msg, kind, source=str(path), root=Path.cwd().resolve(),
                   out=Path(path).resolve().with_suffix(".yaml"))
    logging.getLogger(__name__).info(
        f"Note: {path} is a Caffe prototxt, read in memory as its YAML spec "
        f"(cpy import-prototxt {path} OUT.yaml writes it)")
    if kind != "solver":
        return conv.text
    # the converter names the nets' YAML files to be; here the nets stay prototxts until
    # those exist
    data = yaml.safe_load(conv.text) or {}
    base = Path(path).resolve().parent
    for key in ("net", "train_net", "test_net"):
        names = data.get(key)
        listed = names if isinstance(names, list) else [names]
        fixed = [_existing_net(base, n) if isinstance(n, str) else n for n in listed]
        if names is not None:
            data[key] = fixed if isinstance(names, list) else fixed[0]
    return yaml.safe_dump(data, sort_keys=False)


def _existing_net(base: Path, name: str) -> str:
    """``name`` (a .yaml the converter named) or, while that file does not exist, the
    prototxt it would be made from."""
    if name.endswith(".yaml") and not (base / name).exists():
        prototxt = name[:-len(".yaml")] + ".prototxt"
        if (base / prototxt).exists():
            return prototxt
    return name
