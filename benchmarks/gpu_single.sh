#!/usr/bin/env bash
# Everything that needs one CUDA GPU, in one command from the repository root:
#
#     FMNIST=/path/to/fashion-mnist bash benchmarks/gpu_single.sh
#
# 1. builds the activation kernels and runs their GPU tests and benchmark (gpu_kernels.sh;
#    VARIANTS=0 skips its launch sweep),
# 2. the other GPU tests of the suite (and the io tests, on this machine's cores),
# 3. the data pipeline benchmark (Data vs DummyData step rate),
# 4. `cpy train` with no flag against plain PyTorch loops (fast_default.py; needs the
#    Fashion-MNIST .gz files in $FMNIST),
# 5. one ResNet-50 training step, caffe-py's Net against torchvision (resnet50_step.py).
# STEPS="1 2 3 4 5" picks the steps. Logs and markdown tables land in $OUT (default
# /tmp/cpy_gpu); the tables are printed last.
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/cpy_gpu}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # wheels the GPU image lacks (lmdb), carried along
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
STEPS="${STEPS:-1 2 3 4 5}"
FMNIST="${FMNIST:-/usr/share/datasets/fashion-mnist}"
declare -A rc
run() { case " $STEPS " in *" $1 "*) ;; *) return ;; esac
        local n=$1; shift; "$@"; rc[$n]=$?; echo "== step $n exit ${rc[$n]}"; }

run 1 bash -c 'bash benchmarks/gpu_kernels.sh > "$OUT/kernels_run.log" 2>&1'
run 2 bash -c '{ python3 -m pytest -q -m gpu -p no:cacheprovider tests --ignore=tests/kernels &&
  python3 -m pytest -q -p no:cacheprovider tests/io tests/layers/test_data.py; } \
  > "$OUT/gpu_tests.log" 2>&1'
run 3 bash -c 'python3 benchmarks/data_pipeline.py --device cuda --train \
  --save "$OUT/data_pipeline.md" > "$OUT/data_pipeline.log" 2>&1'
run 4 bash -c 'python3 benchmarks/fast_default.py --fmnist "$FMNIST" --out "$OUT" \
  > "$OUT/fast_default.log" 2>&1'
run 5 bash -c 'python3 benchmarks/resnet50_step.py --out "$OUT" --no-profile \
  > "$OUT/resnet50_step.log" 2>&1'

tail -n 5 "$OUT/gpu_kernels.log" "$OUT/gpu_tests.log" 2>/dev/null
tail -n 25 "$OUT/fwd_variants.md" 2>/dev/null
cat "$OUT/data_pipeline.md" 2>/dev/null || tail -n 30 "$OUT/data_pipeline.log" 2>/dev/null
cat "$OUT/fast_default.md" 2>/dev/null || tail -n 30 "$OUT/fast_default.log" 2>/dev/null
cat "$OUT/resnet50_step.md" 2>/dev/null || tail -n 20 "$OUT/resnet50_step.log" 2>/dev/null
status=0
for n in "${!rc[@]}"; do echo "step $n: exit ${rc[$n]}"; [ "${rc[$n]}" -eq 0 ] || status=1; done
exit $status
