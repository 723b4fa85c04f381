#!/usr/bin/env bash
# The activation kernels on a CUDA machine, in one command from the repository root:
#
#     bash benchmarks/gpu_kernels.sh [extra arguments for benchmarks/activations.py]
#
# 1. builds the extension for sm_90 only (H100/H200; set TORCH_CUDA_ARCH_LIST for others),
# 2. runs the GPU tests (pytest -m gpu tests/kernels tests/benchmarks),
# 3. runs the benchmark, whose markdown report also lands in $OUT/kernels.md when OUT is set,
#    then benchmarks/max_pool.py (ResNet-50's pool1: csrc/max_pool.cu against PyTorch's ways),
# 4. runs the forward launch sweep (activations.py --variants: ReLU over kFwd's 54 launches,
#    ELU, Sigmoid and TanH over kFwdMath's 12; its module builds in the background during
#    steps 1-3): $OUT/fwd_variants.md ends with the kFwd and kFwdMath lines to ship.
#    VARIANTS=0 skips it.
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
SWEEP_LOG="${OUT:+$OUT/}fwd_variants_build.log"
if [ "${VARIANTS:-1}" != 0 ]; then
  "$PY" benchmarks/fwd_variants.py >"$SWEEP_LOG" 2>&1 &
  sweep_pid=$!
fi
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
  [ -n "${sweep_pid:-}" ] && kill "$sweep_pid" 2>/dev/null
  exit 1
fi

echo "== GPU tests" | tee -a "$LOG"
"$PY" -m pytest -q -m gpu -p no:cacheprovider tests/kernels tests/benchmarks 2>&1 | tee -a "$LOG"
test_status=${PIPESTATUS[0]}

echo "== benchmark" | tee -a "$LOG"
"$PY" benchmarks/activations.py "$@" 2>&1 | tee -a "$LOG"
bench_status=${PIPESTATUS[0]}
echo "== max pooling" | tee -a "$LOG"
"$PY" benchmarks/max_pool.py 2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" -eq 0 ] || bench_status=1

variants_status=0
if [ "${VARIANTS:-1}" != 0 ]; then
  wait "$sweep_pid" || echo "(the sweep module's background build failed: see $SWEEP_LOG)" | tee -a "$LOG"
  echo "== forward launch sweep" | tee -a "$LOG"
  "$PY" benchmarks/activations.py --variants 2>&1 | tee -a "$LOG"
  variants_status=${PIPESTATUS[0]}
fi

echo "== done in $(( $(date +%s) - start )) s (tests: exit $test_status, benchmark: exit $bench_status, sweep: exit $variants_status)" | tee -a "$LOG"
[ "$test_status" -eq 0 ] && [ "$bench_status" -eq 0 ] && [ "$variants_status" -eq 0 ]
