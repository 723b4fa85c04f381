"""The session check that the suite leaves the checkout as it found it (tests/conftest.py),
on a planted repository: what it reports, and what it lets pass."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from support import ROOT, tree_changes, tree_state

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(repo, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                   check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("/out/\n__pycache__/\n")
    (tmp_path / "kept.txt").write_text("a\n")
    (tmp_path / "dirty.txt").write_text("b\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "start")
    (tmp_path / "dirty.txt").write_text("b, edited before the session\n")
    return tmp_path


def _touch_later(path) -> None:
    """Write ``path`` with a modification time clearly after its last one."""
    stat = path.stat() if path.exists() else None
    path.write_text("changed by a test\n")
    if stat is not None:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))


def test_an_unchanged_tree_passes_even_when_it_was_dirty_before(repo):
    before = tree_state(repo)
    assert set(before) == {"dirty.txt"}
    (repo / "__pycache__").mkdir()
    (repo / "__pycache__" / "m.pyc").write_bytes(b"")  # caches are not the checkout's files
    (repo / ".hypothesis" / "constants").mkdir(parents=True)
    (repo / ".hypothesis" / "constants" / "a1").write_bytes(b"")
    assert tree_changes(before, tree_state(repo)) == []


@pytest.mark.parametrize("change, expected", [
    (lambda repo: _touch_later(repo / "kept.txt"), ["kept.txt"]),
    (lambda repo: _touch_later(repo / "dirty.txt"), ["dirty.txt"]),
    (lambda repo: (repo / "set by the test").write_bytes(b"\x89HDF"), ["set by the test"]),
    (lambda repo: ((repo / "out").mkdir(), (repo / "out" / "snap.caffemodel").write_text("")),
     ["out/snap.caffemodel"]),
    (lambda repo: (repo / "kept.txt").unlink(), ["kept.txt"]),
], ids=["tracked file written", "dirty file written again", "new file", "ignored file",
        "tracked file deleted"])
def test_a_planted_change_is_reported(repo, change, expected):
    before = tree_state(repo)
    change(repo)
    assert tree_changes(before, tree_state(repo)) == expected


def test_outside_a_checkout_there_is_nothing_to_compare(tmp_path):
    assert tree_state(tmp_path / "not_a_repo") is None


def test_the_suite_runs_in_a_checkout_it_can_look_at():
    """The session fixture checks this checkout (a tree git cannot read would pass unseen)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not run from a git checkout")
    assert tree_state(ROOT) is not None
