#!/usr/bin/env bash
# Device sessions of issue 43 (what an eager caller pays) on one H200:
#   OUT=DIR bash benchmarks/h200_eager_session.sh tests   # the GPU tests, the pieces of a lookup, host cost per call
#   OUT=DIR bash benchmarks/h200_eager_session.sh full    # the project's GPU workloads tuned eager+graph, verified
# Each step has its own time limit; logs, JSON and the run folders (tarred) go to $OUT.
set -u
part=${1:?tests or full}
OUT=${OUT:-runs/h200-eager}
WORK=${WORK:-/tmp/eager}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
step() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s): $*" >&2; local t0=$SECONDS
         timeout "$limit" "$@"; echo "== $name: exit $? after $((SECONDS - t0)) s" >&2; }
tune() {  # tune WORKLOAD into $WORK/$2 within $3 s, then farm verify it (both calling modes)
    step "tune-$2" "$3" python3 -m farm tune "$1" --devices gpu --out "$WORK/$2" --json > "$OUT/$2-tune.json" 2> "$OUT/$2-tune.err"
    step "verify-$2" "$4" python3 -m farm verify "$WORK/$2" --devices gpu --json > "$OUT/$2-verify.json"
    python3 -m farm report "$WORK/$2" > "$OUT/$2-report.txt" 2>&1
}
{
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
grep -m1 "model name" /proc/cpuinfo
if [ "$part" = tests ]; then
    step tests-new 120 python3 -m pytest -q -rs tests/gpu/test_eager_calls_gpu.py tests/gpu/test_ops_gpu.py
    step tests-rest 360 python3 -m pytest -q -rs tests/gpu --ignore=tests/gpu/test_eager_calls_gpu.py \
        --ignore=tests/gpu/test_ops_gpu.py
    step micro 40 python3 benchmarks/eager_calls.py micro --device gpu
    step host 90 python3 benchmarks/eager_calls.py host --device gpu --json "$OUT/host.json"
else
    tune examples/h200-library-plans.yaml lp 330 90
    tar -C "$WORK" -czf "$OUT/lp.tgz" lp/results lp/overrides lp/job.json 2>/dev/null
    tune examples/h200-attention.yaml attn 90 30
    tar -C "$WORK" -czf "$OUT/attn.tgz" attn/results attn/overrides attn/job.json 2>/dev/null
    step host 40 python3 benchmarks/eager_calls.py host --device gpu --rounds 7 --json "$OUT/host.json"
fi
} > "$OUT/session.log" 2>&1
grep -v '^INFO\|^WARNING\|^(raylet)\|^(DeviceWorkerImpl' "$OUT/session.log" | tail -c 11000
