#!/usr/bin/env bash
# The activation kernels on a CUDA machine, in one command from the repository root:
#
#     bash benchmarks/gpu_kernels.sh [extra arguments for benchmarks/activations.py]
#
# 1. builds the extension for sm_90 only (H100/H200; set TORCH_CUDA_ARCH_LIST for others),
# 2. runs the GPU tests (pytest -m gpu tests/kernels),
# 3. runs the benchmark, whose markdown report also lands in $OUT/kernels.md when OUT is set.
# The package need not be installed (PYTHONPATH points here). Exits non-zero if the build or
# a test failed; the benchmark still runs after failed tests, so both results come back.
set -uo pipefail
cd "$(dirname "$0")/.."
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-/tmp/caffe_py_torch_extensions}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
LOG="${OUT:+$OUT/}gpu_kernels.log"
start=$(date +%s)

{
  echo "== $(date -u '+%F %T') UTC on $(hostname); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  echo "== build (TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST)"
} 2>&1 | tee "$LOG"
"$PY" - <<'PYEOF' 2>&1 | tee -a "$LOG"
import sys

from caffe_py.kernels import build

try:
    where, seconds = build.build()
except build.BuildError as exc:
    print(f"Error: {exc}", flush=True)
    print("== the compiler's output:", flush=True)
    build.reset()
    try:
        build.build(verbose=True)
    except build.BuildError:
        pass
    sys.exit(1)
print(f"built {build.NAME} in {where} ({seconds:.1f} s)")
PYEOF
build_status=${PIPESTATUS[0]}
if [ "$build_status" -ne 0 ]; then
  exit 1
fi

echo "== GPU tests" | tee -a "$LOG"
"$PY" -m pytest -q -m gpu -p no:cacheprovider tests/kernels 2>&1 | tee -a "$LOG"
test_status=${PIPESTATUS[0]}

echo "== benchmark" | tee -a "$LOG"
"$PY" benchmarks/activations.py "$@" 2>&1 | tee -a "$LOG"
bench_status=${PIPESTATUS[0]}

echo "== done in $(( $(date +%s) - start )) s (tests: exit $test_status, benchmark: exit $bench_status)" | tee -a "$LOG"
[ "$test_status" -eq 0 ] && [ "$bench_status" -eq 0 ]
