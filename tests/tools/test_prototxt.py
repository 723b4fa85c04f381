"""The protobuf text-format reader: values, blocks, comments, positions and exact errors."""
from __future__ import annotations

import math

import pytest

from caffe_py.errors import CaffePyError, SpecError
from caffe_py.tools.prototxt import Ident, Message, PrototxtError, parse, parse_file

TRICKY = '''# a net header
name: "x" "y"  # joined, as in C
layer {
  kernel_size: 3 kernel_size: 5   # a repeated key, twice on one line
  block: { a: 1 }
  angle < b: -2.5e-3; c: 1E4, d: .5 >
  e: 1.5f
}
layer: { pool: MAX flag: true f: t }
x: [1, -2, 0x1F, 010]
y: [{ q: 1 }, { q: 2 }]
z: -inf w: nan v: Infinity
# tail of the file
'''


def _values(msg: Message, name: str) -> list:
    return [f.value for f in msg.all(name)]


def test_fields_keep_order_repeats_and_positions():
    msg = parse(TRICKY, "t.prototxt")
    assert [(f.name, f.line, f.column) for f in msg.fields] == [
        ("name", 2, 1), ("layer", 3, 1), ("layer", 9, 1), ("x", 10, 5), ("x", 10, 8),
        ("x", 10, 12), ("x", 10, 18), ("y", 11, 5), ("y", 11, 15), ("z", 12, 1), ("w", 12, 9),
        ("v", 12, 16)]
    assert msg.names() == ["name", "layer", "x", "y", "z", "w", "v"]
    assert msg.first("name").value == "xy"


def test_both_block_syntaxes_and_numbers():
    layer = parse(TRICKY).all("layer")[0].value
    assert _values(layer, "kernel_size") == [3, 5]
    assert layer.first("block").value.first("a").value == 1
    angle = layer.first("angle").value
    assert [(f.name, f.value) for f in angle.fields] == [("b", -0.0025), ("c", 10000.0),
                                                         ("d", 0.5)]
    assert type(angle.first("c").value) is float
    assert layer.first("e").value == 1.5
    msg = parse(TRICKY)
    assert _values(msg, "x") == [1, -2, 31, 8]        # hex, and octal as protobuf reads it
    assert [m.first("q").value for m in _values(msg, "y")] == [1, 2]
    assert msg.first("z").value == -math.inf
    assert math.isnan(msg.first("w").value)
    assert msg.first("v").value == math.inf


def test_identifiers_are_kept_apart_from_strings():
    second = parse(TRICKY).all("layer")[1].value
    pool, flag, f = (second.first(n).value for n in ("pool", "flag", "f"))
    assert (pool, flag, f) == ("MAX", "true", "t")
    assert all(isinstance(v, Ident) for v in (pool, flag, f))
    assert not isinstance(parse('s: "MAX"').first("s").value, Ident)


def test_comments_attach_to_the_next_field_or_the_line_they_end():
    msg = parse(TRICKY)
    assert msg.first("name").comments == [" a net header"]
    assert msg.first("name").trailing == " joined, as in C"
    layer = msg.first("layer").value
    assert layer.all("kernel_size")[1].trailing == " a repeated key, twice on one line"
    assert msg.tail == [" tail of the file"]
    assert msg.all("layer")[1].value.one_line is True
    assert msg.all("layer")[0].value.one_line is False


def test_string_escapes():
    msg = parse(r'''a: "tab\there\n" b: 'it\'s "q"' c: "\101\x42\u00e9\U0001F600" '''
                r'''d: "\303\251" e: "back\\slash\?"''')
    assert [f.value for f in msg.fields] == ["tab\there\n", "it's \"q\"", "ABé\U0001F600",
                                             "é", "back\\slash?"]


def test_empty_file_and_empty_blocks():
    assert parse("").fields == []
    msg = parse("# only a comment\n")
    assert msg.fields == [] and msg.tail == [" only a comment"]
    block = parse("a {}").first("a").value
    assert block.fields == [] and block.one_line is True
    assert parse("a: []").fields == []


