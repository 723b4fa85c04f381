"""Writing the YAML of an imported prototxt: mappings in block or flow style, comments kept,
and every scalar as YAML that loads back to the same value and type."""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import yaml

WIDTH = 100


@dataclass
class Node:
    """A mapping to write; ``comments``/``trailing`` apply when it is an item of a list."""

    entries: list[Entry]
    line: int = 0
    one_line: bool = False
    tail: list[str] = dataclasses.field(default_factory=list)
    comments: list[str] = dataclasses.field(default_factory=list)
    trailing: str | None = None


@dataclass
class Entry:
    key: str
    value: Any         # a scalar, a list of scalars, a Node, or a list of Node
    line: int
    comments: list[str]
    trailing: str | None


class Writer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.sources: dict[int, int] = {}   # 1-based YAML line -> prototxt line

    def add(self, indent: int, text: str, source: int | None = None,
            trailing: str | None = None) -> None:
        self.lines.append(" " * indent + text + (f"  #{trailing}" if trailing else ""))
        if source:
            self.sources[len(self.lines)] = source

    def comments(self, indent: int, comments: list[str]) -> None:
        for c in comments:
            self.add(indent, f"#{c}")

    def extend(self, other: Writer) -> None:
        offset = len(self.lines)
        self.lines += other.lines
        self.sources.update({n + offset: s for n, s in other.sources.items()})


def emit_map(node: Node, indent: int, w: Writer) -> None:
    for e in node.entries:
        _emit_entry(e, indent, w)
    w.comments(indent, node.tail)


def _emit_entry(e: Entry, indent: int, w: Writer) -> None:
    w.comments(indent, e.comments)
    v, head = e.value, f"{e.key}:"
    if isinstance(v, Node):
        flow = _flow(v)
        if flow is not None and indent + len(head) + 1 + len(flow) <= WIDTH:
            w.add(indent, f"{head} {flow}", e.line, e.trailing)
        else:
            w.add(indent, head, e.line, e.trailing)
            emit_map(v, indent + 2, w)
    elif isinstance(v, list) and any(isinstance(x, Node) for x in v):
        flows = [_flow(x) if isinstance(x, Node) else _scalar(x) for x in v]
        text = f"{head} [{', '.join(f or '' for f in flows)}]"
        quiet = all(not x.comments and not x.trailing for x in v if isinstance(x, Node))
        if None not in flows and quiet and indent + len(text) <= WIDTH:
            w.add(indent, text, e.line, e.trailing)
            return
        w.add(indent, head, e.line, e.trailing)
        for item in v:
            _emit_item(item, indent + 2, w)
    elif isinstance(v, list):
        w.add(indent, f"{head} [{', '.join(_scalar(x) for x in v)}]", e.line, e.trailing)
    else:
        w.add(indent, f"{head} {_scalar(v)}", e.line, e.trailing)


def _emit_item(item: Any, indent: int, w: Writer) -> None:
    """One '- ' item of a block list; a mapping's first key shares the dash's line."""
    if not isinstance(item, Node):
        w.add(indent, f"- {_scalar(item)}")
        return
    w.comments(indent, item.comments + ([item.trailing] if item.trailing else []))
    flow = _flow(item)
    if flow is not None and indent + 2 + len(flow) <= WIDTH:
        w.add(indent, f"- {flow}", item.line)
        return
    first = item.entries[0]
    w.comments(indent, first.comments)
    sub = Writer()
    emit_map(dataclasses.replace(item, entries=[dataclasses.replace(first, comments=[])]
                                  + item.entries[1:]), indent + 2, sub)
    sub.lines[0] = " " * indent + "- " + sub.lines[0][indent + 2:]
    w.extend(sub)


def _flow(node: Node) -> str | None:
    """``{k: v, ...}`` for a block written on one line with no comments; else None."""
    if not node.entries:
        return "{}"
    if not node.one_line or node.tail or any(e.comments or e.trailing for e in node.entries):
        return None
    parts = []
    for e in node.entries:
        v = e.value
        if isinstance(v, Node):
            text = _flow(v)
        elif isinstance(v, list):
            items = [_flow(x) if isinstance(x, Node) else _scalar(x) for x in v]
            texts = [t for t in items if t is not None]
            text = f"[{', '.join(texts)}]" if len(texts) == len(items) else None
        else:
            text = _scalar(v)
        if text is None:
            return None
        parts.append(f"{e.key}: {text}")
    return "{" + ", ".join(parts) + "}"


_PLAIN = re.compile(r"[A-Za-z_./][\w./+-]*(?: [\w./+-]+)*")


def _scalar(v: Any) -> str:
    """One value as YAML that loads back to the same value and type."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return ".nan"
        if v in (float("inf"), float("-inf")):
            return ".inf" if v > 0 else "-.inf"
        text = repr(v)
        # YAML 1.1 reads 1e-08 (no dot) as a string: write 1.0e-08
        return text.replace("e", ".0e") if "e" in text and "." not in text else text
    text = str(v)
    if _PLAIN.fullmatch(text) and yaml.safe_load(text) == text:
        return text
    quoted = yaml.safe_dump(text, default_style='"', width=10**9, allow_unicode=True)
    return quoted.strip()


__all__ = ["Node", "Entry", "Writer", "emit_map"]
