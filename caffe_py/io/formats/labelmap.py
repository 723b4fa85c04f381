"""SSD's label map files: a LabelMap prototxt of ``item { name label display_name }`` entries
(data/VOC0712/labelmap_voc.prototxt), read and written as the fork's tools do."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...errors import DataError, SpecError


@dataclass(frozen=True)
class LabelMapItem:
    name: str
    label: int
    display_name: str


def read_label_map(path: str | Path) -> list[LabelMapItem]:
    """The items of a LabelMap prototxt, in file order. A missing file, a malformed one or an
    item without name or label is a DataError naming the file."""
    from ...tools.prototxt import parse

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DataError(f"{path}: cannot read the label map ({exc.strerror}); give "
                        "label_map_file / --label-map-file an existing LabelMap "
                        "prototxt") from None
    try:
        msg = parse(text, str(path))
    except SpecError as exc:
        raise DataError(str(exc)) from None
    items = []
    for f in msg.fields:
        if f.name != "item" or not hasattr(f.value, "fields"):
            raise DataError(f"{path}:{f.line}: expected 'item {{ ... }}' entries, found "
                            f"'{f.name}'")
        values = {g.name: g.value for g in f.value.fields}
        if "name" not in values or "label" not in values:
            raise DataError(f"{path}:{f.line}: a label map item needs a name and a label")
        name, label = str(values["name"]), values["label"]
        if not isinstance(label, int):
            raise DataError(f"{path}:{f.line}: label {label!r} of '{name}' is not an integer")
        items.append(LabelMapItem(name, label, str(values.get("display_name", name))))
    return items


def name_to_label(items: list[LabelMapItem], *, strict: bool = False,
                  source: str = "label map") -> dict[str, int]:
    """MapNameToLabel: with ``strict``, a name twice is an error; else the last one wins."""
    out: dict[str, int] = {}
    for item in items:
        if strict and item.name in out:
            raise DataError(f"{source}: the name '{item.name}' appears twice (--check-label)")
        out[item.name] = item.label
    return out


def write_label_map(path: str | Path, items: list[LabelMapItem]) -> None:
    """A LabelMap prototxt as the fork's scripts write one."""
    lines = []
    for item in items:
        lines += ["item {", f'  name: "{item.name}"', f"  label: {item.label}",
                  f'  display_name: "{item.display_name}"', "}"]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")
