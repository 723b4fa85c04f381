"""Write tests/pycaffe/fixtures/: each example of pycaffe_cases.py run under BVLC's pycaffe.

    GLOG_minloglevel=2 python tools/oracles/pycaffe/make_fixtures.py [--only a,b] [--check]

needs BVLC Caffe 1.0 with pycaffe in /opt/caffe (../shared/caffe/build_caffe.sh: the code of
BVLC master 9b89154 from Debian's `caffe` source package, CPU-only; ``caffe.__version__``
1.0.0), run by the CPython 3.11 that runs caffe-py (numpy 2, scikit-image, matplotlib, pydot
and protobuf installed). For each case, prep.py makes a workspace, record.py runs the script
in it under BVLC's pycaffe, and what it printed, plotted and wrote becomes the case's fixture
directory (arrays stored as float32). ``--check`` also runs each case under caffe-py
(``python -m caffe_py.pycaffe``) and prints every difference compare.py finds, with both
run times. CI never runs this: tests/pycaffe/test_pycaffe_examples.py compares caffe-py's runs with
the fixtures.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compare import compare  # noqa: E402
from prep import digest, prepare  # noqa: E402
from pycaffe_cases import CASES  # noqa: E402
from runs import REPO, run_case  # noqa: E402

FIXTURES = REPO / "tests" / "pycaffe" / "fixtures"


def store(result: Path, fixture: Path, inputs: dict[str, str]) -> None:
    if fixture.exists():
        shutil.rmtree(fixture)
    (fixture / "files").mkdir(parents=True)
    (fixture / "inputs.json").write_text(json.dumps(inputs, indent=1, sort_keys=True) + "\n")
    for name in ("stdout.txt", "texts.json"):
        shutil.copyfile(result / name, fixture / name)
    with np.load(result / "plots.npz") as plots:
        np.savez_compressed(fixture / "plots.npz",
                            **{k: plots[k].astype(np.float32) for k in plots.files})
    for item in (result / "files").iterdir():
        if item.suffix == ".npz":
            with np.load(item) as arrays:
                np.savez_compressed(fixture / "files" / item.name,
                                    **{k: arrays[k].astype(np.float32) for k in arrays.files})
        else:
            shutil.copyfile(item, fixture / "files" / item.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated case names")
    parser.add_argument("--check", action="store_true", help="also run caffe-py and compare")
    parser.add_argument("--keep", default="", help="a directory to keep the workspaces in")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(CASES)
    scratch = Path(args.keep or tempfile.mkdtemp(prefix="pycaffe_oracle_"))
    failed = False
    for name in names:
        case = CASES[name]
        work = scratch / "bvlc" / name
        prepare(name, work)
        inputs = digest(work)
        bvlc = run_case(case, work, scratch / "bvlc_out" / name, "bvlc")
        store(scratch / "bvlc_out" / name, FIXTURES / name, inputs)
        line = f"{name}: BVLC pycaffe {bvlc:.1f} s"
        if args.check:
            mine = scratch / "caffe_py" / name
            prepare(name, mine)
            seconds = run_case(case, mine, scratch / "caffe_py_out" / name, "caffe-py")
            problems = compare(FIXTURES / name, scratch / "caffe_py_out" / name, case)
            line += f", caffe-py {seconds:.1f} s, {len(problems)} difference(s)"
            failed |= bool(problems)
            for problem in problems:
                line += f"\n    {problem}"
        print(line, flush=True)
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
