#!/usr/bin/env bash
# One device session on a 2x H200 host: GPU tests, farm scaling (1 vs 2 GPUs), publish, replay, Triton comparison.
#   OUT=runs/h200-session bash benchmarks/h200_session.sh
# Each step has its own time limit, so a slow step cannot starve the ones after it; logs go to $OUT.
set -u
OUT=${OUT:-runs/h200-session}
WORK=${WORK:-/tmp/h200-session}
mkdir -p "$OUT" "$WORK"
step() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s): $*"; local t0=$SECONDS
         timeout "$limit" "$@"; echo "== $name: exit $? after $((SECONDS - t0)) s"; }

nvidia-smi --query-gpu=index,name,uuid,clocks.sm,clocks.max.sm --format=csv > "$OUT/session.log" 2>&1
{
step gpu-tests 150 python3 -m pytest -q -rs tests/gpu
step scaling 240 python3 benchmarks/farm_gpu_scaling.py --gpus 1,2 --workload examples/h200-farm.yaml --out "$WORK/scaling"
step publish 60 python3 -m farm publish "$WORK/scaling/2gpu/overrides" --to "$WORK/published"
step replay 150 python3 benchmarks/replay_first_call.py --workload examples/h200-farm.yaml --device cuda \
     --out "$WORK/replay" --published "$WORK/published"
tar -C "$WORK" -czf "$OUT/artifacts.tgz" --exclude='*.lock' scaling/1gpu scaling/2gpu scaling/scaling.log published \
    replay/report.json replay/phases.log replay/tunable_results0.json 2>/dev/null
step triton "${TRITON_LIMIT:-150}" python3 benchmarks/gpu_suite.py all --parts triton --contenders "${CONTENDERS:-triton,ours}" \
     --out "$WORK/suite" --budget "${TRITON_LIMIT:-150}"
tar -C "$WORK" -czf "$OUT/suite.tgz" suite 2>/dev/null
} >> "$OUT/session.log" 2>&1
