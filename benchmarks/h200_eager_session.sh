#!/usr/bin/env bash
# Device sessions of issue 43 (what an eager caller pays) on one H200:
#   OUT=DIR bash benchmarks/h200_eager_session.sh check   # host cost per call, the GPU tests, a small tune + verify
#   OUT=DIR bash benchmarks/h200_eager_session.sh full    # the project's GPU workloads tuned eager+graph, verified
# Each step has its own time limit; logs, JSON and the run folders (tarred) go to $OUT.
set -u
part=${1:?check or full}
OUT=${OUT:-runs/h200-eager}
WORK=${WORK:-/tmp/eager}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
step() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s): $*"; local t0=$SECONDS
         timeout "$limit" "$@"; echo "== $name: exit $? after $((SECONDS - t0)) s"; }
tune() {  # tune WORKLOAD into $WORK/$2 within $3 s, then farm verify it (both calling modes)
    step "tune-$2" "$3" python3 -m farm tune "$1" --devices gpu --out "$WORK/$2" --json > "$OUT/$2-tune.json" 2> "$OUT/$2-tune.err"
    step "verify-$2" "$4" python3 -m farm verify "$WORK/$2" --devices gpu --json > "$OUT/$2-verify.json"
    python3 -m farm report "$WORK/$2" > "$OUT/$2-report.txt" 2>&1
}
{
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
grep -m1 "model name" /proc/cpuinfo
if [ "$part" = check ]; then
    step micro 60 python3 benchmarks/eager_calls.py micro --device gpu
    step host 90 python3 benchmarks/eager_calls.py host --device gpu --json "$OUT/host.json"
    step tests-new 150 python3 -m pytest -q -x -rs tests/gpu/test_eager_calls_gpu.py tests/gpu/test_ops_gpu.py
    cat > "$WORK/small.yaml" <<'YAML'
name: eager-check
call: [eager, graph]
autotune: {max_tuning_duration_ms: 50, graph_repeats: 16, rotating_buffers: 7}
engines: {include: [torch.matmul, torch.blas, cublaslt, torch.sdpa, torch.conv],
          sweep: {torch.sdpa: {backend: [flash, efficient, cudnn]}, torch.blas: {backend: [cublas, cublaslt]}}}
problems:
  - {name: mm-1x4096x4096, op: matmul, dtype: bf16, tensors: {A: [1, 4096], B: [4096, 4096]}}
  - {name: mm-32x4096x14336, op: matmul, dtype: bf16, tensors: {A: [32, 4096], B: [4096, 14336]}}
  - {name: decode-b8-4k, op: sdpa_fwd, dtype: bf16, tensors: {Q: [8, 32, 1, 128], K: [8, 8, 4096, 128], V: [8, 8, 4096, 128]}}
  - {name: r50-3x3-64-64-s1, op: conv_fprop, dtype: fp16, criteria: {pad_h: 1, pad_w: 1},
     tensors: {X: {dims: [32, 64, 56, 56], strides: [200704, 1, 3584, 64]}, W: {dims: [64, 64, 3, 3], strides: [576, 1, 192, 64]}, Y: {dims: [32, 64, 56, 56], strides: [200704, 1, 3584, 64]}}}
YAML
    tune "$WORK/small.yaml" small 150 60
    step tests-rest 150 python3 -m pytest -q -rs tests/gpu --ignore=tests/gpu/test_eager_calls_gpu.py --ignore=tests/gpu/test_ops_gpu.py
    tar -C "$WORK" -czf "$OUT/small.tgz" small/results small/overrides small/job.json 2>/dev/null
else
    step host 90 python3 benchmarks/eager_calls.py host --device gpu --json "$OUT/host.json"
    tune examples/h200-library-plans.yaml lp 330 100
    tune examples/h200-attention.yaml attn 100 40
    tar -C "$WORK" -czf "$OUT/runs.tgz" lp/results lp/overrides lp/job.json attn/results attn/overrides attn/job.json \
        2>/dev/null
fi
} > "$OUT/session.log" 2>&1
grep -v '^INFO\|^WARNING\|^(raylet)\|^(DeviceWorkerImpl' "$OUT/session.log" | tail -c 11000
