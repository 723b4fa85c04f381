#!/usr/bin/env bash
# The second level of data parallelism (docs/parallel.md, "Several hosts") on ONE multi-GPU
# machine, where processes stand in for hosts: what the cross-process all-reduce costs on top
# of the in-process tree. It measures no network (NCCL between processes of one host goes over
# NVLink / shared memory); that is the most a single machine can say.
#     OUT=/some/dir bash benchmarks/gpu_multihost.sh        (4 GPUs, about 3 minutes)
#     CPU_SMOKE=1 bash benchmarks/gpu_multihost.sh          (the plumbing on a CPU machine)
# 1. the GPU test of tests/parallel/test_multihost.py (two processes over NCCL = one process);
# 2. ResNet-50 (configs/resnet50_dummy.yaml, batch 256 per GPU, constant DummyData fillers,
#    BF16) for ITERS iterations: one process x 4 GPUs, 2 processes x 2 GPUs, 4 processes x 1
#    GPU (each process its own tree, NCCL between the processes' roots); rank 0's last
#    "iter/s" display line gives images/s. The table is printed last and left in $OUT.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d /tmp/cpy_multihost.XXXXXX)}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
ITERS=${ITERS:-60}
DISPLAY_EVERY=${DISPLAY_EVERY:-20}
TABLE=$OUT/multihost_table.md

if [[ -n "${CPU_SMOKE:-}" ]]; then
    GPUS=(cpu:4 cpu:2 cpu:1); ITERS=${ITERS_SMOKE:-6}; DISPLAY_EVERY=2; BATCH=8
    NET="net_param: {name: tiny, layer: [
      {name: data, type: DummyData, top: [data, label], dummy_data_param: {
        shape: [{dim: [$BATCH, 3, 16, 16]}, {dim: [$BATCH]}],
        data_filler: [{type: constant, value: 0.5}, {type: constant}]}},
      {name: conv, type: Convolution, bottom: data, top: conv,
       convolution_param: {num_output: 8, kernel_size: 3, weight_filler: {type: xavier}}},
      {name: ip, type: InnerProduct, bottom: conv, top: ip,
       inner_product_param: {num_output: 10, weight_filler: {type: xavier}}},
      {name: loss, type: SoftmaxWithLoss, bottom: [ip, label], top: loss}]}"
    MODE=CPU; PRECISION=FLOAT32
else
    echo "== GPU test" | tee "$OUT/multihost_log.txt"
    timeout 300 "$PY" -m pytest -q -m gpu tests/parallel/test_multihost.py 2>&1 \
        | tail -3 | tee -a "$OUT/multihost_log.txt"
    GPUS=(0,1,2,3 0,1:2,3 0:1:2:3); BATCH=256
    sed 's/{type: gaussian, std: 1}/{type: constant, value: 0.5}/' configs/resnet50_dummy.yaml \
        > "$OUT/resnet50_const.yaml"
    NET="net: $OUT/resnet50_const.yaml"; MODE=GPU; PRECISION=BF16
fi
cat > "$OUT/solver.yaml" <<EOF
$NET
base_lr: 0.01
momentum: 0.9
lr_policy: fixed
max_iter: $ITERS
display: $DISPLAY_EVERY
random_seed: 1
solver_mode: $MODE
precision: $PRECISION
snapshot_after_train: false
snapshot_prefix: $OUT/snap
EOF

# run LAYOUT: processes separated by ':' (GPU mode) or one cpu:N per process (CPU mode)
run_layout() {
    local layout=$1 port=$((29500 + RANDOM % 2000)) procs=()
    if [[ -n "${CPU_SMOKE:-}" ]]; then
        local n=${layout#cpu:} hosts=$((4 / ${layout#cpu:}))
        for ((r = 0; r < hosts; r++)); do procs+=("cpu:$n"); done
    else
        IFS=: read -r -a procs <<< "$layout"
    fi
    local world=${#procs[@]} pids=()
    for r in "${!procs[@]}"; do
        RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
            timeout 600 "$PY" cli.py train --solver "$OUT/solver.yaml" --gpus "${procs[$r]}" \
            --dist-timeout 120 > "$OUT/run_${layout//[:,]/_}_rank$r.txt" 2>&1 &
        pids+=($!)
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    local log="$OUT/run_${layout//[:,]/_}_rank0.txt"
    local its
    its=$(grep -o '([0-9.e+]* iter/s' "$log" | tail -1 | tr -d '(' | cut -d' ' -f1)
    local replicas=4
    echo "| $world x $((replicas / world)) | ${its:-failed (rc $rc, see $log)} |" \
         "$( [[ -n "$its" ]] && "$PY" -c "print(f'{$its * $BATCH * $replicas:,.0f}')")" \
         "| $(grep -m1 '^World\|^Batch' "$log" | cut -c1-60) |" >> "$TABLE"
}

{
    echo "| processes x replicas each | iter/s (rank 0, last display) | images/s | first line |"
    echo "|---|---|---|---|"
} > "$TABLE"
for layout in "${GPUS[@]}"; do
    echo "== $layout" | tee -a "$OUT/multihost_log.txt"
    run_layout "$layout"
done
echo
cat "$TABLE"