@pytest.mark.parametrize("text, message", [
    ("a { b: 1", "net.prototxt:1:9: end of file inside the block opened at 1:3; "
                 "close it with '}'"),
    ("a < b: 1 }", "net.prototxt:1:10: '}' cannot close the block opened with '<' at 1:3; "
                   "close it with '>'"),
    ("a: 1\n}", "net.prototxt:2:1: '}' closes no open block; remove it, or open the block "
                "it closes"),
    ('a: "abc\nb: 1', 'net.prototxt:1:4: string is not closed; end it with " on the same line'),
    ("a 1", "net.prototxt:1:3: expected ':' or '{' after 'a', got '1'"),
    (": 1", "net.prototxt:1:1: expected a field name, got ':'; a field reads 'name: value' or "
            "'name { ... }'"),
    ("a: -MAX", "net.prototxt:1:5: '-MAX' is not a number; only numbers, inf and nan take "
                "a sign"),
    ("a: 08", "net.prototxt:1:4: '08' is not a valid number for 'a'; a leading 0 makes an "
              "octal number (digits 0-7)"),
    ("a: 5x", "net.prototxt:1:4: malformed number '5x'; write a number such as 5, -0.5 or 1e-4"),
    ("a: 1.2.3", "net.prototxt:1:4: malformed number '1.2.3'; write a number such as 5, -0.5 "
                 "or 1e-4"),
    ("\n  a: $", "net.prototxt:2:6: unexpected character '$'; remove it, or quote the value"),
    ("a: [1, 2 3]", "net.prototxt:1:10: expected ',' or ']' in the list 'a' (opened at 1:4), "
                    "got '3'"),
    ('a: "\\q"', "net.prototxt:1:5: invalid escape '\\q' in a string; write '\\\\' for a "
                 "backslash"),
    ('a: "\\377"', "net.prototxt:1:4: string escapes do not form UTF-8 text; write the text "
                   "itself, or \\u escapes"),
    ("a:", "net.prototxt:1:3: expected a value for 'a', got the end of the file; write a "
           "number, a quoted string, an enum name or a { ... } block"),
])
def test_errors_name_file_line_and_column(text, message):
    with pytest.raises(PrototxtError) as info:
        parse(text, "net.prototxt")
    assert str(info.value) == message
    assert isinstance(info.value, SpecError) and isinstance(info.value, CaffePyError)


def test_parse_file_errors(tmp_path):
    with pytest.raises(SpecError) as info:
        parse_file(tmp_path / "missing.prototxt")
    assert str(info.value) == (f"{tmp_path / 'missing.prototxt'}: file not found; check the "
                               "path (relative to the current directory)")
    binary = tmp_path / "weights.caffemodel"
    binary.write_bytes(b"\n\x05LeNet\xff\xfe")
    with pytest.raises(SpecError) as info:
        parse_file(binary)
    assert str(info.value) == (f"{binary}: not UTF-8 text (byte 7); a .prototxt is text; a "
                               "binary .caffemodel cannot be imported as a spec")
    good = tmp_path / "ok.prototxt"
    good.write_text("name: 'ok'\n")
    assert parse_file(good).first("name").value == "ok"


def test_a_device_a_pipe_or_an_oversized_file_is_refused_before_reading(tmp_path, monkeypatch):
    """import-prototxt read /dev/zero until memory ran out and waited on a FIFO forever; it
    now takes what a YAML spec takes: a regular file of at most 64 MiB."""
    import os

    from caffe_py.spec import yamlio

    os.mkfifo(tmp_path / "f.prototxt")
    for path in ("/dev/zero", str(tmp_path / "f.prototxt")):
        with pytest.raises(SpecError) as info:
            parse_file(path)
        assert str(info.value) == (f"{path}: not a regular file (a device or a pipe), not a "
                                   "spec; give a .prototxt file")
    (tmp_path / "big.prototxt").write_text("# padding\n" * 20 + 'name: "n"\n')
    monkeypatch.setattr(yamlio, "MAX_SPEC_BYTES", 64)
    with pytest.raises(SpecError) as info:
        parse_file(tmp_path / "big.prototxt")
    assert str(info.value) == (f"{tmp_path / 'big.prototxt'}: larger than 0 MiB, not a spec; "
                               "give a .prototxt file")
