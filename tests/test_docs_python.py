"""docs/python.md runs as written: its python blocks, in order, in one namespace, from the
repository root, with what each prints compared against the comment beside it."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def expected_prints(code: str) -> list[str]:
    """The '# ...' comment after each print( line: what the line prints."""
    out = []
    lines = code.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("print("):
            comment = line.partition("#")[2].strip() if "#" in line else \
                lines[i + 1].lstrip("# ").strip()
            out.append(comment)
    return out


def test_the_python_page_runs_and_prints_what_it_says(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    blocks = BLOCK.findall((ROOT / "docs" / "python.md").read_text())
    assert len(blocks) == 7
    namespace: dict = {}
    for code in blocks:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "docs/python.md", "exec"), namespace)  # noqa: S102
        assert printed.getvalue().splitlines() == expected_prints(code), code
    # the training example wrote its snapshots under its own temporary directory
    assert not (ROOT / "snaps").exists()
