"""`make data`: get Fashion-MNIST and convert it to data/fashion_mnist/{train,test}_lmdb.

The IDX files come from Debian's dataset-fashion-mnist package (installed with apt-get when
this runs as root), or from --source DIR. A database that is already complete is skipped, so
`make train` twice converts once; an interrupted conversion (a leftover *.partial) is resumed.

    python3 data/fashion_mnist.py [--source DIR] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from caffe_py.errors import CaffePyError, DataError
from caffe_py.io.db.lmdb_store import open_db, partial_path
from caffe_py.tools.convert import convert_idx, terminal_progress

DEBIAN_PACKAGE = "dataset-fashion-mnist"
DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
HERE = Path(__file__).resolve().parent
# split -> (images file, labels file, record count)
SPLITS = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", 60000),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", 10000),
}


def find_file(folder: Path, name: str) -> Path | None:
    """``name`` in ``folder``, gzipped or not."""
    for candidate in (folder / name, folder / name.removesuffix(".gz")):
        if candidate.is_file():
            return candidate
    return None


def missing_files(folder: Path) -> list[str]:
    names = [name for images, labels, _ in SPLITS.values() for name in (images, labels)]
    return [name for name in names if find_file(folder, name) is None]


def install_with_apt() -> None:
    """apt-get install the dataset package (apt-get update first if the package is unknown)."""
    command = ["apt-get", "install", "-y", "-q", DEBIAN_PACKAGE]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    print(f"installing {DEBIAN_PACKAGE}: {' '.join(command)}", flush=True)
    if subprocess.run(command, env=env).returncode == 0:
        return
    print("apt-get install failed; running apt-get update and trying again", flush=True)
    subprocess.run(["apt-get", "update", "-q"], env=env)
    if subprocess.run(command, env=env).returncode != 0:
        raise DataError(f"apt-get install {DEBIAN_PACKAGE} failed; install it by hand, or "
                        "download the four IDX .gz files from "
                        "https://github.com/zalandoresearch/fashion-mnist and pass --source DIR")


def ensure_source(source: Path | None) -> Path:
    """The folder holding the four IDX files, installing Debian's package if needed."""
    if source is not None:
        missing = missing_files(source)
        if missing:
            raise DataError(f"{source}: missing {', '.join(missing)}; download them from "
                            "https://github.com/zalandoresearch/fashion-mnist")
        return source
    if not missing_files(DEBIAN_DIR):
        return DEBIAN_DIR
    if os.geteuid() == 0 and shutil.which("apt-get"):
        install_with_apt()
        if not missing_files(DEBIAN_DIR):
            return DEBIAN_DIR
    raise DataError(f"Fashion-MNIST is not in {DEBIAN_DIR}: run `sudo apt-get install "
                    f"{DEBIAN_PACKAGE}` then `make data` again, or download the four IDX .gz "
                    "files from https://github.com/zalandoresearch/fashion-mnist and run "
                    "`python3 data/fashion_mnist.py --source DIR`")


def convert_split(source: Path, out: Path, split: str) -> str:
    """Convert one split unless its database is already complete; returns the summary line."""
    images, labels, count = SPLITS[split]
    db = out / f"{split}_lmdb"
    if db.exists():
        with open_db(db) as reader:
            found = len(reader)
        if found != count:
            raise DataError(f"{db} holds {found} records, not Fashion-MNIST's {count}; delete "
                            "it and run `make data` again")
        return f"{db}: complete ({count} records), skipped"
    resume = partial_path(db).exists()
    result = convert_idx(find_file(source, images), find_file(source, labels), db,
                         resume=resume, progress=terminal_progress())
    if result.records != count:
        raise DataError(f"{db} holds {result.records} records, not Fashion-MNIST's {count}; "
                        "check the files in --source")
    return result.line()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=None,
                        help=f"folder with the four IDX files (default {DEBIAN_DIR})")
    parser.add_argument("--out", type=Path, default=Path(os.path.relpath(HERE / "fashion_mnist")),
                        help="where train_lmdb and test_lmdb go (default data/fashion_mnist)")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    try:
        source = ensure_source(args.source)
        for split in SPLITS:
            print(convert_split(source, args.out, split), flush=True)
    except CaffePyError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Interrupted: run `make data` again to resume", file=sys.stderr)
        return 130
    print(f"Fashion-MNIST ready in {args.out} ({time.perf_counter() - began:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
