"""A reader for protobuf text format, the syntax of Caffe's .prototxt files.

It knows no schema: :func:`parse` returns a :class:`Message`, an ordered list of
:class:`Field` (name, value, line, column, comments), where a value is a nested Message, an
``int``, a ``float``, a ``str`` (a quoted string) or an :class:`Ident` (a bare identifier: an
enum value such as ``MAX``, or a spelling of a bool such as ``true`` or ``t``). Repeated keys
stay separate fields in file order; the caller, who knows the schema, groups them.

The grammar is protobuf's TextFormat: ``key: value``, ``key { ... }``, ``key: { ... }`` and
``key < ... >``, lists ``key: [v1, v2]``, optional ``,`` or ``;`` after a field, ``#``
comments, strings in single or double quotes with C escapes (adjacent strings are joined),
decimal, hex and octal integers, floats with exponents and an optional ``f`` suffix, and
``inf`` / ``nan`` with an optional sign. Every error is a :class:`PrototxtError` that names
``file:line:column``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import SpecError
from ..spec.yamlio import read_spec_bytes

# Bare words protobuf accepts for a bool field.
BOOL_WORDS = {"true": True, "True": True, "t": True, "false": False, "False": False, "f": False}
_FLOAT_WORDS = {"inf": float("inf"), "infinity": float("inf"), "nan": float("nan")}

_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?[fF]?")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OCTAL = re.compile(r"[0-7]{1,3}")
_SYMBOLS = "{}<>:[],;-"
_SIMPLE_ESCAPES = {"n": b"\n", "t": b"\t", "r": b"\r", "a": b"\a", "b": b"\b", "f": b"\f",
                   "v": b"\v", "\\": b"\\", "'": b"'", '"': b'"', "?": b"?"}
_CLOSING = {"{": "}", "<": ">"}


class PrototxtError(SpecError):
    """A .prototxt that does not parse, or that no upgrade rule can convert.

    The message reads ``file:line:column: problem; fix``.
    """

    def __init__(self, problem: str, *, file: str, line: int, column: int,
                 fix: str | None = None):
        super().__init__(problem, file=file, line=line, column=column, fix=fix)


class Ident(str):
    """A bare identifier value (an enum name such as MAX, or true/false)."""


@dataclass
class Message:
    """A ``{ ... }`` block (or the whole file): its fields in order and where it starts.

    ``one_line`` is True when the block opened and closed on the same line; ``tail`` holds the
    comments written after its last field.
    """

    fields: list[Field] = field(default_factory=list)
    line: int = 1
    column: int = 1
    one_line: bool = False
    tail: list[str] = field(default_factory=list)

    def all(self, name: str) -> list[Field]:
        """Every field called ``name``, in order."""
        return [f for f in self.fields if f.name == name]

    def first(self, name: str) -> Field | None:
        return next((f for f in self.fields if f.name == name), None)

    def names(self) -> list[str]:
        """The distinct field names, in order of first appearance."""
        return list(dict.fromkeys(f.name for f in self.fields))


@dataclass
class Field:
    """One ``name: value`` or ``name { ... }``; ``comments`` are the lines just above it."""

    name: str
    value: Message | int | float | str
    line: int
    column: int
    comments: list[str] = field(default_factory=list)
    trailing: str | None = None


@dataclass
class _Token:
    kind: str      # "ident", "number", "string", "symbol" or "eof"
    text: str      # the source text (strings: the decoded value)
    line: int
    column: int
    end_line: int
    leading: list[str] = field(default_factory=list)   # comment lines just before the token
    trailing: str | None = None                        # a comment after it on its line


def parse(text: str, source: str = "<string>") -> Message:
    """Parse protobuf text; errors name ``source:line:column``."""
    return _Parser(_tokenize(text, source), source).parse_file()


def parse_file(path: str | Path) -> Message:
    """Parse a .prototxt file; a missing or unreadable file is a one-line error."""
    path = Path(path)
    data = read_spec_bytes(path, "give a .prototxt file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"not UTF-8 text (byte {exc.start})", file=str(path),
                        fix="a .prototxt is text; a binary .caffemodel cannot be imported "
                            "as a spec") from None
    return parse(text, str(path))


# --- tokens ---------------------------------------------------------------------------------
def _tokenize(text: str, source: str) -> list[_Token]:
    tokens: list[_Token] = []
    pending: list[str] = []
    i, line, line_start = 0, 1, 0
    n = len(text)
    while i < n:
        ch = text[i]
        col = i - line_start + 1
        if ch == "\n":
            i, line, line_start = i + 1, line + 1, i + 1
        elif ch in " \t\r\f\v":
            i += 1
        elif ch == "#":
            end = text.find("\n", i)
            end = n if end < 0 else end
            comment = text[i + 1:end].rstrip()
            if tokens and tokens[-1].end_line == line and tokens[-1].trailing is None \
                    and not pending:
                tokens[-1].trailing = comment
            else:
                pending.append(comment)
            i = end
        elif ch in "\"'":
            value, i = _read_string(text, i, line, line_start, source)
            tokens.append(_Token("string", value, line, col, line, pending))
            pending = []
        elif ch.isdigit() or (ch == "." and i + 1 < n and text[i + 1].isdigit()):
            m = _match_at(_NUMBER, text, i)
            end = m.end()
            if end < n and (text[end].isalnum() or text[end] in "_."):
                raise PrototxtError(f"malformed number '{_word_at(text, i)}'", file=source,
                                    line=line, column=col,
                                    fix="write a number such as 5, -0.5 or 1e-4")
            tokens.append(_Token("number", m.group(), line, col, line, pending))
            pending, i = [], end
        elif ch.isalpha() or ch == "_":
            m = _match_at(_IDENT, text, i)
            tokens.append(_Token("ident", m.group(), line, col, line, pending))
            pending, i = [], m.end()
        elif ch in _SYMBOLS:
            tokens.append(_Token("symbol", ch, line, col, line, pending))
            pending, i = [], i + 1
        else:
            raise PrototxtError(f"unexpected character {ch!r}", file=source, line=line,
                                column=col, fix="remove it, or quote the value")
    tokens.append(_Token("eof", "", line, i - line_start + 1, line, pending))
    return tokens


def _read_string(text: str, i: int, line: int, line_start: int,
                 source: str) -> tuple[str, int]:
    """Decode the quoted string at ``text[i]``; returns (value, the index after it).

    Protobuf strings are bytes: octal and hex escapes give bytes and the whole is decoded as
    UTF-8, so '\\303\\251' is 'é' as protoc reads it.
    """
    quote, start_col = text[i], i - line_start + 1
    out = bytearray()
    i += 1
    while True:
        if i >= len(text) or text[i] == "\n":
            raise PrototxtError("string is not closed", file=source, line=line,
                                column=start_col, fix=f"end it with {quote} on the same line")
        ch = text[i]
        if ch == quote:
            i += 1
            break
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        value, i = _read_escape(text, i, source, line, line_start)
        out += value
    try:
        return out.decode("utf-8"), i
    except UnicodeDecodeError:
        raise PrototxtError("string escapes do not form UTF-8 text", file=source, line=line,
                            column=start_col, fix="write the text itself, or \\u escapes") \
            from None


def _match_at(pattern: re.Pattern[str], text: str, i: int) -> re.Match[str]:
    """``pattern`` matched at ``i``, where the caller has seen a character it starts with."""
    m = pattern.match(text, i)
    assert m is not None, f"{pattern.pattern!r} at {i}"
    return m


def _read_escape(text: str, i: int, source: str, line: int, line_start: int) -> tuple[bytes, int]:
    """The bytes of the escape starting at the backslash ``text[i]``."""
    col = i - line_start + 1
    nxt = text[i + 1] if i + 1 < len(text) else ""
    if nxt in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[nxt], i + 2
    if nxt and nxt in "01234567":
        m = _match_at(_OCTAL, text, i + 1)
        return bytes([int(m.group(), 8) & 0xFF]), m.end()
    if nxt in ("x", "X"):
        hex_match = re.compile(r"[0-9a-fA-F]{1,2}").match(text, i + 2)
        if hex_match:
            return bytes([int(hex_match.group(), 16)]), hex_match.end()
    if nxt in ("u", "U"):
        width = 4 if nxt == "u" else 8
        digits = text[i + 2:i + 2 + width]
        hexdigits = len(digits) == width and all(c in "0123456789abcdefABCDEF" for c in digits)
        if hexdigits and int(digits, 16) <= 0x10FFFF:
            return chr(int(digits, 16)).encode("utf-8", "surrogatepass"), i + 2 + width
    raise PrototxtError(f"invalid escape '\\{nxt}' in a string", file=source, line=line,
                        column=col, fix="write '\\\\' for a backslash")


def _word_at(text: str, i: int) -> str:
    m = re.compile(r"[\w.+-]+").match(text, i)
    return m.group() if m else text[i]


# --- grammar --------------------------------------------------------------------------------
MAX_DEPTH = 100
"""The deepest nesting of blocks read (protobuf's own parsers stop at 100; Caffe's nets and
solvers nest a few levels)."""


class _Parser:
    def __init__(self, tokens: list[_Token], source: str):
        self.tokens, self.source, self.pos = tokens, source, 0
        self.depth = 0

    def parse_file(self) -> Message:
        msg = Message(line=1, column=1)
        self._fields(msg, opener=None)
        return msg

    # - helpers
    def peek(self) -> _Token:
        return self.tokens[self.pos]

    def take(self) -> _Token:
        tok = self.tokens[self.pos]
        self.pos += 1
        return tok

    def at(self, symbol: str) -> bool:
        tok = self.peek()
        return tok.kind == "symbol" and tok.text == symbol

    def fail(self, tok: _Token, problem: str, fix: str | None = None) -> PrototxtError:
        return PrototxtError(problem, file=self.source, line=tok.line, column=tok.column,
                             fix=fix)

    # - productions
    def _fields(self, msg: Message, opener: _Token | None) -> _Token:
        """Fields up to the symbol closing ``opener`` (or the end of the file when None);
        returns the last token."""
        closing = _CLOSING[opener.text] if opener is not None else None
        while True:
            tok = self.peek()
            if tok.kind == "eof":
                if opener is not None:
                    raise self.fail(tok, f"end of file inside the block opened at "
                                         f"{opener.line}:{opener.column}",
                                    f"close it with '{closing}'")
                msg.tail = tok.leading
                return tok
            if tok.kind == "symbol" and tok.text == closing:
                self.take()
                msg.tail = tok.leading
                msg.one_line = opener is not None and opener.line == tok.line
                return tok
            if tok.kind == "symbol" and tok.text in "}>":
                if opener is None:
                    raise self.fail(tok, f"'{tok.text}' closes no open block",
                                    "remove it, or open the block it closes")
                raise self.fail(tok, f"'{tok.text}' cannot close the block opened with "
                                     f"'{opener.text}' at {opener.line}:{opener.column}",
                                f"close it with '{closing}'")
            msg.fields.extend(self._field())
            if self.at(",") or self.at(";"):
                self.take()

    def _field(self) -> list[Field]:
        name = self.take()
        if name.kind != "ident":
            raise self.fail(name, f"expected a field name, got {_show(name)}",
                            "a field reads 'name: value' or 'name { ... }'")
        if self.at(":"):
            self.take()
            if self.at("["):
                return self._list(name)
            value, trailing = self._value(name)
        elif self.at("{") or self.at("<"):
            value, trailing = self._block()
        else:
            raise self.fail(self.peek(), f"expected ':' or '{{' after '{name.text}', "
                                         f"got {_show(self.peek())}")
        return [Field(name.text, value, name.line, name.column, name.leading, trailing)]

    def _value(self, name: _Token) -> tuple[Message | int | float | str, str | None]:
        """The value after ``name:`` and the comment written after it on its line."""
        if self.at("{") or self.at("<"):
            return self._block()
        tok = self.peek()
        if tok.kind == "string":
            parts = [self.take()]
            while self.peek().kind == "string":  # "a" "b" is "ab", as in C
                parts.append(self.take())
            return "".join(p.text for p in parts), parts[-1].trailing
        if tok.kind == "symbol" and tok.text == "-":
            self.take()
            number = self.peek()
            return -self._number(number, name), number.trailing
        if tok.kind in ("number", "ident"):
            return self._scalar(tok, name), tok.trailing
        raise self.fail(tok, f"expected a value for '{name.text}', got {_show(tok)}",
                        "write a number, a quoted string, an enum name or a { ... } block")

    def _scalar(self, tok: _Token, name: _Token) -> int | float | str:
        """A number, inf/nan, or a bare identifier (an enum value)."""
        if tok.kind == "ident" and tok.text.lower() not in _FLOAT_WORDS:
            self.take()
            return Ident(tok.text)
        return self._number(tok, name)

    def _number(self, tok: _Token, name: _Token) -> int | float:
        """A number or inf/nan: what may follow a '-'."""
        if tok.kind == "ident":
            word = tok.text.lower()
            if word not in _FLOAT_WORDS:
                raise self.fail(tok, f"'-{tok.text}' is not a number",
                                "only numbers, inf and nan take a sign")
            self.take()
            return _FLOAT_WORDS[word]
        if tok.kind != "number":
            raise self.fail(tok, f"expected a number after '-', got {_show(tok)}")
        self.take()
        try:
            return _number_value(tok.text)
        except ValueError:
            raise self.fail(tok, f"'{tok.text}' is not a valid number for '{name.text}'",
                            "a leading 0 makes an octal number (digits 0-7)") from None

    def _block(self) -> tuple[Message, str | None]:
        opener = self.take()
        if self.depth >= MAX_DEPTH:
            raise self.fail(opener, f"blocks nested deeper than {MAX_DEPTH} levels, not a "
                                    "spec", "a net or solver nests a few levels; check the "
                                            "braces")
        msg = Message(line=opener.line, column=opener.column)
        self.depth += 1
        closer = self._fields(msg, opener)
        self.depth -= 1
        return msg, opener.trailing or closer.trailing

    def _list(self, name: _Token) -> list[Field]:
        """``name: [v1, v2]``: one field per item, as protobuf reads it."""
        opener = self.take()
        out: list[Field] = []
        if self.at("]"):
            self.take()
            return out
        while True:
            tok = self.peek()
            value, trailing = self._value(name)
            out.append(Field(name.text, value, tok.line, tok.column,
                             name.leading if not out else [], trailing))
            if self.at(","):
                self.take()
                continue
            if self.at("]"):
                self.take()
                return out
            raise self.fail(self.peek(), f"expected ',' or ']' in the list '{name.text}' "
                                         f"(opened at {opener.line}:{opener.column}), "
                                         f"got {_show(self.peek())}")


def _number_value(text: str) -> int | float:
    if text[:2] in ("0x", "0X"):
        return int(text, 16)
    if text[-1] in "fF":
        return float(text[:-1])
    if any(c in text for c in ".eE"):
        return float(text)
    if len(text) > 1 and text[0] == "0":
        return int(text, 8)  # protobuf reads a leading 0 as octal
    return int(text)


def _show(tok: _Token) -> str:
    if tok.kind == "eof":
        return "the end of the file"
    if tok.kind == "string":
        return f"the string {tok.text!r}"
    return f"'{tok.text}'"


__all__ = ["BOOL_WORDS", "Field", "Ident", "Message", "PrototxtError", "parse", "parse_file"]
