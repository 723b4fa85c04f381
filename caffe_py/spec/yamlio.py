"""Safe YAML loading that remembers where every key came from.

Mappings load as :class:`MarkedDict` and sequences as :class:`MarkedList`; both carry the
1-based line of the node and of each key or item, so that validation errors can point at
``file:line``. Duplicate keys are an error (PyYAML silently keeps the last one), and any tag
that would construct a Python object (``!!python/...``) is refused before anything runs:
the loader has ``yaml.SafeLoader``'s constructors, which have none for those tags.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ..errors import SpecError


class MarkedDict(dict):
    """A mapping with ``line`` (its own) and ``key_lines`` (each key's)."""

    line: int = 0
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class MarkedList(list):
    """A sequence with ``line`` (its own) and ``item_lines`` (each item's)."""

    line: int = 0
    item_lines: list[int]

    def line_of(self, index: int) -> int:
        return self.item_lines[index] if index < len(self.item_lines) else self.line


class _Marked:
    """The constructors of a safe loader that builds marked containers and rejects duplicate
    keys (mixed into PyYAML's and libyaml's safe loaders)."""

    source = "<string>"

    def construct_mapping(self, node, deep=False):  # noqa: D102 (PyYAML hook)
        if not isinstance(node, yaml.MappingNode):
            raise yaml.constructor.ConstructorError(None, None, "expected a mapping",
                                                    node.start_mark)
        self.flatten_mapping(node)
        out = MarkedDict()
        out.line = node.start_mark.line + 1
        out.key_lines = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):  # (also an alias bomb as a key)
                raise SpecError("a key must be a plain name, not a list or a mapping",
                                file=self.source, line=key_node.start_mark.line + 1,
                                fix="write the key as a word")
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                key = str(key)
            line = key_node.start_mark.line + 1
            if key in out:
                raise SpecError(f"duplicate key '{key}' (first at line {out.key_lines[key]})",
                                file=self.source, line=line,
                                fix="remove one of the two; a repeated field is a YAML list")
            out[key] = self.construct_object(value_node, deep=True)
            out.key_lines[key] = line
        return out

    def construct_sequence(self, node, deep=False):  # noqa: D102 (PyYAML hook)
        out = MarkedList(self.construct_object(child, deep=True) for child in node.value)
        out.line = node.start_mark.line + 1
        out.item_lines = [child.start_mark.line + 1 for child in node.value]
        return out

    @classmethod
    def register(cls) -> None:
        cls.add_constructor("tag:yaml.org,2002:map", cls.construct_mapping)  # type: ignore[attr-defined]
        cls.add_constructor("tag:yaml.org,2002:seq", cls.construct_sequence)  # type: ignore[attr-defined]


class _MarkedLoader(_Marked, yaml.SafeLoader):
    """PyYAML's own parser: the reference, and the one whose messages errors quote."""


_MarkedLoader.register()

def _fast_loader() -> type[_Marked] | None:
    """A marked loader on libyaml's parser (PyYAML's wheels have it: 3x faster on a large
    spec), or None without libyaml."""
    if not hasattr(yaml, "CSafeLoader"):
        return None

    class _FastLoader(_Marked, yaml.CSafeLoader):
        pass

    _FastLoader.register()
    return _FastLoader


_FastLoader = _fast_loader()


MAX_DEPTH = 100
"""The deepest nesting of mappings and lists read (a spec nests a few levels)."""
MAX_VALUES = 2_000_000
"""The most scalars, mappings and lists a spec may hold (each key and value counts; about 40
a layer): with MAX_LAYERS of net_spec, a bound on the time a spec takes to load."""
_TOO_DEEP = ("nested too deeply to be a spec", "a spec nests a few levels; check the brackets")
_STARTS = (yaml.MappingStartEvent, yaml.SequenceStartEvent)
_ENDS = (yaml.MappingEndEvent, yaml.SequenceEndEvent)


MAX_SPEC_BYTES = 64 << 20
"""The largest spec file read (the largest real nets' specs are a few hundred KB)."""


def loads(text: str, source: str = "<string>") -> Any:
    """Parse YAML text; errors name ``source`` and the line.

    libyaml loads a well-formed spec; its nesting is measured first from its event stream
    (libyaml's parser keeps its own stack, its composer recurses in C), and a spec with an
    error is loaded again by PyYAML's parser, whose messages the errors quote."""
    if _FastLoader is not None:
        try:
            _check_depth(text, source)
            return _load(_FastLoader, text, source)
        except yaml.YAMLError:
            pass
    return _load(_MarkedLoader, text, source)


