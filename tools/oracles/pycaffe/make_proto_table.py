"""Write caffe_py/pycaffe/proto/caffe_proto_table.py: the messages, fields and enums of Caffe's
caffe.proto as a Python table, from which caffe_py.pycaffe.proto.caffe_pb2 builds protobuf
message classes at run time (field names, numbers, types, labels and defaults are the
format's own: they are what makes a message Caffe reads).

Run with BVLC Caffe 1.0's sources at hand (Debian's `caffe` source package, the code of BVLC
master 9b89154, unpacked to /opt/caffe-src by ../shared/caffe/build_caffe.sh):

    python tools/oracles/pycaffe/make_proto_table.py \
        /opt/caffe-src/caffe/src/caffe/proto/caffe.proto

The parser reads the proto2 subset caffe.proto uses: top-level messages and enums, enums
nested in messages, fields `label type name = number [default = v, packed = true];`.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[3] / "caffe_py" / "pycaffe" / "proto" / \
    "caffe_proto_table.py"
TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|[A-Za-z_][\w.]*|-?[\d.][\w.+-]*|\S')


def tokens(text: str) -> list[str]:
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return TOKEN.findall(text)


def parse(text: str) -> tuple[dict, dict]:
    toks = tokens(text)
    pos = 0
    enums: dict[str, list[tuple[str, int]]] = {}
    messages: dict[str, dict] = {}

    def expect(value: str) -> None:
        nonlocal pos
        if toks[pos] != value:
            raise SystemExit(f"expected {value!r} at token {pos}, got {toks[pos]!r}")
        pos += 1

    def enum_body() -> list[tuple[str, int]]:
        nonlocal pos
        values = []
        expect("{")
        while toks[pos] != "}":
            name = toks[pos]
            expect_at = pos + 1
            if toks[expect_at] != "=":
                raise SystemExit(f"enum value {name}: expected '='")
            number = int(toks[pos + 2])
            pos += 3
            expect(";")
            values.append((name, number))
        expect("}")
        return values

    def message_body(name: str) -> dict:
        nonlocal pos
        fields = []
        nested: dict[str, list[tuple[str, int]]] = {}
        expect("{")
        while toks[pos] != "}":
            if toks[pos] == "enum":
                enum_name = toks[pos + 1]
                pos += 2
                nested[enum_name] = enum_body()
                continue
            label, kind, field_name = toks[pos], toks[pos + 1], toks[pos + 2]
            pos += 3
            expect("=")
            number = int(toks[pos])
            pos += 1
            options: dict[str, str] = {}
            if toks[pos] == "[":
                pos += 1
                while toks[pos] != "]":
                    key = toks[pos]
                    expect_eq = toks[pos + 1]
                    if expect_eq != "=":
                        raise SystemExit(f"{name}.{field_name}: bad option")
                    options[key] = toks[pos + 2]
                    pos += 3
                    if toks[pos] == ",":
                        pos += 1
                pos += 1
            expect(";")
            default = options.get("default")
            if default is not None and default[0] in "'\"":
                default = default[1:-1]
            fields.append((field_name, number, label, kind, default,
                           options.get("packed") == "true"))
        expect("}")
        return {"enums": nested, "fields": fields}

    while pos < len(toks):
        tok = toks[pos]
        if tok in ("syntax", "package"):
            while toks[pos] != ";":
                pos += 1
            pos += 1
        elif tok == "message":
            name = toks[pos + 1]
            pos += 2
            messages[name] = message_body(name)
        elif tok == "enum":
            name = toks[pos + 1]
            pos += 2
            enums[name] = enum_body()
        else:
            raise SystemExit(f"unexpected token {tok!r} at {pos}")
    return enums, messages


def main() -> None:
    source = Path(sys.argv[1])
    enums, messages = parse(source.read_text())
    lines = [
        '"""caffe.proto (BVLC Caffe 1.0, the code of BVLC master 9b89154) as data: written by',
        "tools/oracles/pycaffe/make_proto_table.py from Caffe's caffe.proto; do not edit.",
        "",
        "ENUMS: top-level enum -> ((value name, number), ...).",
        "MESSAGES: message -> (nested enums {name: values}, fields), each field",
        "(name, number, label, type, default text or None, packed). Caffe is BSD-2-Clause",
        '(Copyright (c) 2014-2017 The Regents of the University of California (Regents)."""',
        "# ruff: noqa: E501",
        "from __future__ import annotations",
        "",
        "Values = tuple[tuple[str, int], ...]",
        "Field = tuple[str, int, str, str, 'str | None', bool]",
        "",
        "ENUMS: dict[str, Values] = {",
    ]
    for name, values in enums.items():
        lines.append(f"    {name!r}: {tuple(values)!r},")
    lines += ["}", "", "MESSAGES: dict[str, tuple[dict[str, Values], tuple[Field, ...]]] = {"]
    for name, body in messages.items():
        lines.append(f"    {name!r}: (")
        enums = ", ".join(f"{k!r}: {tuple(v)!r}" for k, v in body["enums"].items())
        lines.append(f"        {{{enums}}},")
        lines.append("        (")
        for f in body["fields"]:
            lines.append(f"            {tuple(f)!r},")
        lines.append("        ),")
        lines.append("    ),")
    lines += ["}", ""]
    OUT.write_text("\n".join(lines))
    print(f"wrote {OUT}: {len(messages)} messages, {len(enums)} top-level enums")


if __name__ == "__main__":
    main()
