#!/usr/bin/env bash
# Issue 16 on a 2x H200 host: GPU tests, then tune examples/h200-replay.yaml on the Ray farm (both GPUs),
# publish, report, and replay every problem with farm.ops in a fresh process beside the eager calls.
#   OUT=runs/h200-replay bash benchmarks/h200_replay_session.sh
# Each step has its own time limit; logs and tables go to $OUT.
set -u
OUT=${OUT:-runs/h200-replay}
WORK=${WORK:-/tmp/h200-replay}
mkdir -p "$OUT" "$WORK"
step() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s): $*"; local t0=$SECONDS
         timeout "$limit" "$@"; echo "== $name: exit $? after $((SECONDS - t0)) s"; }
{
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm --format=csv
[ "${SKIP_TESTS:-0}" = 1 ] || step gpu-tests 200 python3 -m pytest -q -rs tests/gpu
step tune 300 python3 -m farm tune examples/h200-replay.yaml --devices gpu --out "$WORK/run"
step publish 60 python3 -m farm publish "$WORK/run/overrides" --to "$WORK/published"
step report 60 python3 -m farm report "$WORK/run/results"
python3 -m farm report "$WORK/run/results" --json > "$OUT/report.json"
step replay 240 python3 benchmarks/replay_overhead.py gpu --workload examples/h200-replay.yaml \
     --published "$WORK/published" --results "$WORK/run/results" --rounds "${ROUNDS:-5}" --json "$OUT/replay.json"
step cpu-replay 60 python3 benchmarks/replay_overhead.py cpu
tar -C "$WORK" -czf "$OUT/run.tgz" run/results run/overrides run/job.json published 2>/dev/null
} > "$OUT/session.log" 2>&1
tail -c 9000 "$OUT/session.log"