def _check_depth(text: str, source: str) -> None:
    """Nesting past MAX_DEPTH and more than MAX_VALUES values are refused from the event
    stream, before anything is built."""
    depth = 0
    for count, event in enumerate(yaml.parse(text, Loader=yaml.CSafeLoader)):
        if count > MAX_VALUES:
            raise SpecError(f"more than {MAX_VALUES:,} YAML values, not a spec (the largest "
                            "nets have a few hundred thousand)", file=source,
                            line=event.start_mark.line + 1,
                            fix="check the generator that wrote the spec")
        if isinstance(event, _STARTS):
            depth += 1
            if depth > MAX_DEPTH:
                raise SpecError(_TOO_DEEP[0], file=source, fix=_TOO_DEEP[1])
        elif isinstance(event, _ENDS):
            depth -= 1


def _load(loader_class: type, text: str, source: str) -> Any:
    try:
        loader = loader_class(text)  # the reader refuses control characters here
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text, source) from None
    loader.source = source
    try:
        return loader.get_single_data()
    except SpecError:
        raise
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text, source) from None
    except RecursionError:
        raise SpecError(_TOO_DEEP[0], file=source, fix=_TOO_DEEP[1]) from None
    except yaml.YAMLError:
        if loader_class is not _MarkedLoader:
            raise   # said again by PyYAML's parser
        raise _yaml_error(sys.exc_info()[1], source) from None
    finally:
        loader.dispose()


def _yaml_error(exc: Any, source: str) -> SpecError:
    if isinstance(exc, yaml.constructor.ConstructorError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        tag = _tag_of(exc)
        if tag is not None:
            return SpecError(f"tag '{tag}' is not allowed", file=source, line=line,
                             fix="specs are plain data; remove the tag")
        return SpecError(str(exc.problem), file=source, line=line)
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark else None
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return SpecError(f"invalid YAML: {problem}", file=source, line=line,
                     fix="check the indentation and quoting near this line")


FOREIGN: dict[str, Callable[[Path], str]] = {}
"""Readers of other spec formats by file suffix, each giving the YAML text of a file (the
command line registers Caffe's ``.prototxt``: read as `cpy import-prototxt` converts it)."""


def load(path: str | Path) -> Any:
    """Load a YAML file (or a file of a :data:`FOREIGN` format); a missing or unreadable file
    is a one-line :class:`SpecError`."""
    path = Path(path)
    reader = FOREIGN.get(path.suffix.lower())
    if reader is not None and path.is_file():
        return loads(reader(path), source=str(path))
    data = read_spec_bytes(path, "give a YAML file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"not UTF-8 text (byte {exc.start})", file=str(path),
                        fix="save the spec as UTF-8") from None
    return loads(text, source=str(path))


def read_spec_bytes(path: Path, fix: str) -> bytes:
    """A spec file's bytes (a YAML spec, a prototxt): a regular file of at most
    :data:`MAX_SPEC_BYTES`; a directory, a device or a pipe (``/dev/zero`` would be read until
    memory ran out, a FIFO waited on) and a missing or unreadable file are one-line
    SpecErrors ending in ``fix``."""
    try:
        if path.exists() and not path.is_file():
            kind = "a directory" if path.is_dir() else "not a regular file (a device or a pipe)"
            raise SpecError(f"{kind}, not a spec", file=str(path), fix=fix)
        with path.open("rb") as file:
            data = file.read(MAX_SPEC_BYTES + 1)
        if len(data) > MAX_SPEC_BYTES:
            raise SpecError(f"larger than {MAX_SPEC_BYTES >> 20} MiB, not a spec",
                            file=str(path), fix=fix)
        return data
    except FileNotFoundError:
        raise SpecError("file not found", file=str(path),
                        fix="check the path (relative to the current directory)") from None
    except OSError as exc:
        raise SpecError(f"cannot read ({(exc.strerror or type(exc).__name__).lower()})",
                        file=str(path), fix="check the path") from None


def _reader_error(exc: yaml.reader.ReaderError, text: str, source: str) -> SpecError:
    """A character YAML does not allow (a control character), with its line and column."""
    at = max(0, min(exc.position, len(text)))
    line = text.count("\n", 0, at) + 1
    column = at - (text.rfind("\n", 0, at) + 1) + 1
    char = exc.character if isinstance(exc.character, str) else chr(exc.character)
    return SpecError(f"control character U+{ord(char):04X} is not allowed in YAML",
                     file=source, line=line, column=column,
                     fix="remove it (e.g. a form feed or a NUL pasted in)")


def _tag_of(exc: yaml.constructor.ConstructorError) -> str | None:
    """The offending tag of a 'could not determine a constructor' error, if that is what it is."""
    problem = str(exc.problem or "")
    marker = "constructor for the tag '"
    if marker not in problem:
        return None
    return problem.split(marker, 1)[1].split("'", 1)[0]
