"""benchmarks/split_test.py on CPU replicas (--cpu): one replica and two each run `cpy train`
with a test pass every other iteration, and the table gives each run's passes, its last pass
and whether every pass printed one replica's lines."""
from __future__ import annotations

import json
import re

from support import load_benchmark


def test_the_split_test_benchmark_runs_on_cpu_replicas(tmp_path):
    bench = load_benchmark("split_test")
    rows = bench.main(["--out", str(tmp_path), "--cpu", "--max-gpus", "2", "--models",
                       "lenet", "--passes", "3"])
    assert len(rows) == 2
    runs = [json.loads(line) for line in (tmp_path / "split_test.jsonl").read_text()
            .splitlines()]
    assert [(r["gpus"], r["ok"]) for r in runs] == [(1, True), (2, True)]
    assert all(len(r["times"]) == 3 and r["last_s"] == r["times"][-1] for r in runs)
    assert runs[1]["outputs"] == runs[0]["outputs"]   # the split passes print one's lines
    text = (tmp_path / "split_test.md").read_text()
    assert "`python benchmarks/split_test.py --max-gpus 2 --models lenet --passes 3 --cpu`" \
        in text
    assert re.search(r"\| lenet \| 1 \| 20 \| \d\.\d{3} \| 1\.000 \| \d\.\d{3} \| 1\.000 \| "
                     r"yes \|", text)
    assert re.search(r"\| lenet \| 2 \| 20 \| \d\.\d{3} \| \d\.\d{3} \| \d\.\d{3} \| "
                     r"\d\.\d{3} \| yes \| .* \| <= 0\.550: (met|NOT met) \| "
                     r"\d\.\d{3}, \d\.\d{3}, \d\.\d{3} \|$", text, re.M)


def test_a_run_that_prints_other_lines_says_where_first():
    bench = load_benchmark("split_test")
    one = [["accuracy = 0.5", "loss = 6.8144"], ["accuracy = 0.5", "loss = 6.8144"]]
    assert bench.first_difference([one[0], ["accuracy = 0.5", "loss = 6.8145"]], one) == (
        "pass 2 printed 'loss = 6.8145' where one GPU printed 'loss = 6.8144'")
    assert bench.first_difference([one[0], ["accuracy = 0.5"]], one) == (
        "pass 2 printed 1 output line where one GPU printed 2")
    assert bench.first_difference(one[:1], one) == "1 pass where one GPU ran 2"
    assert bench.first_difference(one + one[:1], one) == "3 passes where one GPU ran 2"
