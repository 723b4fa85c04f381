#!/usr/bin/env bash
# Everything that needs one CUDA GPU, in one command from the repository root:
#
#     bash benchmarks/gpu_single.sh
#
# builds the activation kernels and runs their GPU tests and benchmark (gpu_kernels.sh), the
# other GPU tests of the suite, and the data pipeline benchmark (Data vs DummyData step rate).
# Logs and markdown tables land in $OUT (default /tmp/cpy_gpu); the tables are printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/cpy_gpu}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # wheels the GPU image lacks (lmdb), carried along
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

bash benchmarks/gpu_kernels.sh > "$OUT/kernels_run.log" 2>&1
kernels=$?
{ python3 -m pytest -q -m gpu -p no:cacheprovider tests --ignore=tests/kernels &&
  python3 -m pytest -q -p no:cacheprovider tests/io tests/layers/test_data.py; } \
  > "$OUT/gpu_tests.log" 2>&1
tests=$?
python3 benchmarks/data_pipeline.py --device cuda --train --save "$OUT/data_pipeline.md" \
  > "$OUT/data_pipeline.log" 2>&1
data=$?

tail -n 5 "$OUT/gpu_kernels.log" "$OUT/gpu_tests.log"
tail -n 25 "$OUT/fwd_variants.md" 2>/dev/null
cat "$OUT/data_pipeline.md" 2>/dev/null || tail -n 30 "$OUT/data_pipeline.log"
echo "exit: kernels $kernels, gpu tests $tests, data pipeline $data"
[ "$kernels" -eq 0 ] && [ "$tests" -eq 0 ] && [ "$data" -eq 0 ]
