"""A net as a graph picture, as Caffe's python/draw_net.py draws it: a box per layer (name,
type and the main parameters), an octagon per blob, edges from bottoms to layers to tops. The
DOT text is written here; an .svg, .png or .pdf goes through Graphviz's ``dot``."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from ..errors import CaffePyError
from ..fileio import atomic_write_bytes
from ..spec.net_spec import LayerParameter, NetParameter

RANKDIRS = ("LR", "TB", "BT", "RL")
PICTURES = (".svg", ".png", ".pdf")
_COLORS = {"Convolution": "#FF5050", "Deconvolution": "#FF5050", "Pooling": "#FF9900",
           "InnerProduct": "#CC33FF"}


class DrawError(CaffePyError):
    """A picture that cannot be made (no Graphviz, an unknown file kind)."""


def _label(layer: LayerParameter) -> str:
    lines = [layer.name, f"({layer.type})"]
    for key in ("convolution_param", "pooling_param", "inner_product_param"):
        block = layer.params.get(key)
        if block is None:
            continue
        for field in ("num_output", "kernel_size", "stride", "pad", "pool"):
            value = getattr(block, field, None)
            if value not in (None, [], 0, ""):
                shown = value[0] if isinstance(value, list) and len(value) == 1 else value
                lines.append(f"{field} {shown}")
    return "\\n".join(_record_text(line) for line in lines)


def _record_text(text: str) -> str:
    """Text as it may stand in a record node's label: a backslash, and the braces, bars and
    angle brackets that would otherwise start fields or ports, escaped (a layer named 'a{b'
    made a .dot file Graphviz rejects, and a '|' split the node in two)."""
    return re.sub(r"([{}|<>\\])", r"\\\1", text)


def _quote_record(label: str) -> str:
    """A record label made by :func:`_label` as a DOT string: its escapes kept, quotes escaped."""
    return '"' + label.replace('"', '\\"') + '"'


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\\\\n", "\\n") + '"'


def to_dot(net: NetParameter, *, phase: str | None = None, rankdir: str = "LR") -> str:
    """The DOT text of ``net``'s layers (those kept for ``phase``; all when None)."""
    lines = [f"digraph {_quote(net.name or 'net')} {{", f"  rankdir={rankdir};",
             '  node [fontname="Helvetica", fontsize=10];']
    blobs: set[str] = set()
    for i, layer in enumerate(net.layer):
        if phase is not None and not layer.kept_for(phase):
            continue
        node = f"layer{i}"
        color = _COLORS.get(layer.type, "#6495ED")
        lines.append(f"  {node} [shape=record, style=filled, fillcolor={_quote(color)}, "
                     f"label={_quote_record(_label(layer))}];")
        for blob in [*layer.bottom, *layer.top]:
            if blob not in blobs:
                blobs.add(blob)
                lines.append(f"  {_quote('blob ' + blob)} [shape=octagon, style=filled, "
                             f"fillcolor=\"#E0E0E0\", label={_quote(blob)}];")
        lines += [f"  {_quote('blob ' + b)} -> {node};" for b in layer.bottom]
        lines += [f"  {node} -> {_quote('blob ' + t)};" for t in layer.top]
    lines.append("}")
    return "\n".join(lines) + "\n"


def draw(net: NetParameter, out: str | Path, *, phase: str | None = None,
         rankdir: str = "LR") -> None:
    """Write ``net`` as DOT text (``.dot``/``.gv``) or a picture (``.svg``, ``.png``, ``.pdf``)."""
    out = Path(out)
    text = to_dot(net, phase=phase, rankdir=rankdir)
    suffix = out.suffix.lower()
    if suffix in (".dot", ".gv"):
        atomic_write_bytes(out, text.encode())
        return
    if suffix not in PICTURES:
        raise DrawError(f"{out}: draw writes .dot, .gv, {', '.join(PICTURES)}; name the "
                        "file with one of those")
    dot = shutil.which("dot")
    if dot is None:
        raise DrawError(f"{out}: drawing a picture needs Graphviz's dot (apt install graphviz); "
                        "or write the .dot text and render it elsewhere")
    done = subprocess.run([dot, f"-T{suffix[1:]}"], input=text.encode(), capture_output=True,
                          check=False)
    if done.returncode != 0:
        reason = " ".join(done.stderr.decode(errors="replace").split())[:200]
        raise DrawError(f"{out}: dot failed ({reason})")
    atomic_write_bytes(out, done.stdout)
