#!/usr/bin/env bash
# Device sessions of issue 34 (decisions that hold) on one H200, in two parts that each fit a 10-minute call:
#   OUT=runs/a bash benchmarks/h200_decisions_session.sh a   # engines' host cost; tune the decode workload; call modes
#   OUT=runs/b bash benchmarks/h200_decisions_session.sh b   # tune it again (reproducibility); a killed run
#   OUT=runs/c bash benchmarks/h200_decisions_session.sh c   # engines; a killed run beside an uninterrupted one
#                                                            # (same machine, both cold); a second tune; call modes
#   OUT=runs/d bash benchmarks/h200_decisions_session.sh d   # the killed run again; GPU tests of the replay path
# Part b compares with part a's run when RUN1 names its folder (e.g. RUN1=/tmp/decisions/d1, same machine).
# Each step has its own time limit; logs and the runs' folders (tarred) go to $OUT.
set -u
part=${1:?a or b}
OUT=${OUT:-runs/h200-decisions}
WORK=${WORK:-/tmp/decisions}
WORKLOAD=${WORKLOAD:-examples/h200-decode.yaml}
mkdir -p "$OUT" "$WORK"
step() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s): $*"; local t0=$SECONDS
         timeout "$limit" "$@"; echo "== $name: exit $? after $((SECONDS - t0)) s"; }
tune() {  # tune WORKLOAD into $1 (--json to $2) within $3 seconds; prints its wall time
    local t0; t0=$(date +%s.%N)
    echo "== tune $1 (limit $3 s)"
    timeout "$3" python3 -m farm tune "$WORKLOAD" --devices gpu --out "$1" --json > "$2" 2> "$2.err"
    echo "exit $? wall $(python3 -c "import time; print(round(time.time() - $t0, 1))") s" | tee "$2.wall"
}

nvidia-smi --query-gpu=index,name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv \
    > "$OUT/session-$part.log" 2>&1
{
if [ "$part" = a ]; then
    [ -n "${ENGINES-1}" ] && step engines 100 python3 benchmarks/replay_overhead.py engines --rounds 3 \
        --json "$OUT/engines.json"
    tune "$WORK/d1" "$OUT/tune1.json" 300
    step report1 30 python3 -m farm report "$WORK/d1"
    step modes1 140 python3 benchmarks/call_modes.py "$WORK/d1" --rounds 5 --json "$OUT/modes1.json"
    tar -C "$WORK" -czf "$OUT/d1.tgz" --exclude='*.lock' d1 2>/dev/null
elif [ "$part" = c ]; then
    step engines 60 python3 benchmarks/replay_overhead.py engines --rounds 3 --json "$OUT/engines3.json"
    step kill 360 python3 benchmarks/kill_recovery.py "$WORKLOAD" --devices gpu --at 0.4 --out "$WORK/kill" \
        --json "$OUT/kill.json"
    tune "$WORK/d4" "$OUT/tune4.json" 160
    step compare 30 python3 benchmarks/reproducibility.py --compare "$WORK/kill/uninterrupted" "$WORK/d4" \
        --json "$OUT/reproducibility.json"
    step modes4 60 python3 benchmarks/call_modes.py "$WORK/d4" --rounds 5 --json "$OUT/modes4.json"
    tar -C "$WORK" -czf "$OUT/c.tgz" --exclude='*.lock' kill/uninterrupted kill/killed d4 2>/dev/null
elif [ "$part" = d ]; then
    step kill 390 python3 benchmarks/kill_recovery.py "$WORKLOAD" --devices gpu --at 0.4 --out "$WORK/kill" \
        --json "$OUT/kill.json"
    step gpu-tests 150 python3 -m pytest -q -x -rs tests/gpu/test_ops_gpu.py tests/gpu/test_library_engines.py \
        -k "splitk or triton or decode or replay or graph"
    tar -C "$WORK" -czf "$OUT/d.tgz" --exclude='*.lock' kill/uninterrupted kill/killed 2>/dev/null
else
    tune "$WORK/d2" "$OUT/tune2.json" 300
    step modes2 100 python3 benchmarks/call_modes.py "$WORK/d2" --rounds 5 --json "$OUT/modes2.json"
    [ -n "${ENGINES-1}" ] && step engines 100 python3 benchmarks/replay_overhead.py engines --rounds 3 --profile \
        --json "$OUT/engines2.json" > "$OUT/engines2.log" 2>&1 && grep -A14 '^| shape' "$OUT/engines2.log"
    [ -n "${RUN1:-}" ] && step compare 60 python3 benchmarks/reproducibility.py --compare "$RUN1" "$WORK/d2" \
        --json "$OUT/reproducibility.json"
    wall=$(sed -n 's/.*wall \([0-9.]*\) s/\1/p' "$OUT/tune2.json.wall")
    step kill 300 python3 benchmarks/kill_recovery.py "$WORKLOAD" --devices gpu --uninterrupted "$WORK/d2" \
        --uninterrupted-s "$wall" --at 0.4 --out "$WORK/kill" --json "$OUT/kill.json"
    tar -C "$WORK" -czf "$OUT/d2.tgz" --exclude='*.lock' d2 kill/killed 2>/dev/null
fi
} >> "$OUT/session-$part.log" 2>&1
grep -v '^INFO\|^WARNING\|^(raylet)' "$OUT/session-$part.log" | tail -c 11000
