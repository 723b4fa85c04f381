#!/usr/bin/env bash
# caffe-py data parallelism vs PyTorch on one multi-GPU host (written for 4 x H200).
# One command, about 15 minutes (runs stop at BUDGET_S=900 s; the table is printed last):
#     OUT=/some/dir bash benchmarks/gpu_multigpu.sh
# Logs, JSON results, the profile and the markdown table go to $OUT (default: a temp dir);
# the table is printed last. Rows: ResNet-50 (configs/resnet50_dummy.yaml, batch 256 per GPU,
# bf16 autocast, channels_last) with a plain 1-GPU PyTorch loop, torchrun DDP x4, caffe-py
# tree on 1-4 GPUs (eager, and with each replica's step as a CUDA graph) and NCCL on 4; LeNet
# (batch 64, fp32) on 1 and 4; the time to reduce ResNet-50's gradient (tree vs
# torch.cuda.nccl.all_reduce); the peer sum against NCCL by bucket size; a torch.profiler
# summary. The GPU tests of tests/parallel run first.
# The package need not be installed (PYTHONPATH points here); the CUDA kernels are built first
# (sm_90 unless TORCH_CUDA_ARCH_LIST says otherwise), so no timed run pays for the compile.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d /tmp/cpy_multigpu.XXXXXX)}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0          # NVLink SHARP multicast stays off on these machines
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-/tmp/caffe_py_torch_extensions}"
PY="${PYTHON:-python3}"
JSON=$OUT/multigpu_results.jsonl
LOG=$OUT/multigpu_log.txt
: > "$JSON"
: > "$LOG"
START=$(date +%s)
BUDGET=${BUDGET_S:-900}            # seconds for all runs: a run is cut to what is left of it,
                                   # and skipped when less than a third of its limit is left
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count())")
WARM=${WARMUP:-15}
ITERS=${ITERS:-30}

run() {  # run NAME LIMIT_S COMMAND...: bounded, logged, failure noted and skipped
    local name=$1 limit=$2
    shift 2
    local used=$(( $(date +%s) - START ))
    if (( used + limit / 3 > BUDGET )); then
        echo "-- skipped $name: ${used}s of the ${BUDGET}s budget used" | tee -a "$LOG"
        return
    fi
    (( limit > BUDGET - used )) && limit=$(( BUDGET - used ))
    echo "== $name (limit ${limit}s, at ${used}s)" | tee -a "$LOG"
    timeout --kill-after=10 "$limit" "$@" >> "$LOG" 2>&1
    local rc=$?
    if (( rc != 0 )); then
        echo "!! $name failed (exit $rc); its last lines:" | tee -a "$LOG"
        tail -n 5 "$LOG"
    else
        tail -n 1 "$LOG"
    fi
}

gpus() { seq -s, 0 $(( $1 - 1 )); }
CPU=()
if [[ "${CPU_SMOKE:-0}" == 1 ]]; then   # a dry run of this script on a CPU machine (LeNet only)
    gpus() { echo "cpu:$1"; }
    CPU=(--cpu)
    NGPU=2
fi

{
    echo "# $(date -u) $(hostname)"
    nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
    nvidia-smi topo -m
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'nccl', torch.cuda.nccl.version())"
} >> "$LOG" 2>&1

run "build the CUDA kernels" 240 "$PY" -c "from caffe_py.kernels import build; print(build.build())"

SPECS=$OUT/specs
"$PY" benchmarks/multigpu.py solver --net configs/resnet50_dummy.yaml --out "$SPECS" \
    --name resnet50 --precision BF16 >> "$LOG" 2>&1
"$PY" benchmarks/multigpu.py solver --net configs/lenet.yaml --lenet --batch 64 \
    --out "$SPECS" --name lenet --precision FLOAT32 >> "$LOG" 2>&1
R=$SPECS/resnet50_solver.yaml
L=$SPECS/lenet_solver.yaml
[[ "${CPU_SMOKE:-0}" == 1 ]] && R=$L
N=$(( NGPU < 4 ? NGPU : 4 ))
T=(--warmup "$WARM" --iters "$ITERS" --json "$JSON")

run "GPU tests (tests/parallel -m gpu)" 150 "$PY" -m pytest -q -m gpu tests/parallel

# the default itself: `cpy train --gpus 0..N-1` with no flag against torchrun DDP, 1..N GPUs,
# with the goals' verdicts (its own table: $OUT/scale/scale_default.md)
if [[ "${CPU_SMOKE:-0}" != 1 ]]; then
    run "cpy train, no flag, 1-$N GPUs vs DDP (benchmarks/scale_default.py)" 540 "$PY" \
        benchmarks/scale_default.py --out "$OUT/scale" --max-gpus "$N"
fi

# the replicas' gradient sum by bucket size: peer sums against NCCL (its own table:
# $OUT/peer_sum/peer_sum.md)
if [[ "${CPU_SMOKE:-0}" != 1 ]] && (( NGPU >= 2 )); then
    run "gradient sums by bucket size, 2-$N GPUs (benchmarks/peer_sum.py)" 120 "$PY" \
        benchmarks/peer_sum.py --gpus "$(seq -s, 2 "$N")" --out "$OUT/peer_sum"
