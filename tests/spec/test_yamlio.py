"""Safe YAML loading: line marks, duplicate keys, refused tags, readable failures."""
from __future__ import annotations

import pytest

from caffe_py.errors import SpecError
from caffe_py.spec import yamlio


def test_lines_of_keys_and_items():
    doc = yamlio.loads("name: n\nlayer:\n  - name: a\n    top: [x, y]\n  - name: b\n", "f.yaml")
    assert doc.line == 1 and doc.line_of("layer") == 2
    assert doc["layer"].item_lines == [3, 5]
    assert doc["layer"][1].line_of("name") == 5 and doc["layer"][0]["top"] == ["x", "y"]


def test_duplicate_key_names_both_lines():
    with pytest.raises(SpecError) as err:
        yamlio.loads("layer:\n  name: a\n  type: ReLU\n  name: b\n", "f.yaml")
    assert str(err.value) == ("f.yaml:4: duplicate key 'name' (first at line 2); remove one of "
                              "the two; a repeated field is a YAML list")


@pytest.mark.parametrize("tag", ["!!python/object/apply:os.system", "!!python/name:os.system",
                                 "!!python/object/new:os.system"])
def test_python_tags_are_refused_and_never_run(tag, tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(SpecError) as err:
        yamlio.loads(f"name: {tag} ['touch {marker}']\n", "f.yaml")
    assert str(err.value) == (f"f.yaml:1: tag 'tag:yaml.org,2002:{tag[2:]}' is not allowed; "
                              "specs are plain data; remove the tag")
    assert not marker.exists()


def test_invalid_yaml_points_at_the_line():
    with pytest.raises(SpecError) as err:
        yamlio.loads("name: n\nlayer: [a, b\n", "f.yaml")
    assert str(err.value) == ("f.yaml:3: invalid YAML: expected ',' or ']', but got '<stream end>'"
                              "; check the indentation and quoting near this line")


def test_missing_and_unreadable_files(tmp_path):
    with pytest.raises(SpecError) as err:
        yamlio.load(tmp_path / "none.yaml")
    assert str(err.value) == (f"{tmp_path / 'none.yaml'}: file not found; check the path "
                              "(relative to the current directory)")
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(SpecError) as err:
        yamlio.load(binary)
    assert str(err.value) == f"{binary}: not UTF-8 text (byte 0); save the spec as UTF-8"


def test_hostile_yaml_is_one_line(tmp_path):
    """Control characters, deep nesting, an alias bomb used as a key, devices, directories."""
    cases = {
        "\fbase_lr: 0.1\n": "ctrl.yaml:1:1: control character U+000C is not allowed in YAML; "
                            "remove it (e.g. a form feed or a NUL pasted in)",
        "name: x\nbad: \x00\n": "ctrl.yaml:2:6: control character U+0000 is not allowed in "
                                "YAML; remove it (e.g. a form feed or a NUL pasted in)",
        "name: " + "[" * 1000 + "]" * 1000 + "\n": "ctrl.yaml: nested too deeply to be a spec; "
                                                  "a spec nests a few levels; check the brackets",
        "a: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
        "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]\n? *c\n: 1\n":
            "ctrl.yaml:3: a key must be a plain name, not a list or a mapping; write the key "
            "as a word",
    }
    for text, message in cases.items():
        path = tmp_path / "ctrl.yaml"
        path.write_text(text)
        with pytest.raises(SpecError) as err:
            yamlio.load(path)
        assert str(err.value) == f"{tmp_path}/{message}"
    for device in ("/dev/zero", "/dev/urandom"):
        with pytest.raises(SpecError) as err:
            yamlio.load(device)
        assert str(err.value) == (f"{device}: not a regular file (a device or a pipe), not a "
                                  "spec; give a YAML file")
    with pytest.raises(SpecError) as err:
        yamlio.load(tmp_path)
    assert str(err.value) == f"{tmp_path}: a directory, not a spec; give a YAML file"
    with pytest.raises(SpecError) as err:
        yamlio.load(tmp_path / ("a" * 300 + ".yaml"))
    assert str(err.value).endswith(": cannot read (file name too long); check the path")
