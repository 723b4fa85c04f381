#!/usr/bin/env bash
# ImageNet-scale data on one CUDA GPU, in one command from the repository root:
#
#     bash benchmarks/gpu_imagenet.sh            # about 6 minutes on an H200 (16 cores)
#
# Runs the data pipeline's tests (the GPU ones included: nvJPEG, the device crop), then
# benchmarks/imagenet_data.py: makes 32,000 synthetic 256x256 images as raw and JPEG LMDBs in
# /tmp/cpy_imagenet (reused by later runs), measures decode throughput (CPU threads and processes,
# nvJPEG, the DataLoader peer) and ResNet-50 steps fed by DummyData, the raw and JPEG LMDBs and
# the peer. Needs lmdb (carried as a wheel in .whl/) and torchvision (for nvJPEG and the peer).
# Logs and tables land in $OUT (default /tmp/cpy_gpu): imagenet_data.md, and data_pipeline.md
# (docs/data_pipeline.md with the results section filled in). Extra arguments go to the
# benchmark (e.g. --replicas 4 on a 4-GPU machine: the feeds, then ResNet-50 on the four GPUs
# from each LMDB against torchrun DDP fed by DataLoaders; about 7 minutes on 4 x H200).
set -uo pipefail
cd "$(dirname "$0")/.."
export OUT="${OUT:-/tmp/cpy_gpu}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # wheels the GPU image lacks (lmdb), carried along
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

python3 -m pytest -q -p no:cacheprovider tests/io tests/layers/test_data.py \
  > "$OUT/imagenet_tests.log" 2>&1
tests=$?
cp docs/data_pipeline.md "$OUT/data_pipeline.md"
python3 benchmarks/imagenet_data.py --save "$OUT/data_pipeline.md" "$@" \
  2>&1 | tee "$OUT/imagenet_data.log"
bench=${PIPESTATUS[0]}

tail -n 3 "$OUT/imagenet_tests.log"
echo "exit: tests $tests, benchmark $bench"
[ "$tests" -eq 0 ] && [ "$bench" -eq 0 ]