fi

# the most telling rows first: a later row is skipped if the time budget runs out
run "ResNet-50 PyTorch 1-GPU loop" 150 \
    "$PY" benchmarks/ddp_baseline.py --solver "$R" --plain --channels-last "${T[@]}" "${CPU[@]}"
if [[ "${CPU_SMOKE:-0}" != 1 ]] && "$PY" -c "import torchvision" 2>/dev/null; then
    run "ResNet-50 torchvision resnet50 1-GPU loop (reference)" 120 "$PY" \
        benchmarks/ddp_baseline.py --solver "$R" --plain --torchvision --channels-last "${T[@]}"
fi
run "ResNet-50 torchrun DDP x$N" 180 \
    "$PY" -m torch.distributed.run --standalone --nproc_per_node "$N" benchmarks/ddp_baseline.py --solver "$R" \
    --channels-last "${T[@]}" "${CPU[@]}"
run "ResNet-50 caffe-py tree x$N" 150 "$PY" benchmarks/multigpu.py caffe --solver "$R" \
    --gpus "$(gpus "$N")" --channels-last "${T[@]}"
run "ResNet-50 caffe-py tree + CUDA graphs x$N" 150 "$PY" benchmarks/multigpu.py caffe \
    --solver "$R" --gpus "$(gpus "$N")" --channels-last --graphs "${T[@]}"
run "ResNet-50 caffe-py tree x$N, reduce after backward" 150 "$PY" benchmarks/multigpu.py \
    caffe --solver "$R" --gpus "$(gpus "$N")" --channels-last --no-overlap "${T[@]}"
run "ResNet-50 caffe-py nccl x$N" 150 "$PY" benchmarks/multigpu.py caffe --solver "$R" \
    --gpus "$(gpus "$N")" --reduction nccl --channels-last "${T[@]}"
for n in $(seq 1 $(( N - 1 ))); do
    run "ResNet-50 caffe-py tree x$n" 150 "$PY" benchmarks/multigpu.py caffe --solver "$R" \
        --gpus "$(gpus "$n")" --channels-last "${T[@]}"
done
run "ResNet-50 caffe-py tree + CUDA graphs x1" 150 "$PY" benchmarks/multigpu.py caffe \
    --solver "$R" --gpus "$(gpus 1)" --channels-last --graphs "${T[@]}"
run "ResNet-50 gradient reduction x$N" 120 "$PY" benchmarks/multigpu.py reduce \
    --solver "$R" --gpus "$(gpus "$N")" --iters 20 --json "$JSON"
LT=(--warmup "${LENET_WARMUP:-50}" --iters "${LENET_ITERS:-300}" --json "$JSON")
run "LeNet PyTorch 1-GPU loop" 90 "$PY" benchmarks/ddp_baseline.py --solver "$L" --plain "${LT[@]}" \
    "${CPU[@]}"
run "LeNet torchrun DDP x$N" 120 \
    "$PY" -m torch.distributed.run --standalone --nproc_per_node "$N" benchmarks/ddp_baseline.py --solver "$L" "${LT[@]}" \
    "${CPU[@]}"
run "LeNet caffe-py tree x1" 90 "$PY" benchmarks/multigpu.py caffe --solver "$L" --gpus "$(gpus 1)" \
    "${LT[@]}"
run "LeNet caffe-py tree + CUDA graphs x1" 90 "$PY" benchmarks/multigpu.py caffe --solver "$L" \
    --gpus "$(gpus 1)" --graphs "${LT[@]}"
run "LeNet caffe-py tree x$N" 90 "$PY" benchmarks/multigpu.py caffe --solver "$L" \
    --gpus "$(gpus "$N")" "${LT[@]}"
run "LeNet caffe-py tree + CUDA graphs x$N (lockstep)" 90 "$PY" benchmarks/multigpu.py caffe \
    --solver "$L" --gpus "$(gpus "$N")" --graphs "${LT[@]}"
run "LeNet caffe-py tree + CUDA graphs x$N, a thread per replica" 90 "$PY" \
    benchmarks/multigpu.py caffe --solver "$L" --gpus "$(gpus "$N")" --graphs --no-lockstep \
    "${LT[@]}"
run "ResNet-50 caffe-py tree x$N, profiled" 150 "$PY" benchmarks/multigpu.py caffe \
    --solver "$R" --gpus "$(gpus "$N")" --channels-last --warmup 10 --iters 8 --json "$JSON" \
    --profile "$OUT/profile_resnet50_tree$N.txt"

echo "== done in $(( $(date +%s) - START ))s; logs, results and profile in $OUT" | tee -a "$LOG"
"$PY" benchmarks/multigpu.py table --json "$JSON" | tee "$OUT/multigpu_table.md"
[[ -f "$OUT/scale/scale_default.md" ]] && cat "$OUT/scale/scale_default.md"
if [[ -f "$OUT/peer_sum/peer_sum.md" ]]; then cat "$OUT/peer_sum/peer_sum.md"; fi
