#!/usr/bin/env bash
# Device sessions on an H200 lease, one named step each, each fitting a 10-minute call (one GPU unless named):
#   OUT=DIR bash benchmarks/h200_session.sh suite          # 2x H200: GPU tests, farm scaling 1 vs 2 GPUs, publish,
#                                                          # replay a first call, the Triton comparison
#   OUT=DIR bash benchmarks/h200_session.sh replay         # 2x H200: tune examples/h200-replay.yaml, publish, report,
#                                                          # replay every problem beside the eager calls
#   OUT=DIR bash benchmarks/h200_session.sh decisions-a    # engines' host cost; tune the decode workload; call modes
#   OUT=DIR bash benchmarks/h200_session.sh decisions-b    # tune it again (RUN1: part a's run, for reproducibility);
#                                                          # a killed run
#   OUT=DIR bash benchmarks/h200_session.sh decisions-c    # a killed run beside an uninterrupted one; a second tune
#   OUT=DIR bash benchmarks/h200_session.sh decisions-d    # the killed run again; GPU tests of the replay path
#   OUT=DIR bash benchmarks/h200_session.sh eager-tests    # GPU tests, the pieces of a lookup, host cost a call
#   OUT=DIR bash benchmarks/h200_session.sh eager-full     # the GPU workloads tuned eager+graph, then farm verify
#   OUT=DIR bash benchmarks/h200_session.sh model-tune     # a model end to end: capture, meta, tune, apply, steps
#   OUT=DIR bash benchmarks/h200_session.sh model-inductor # against Inductor (M = 1), a second process's start
#   OUT=DIR bash benchmarks/h200_session.sh model-cold     # from nothing: capture + tune + apply against Inductor's
#                                                          # max-autotune from an empty cache, M = 1, 8, 32
# Each step inside has its own time limit, so a slow one cannot starve the ones after it; logs, JSON and the runs'
# folders (tarred) go to $OUT, and the end of the log is printed.
set -u
part=${1:?a step: suite, replay, decisions-a..d, eager-tests, eager-full, model-tune, model-inductor, model-cold}
OUT=${OUT:-runs/h200-$part}
WORK=${WORK:-/tmp/h200-session}
WORKLOAD=${WORKLOAD:-examples/h200-decode.yaml}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
step() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s): $*"; local t0=$SECONDS
         timeout "$limit" "$@"; echo "== $name: exit $? after $((SECONDS - t0)) s"; }
tune() {  # tune WORKLOAD into $1 (--json to $2) within $3 seconds; prints its wall time
    local t0; t0=$(date +%s.%N)
    echo "== tune $1 (limit $3 s)"
    timeout "$3" python3 -m farm tune "$WORKLOAD" --devices gpu --out "$1" --json > "$2" 2> "$2.err"
    echo "exit $? wall $(python3 -c "import time; print(round(time.time() - $t0, 1))") s" | tee "$2.wall"
}
tune_verify() {  # tune $1 into $WORK/$2 within $3 s, then farm verify it (both calling modes) within $4 s
    step "tune-$2" "$3" python3 -m farm tune "$1" --devices gpu --out "$WORK/$2" --json > "$OUT/$2-tune.json" 2> "$OUT/$2-tune.err"
    step "verify-$2" "$4" python3 -m farm verify "$WORK/$2" --devices gpu --json > "$OUT/$2-verify.json"
    python3 -m farm report "$WORK/$2" > "$OUT/$2-report.txt" 2>&1
}
model() { step "model-$1" "$2" python3 benchmarks/model_step.py run --out "$WORK/model" --size qwen2.5-7b "${@:3}"; }

{
nvidia-smi --query-gpu=index,name,uuid,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
grep -m1 "model name" /proc/cpuinfo
case "$part" in
suite)
    step gpu-tests 150 python3 -m pytest -q -rs tests/gpu
    step scaling 240 python3 benchmarks/farm_gpu_scaling.py --gpus 1,2 --workload examples/h200-farm.yaml --out "$WORK/scaling"
    step publish 60 python3 -m farm publish "$WORK/scaling/2gpu/overrides" --to "$WORK/published"
    step replay 150 python3 benchmarks/replay_first_call.py --workload examples/h200-farm.yaml --device cuda \
         --out "$WORK/replay" --published "$WORK/published"
    tar -C "$WORK" -czf "$OUT/artifacts.tgz" --exclude='*.lock' scaling/1gpu scaling/2gpu scaling/scaling.log published \
        replay/report.json replay/phases.log replay/tunable_results0.json 2>/dev/null
    step triton "${TRITON_LIMIT:-150}" python3 benchmarks/gpu_suite.py all --parts triton --contenders "${CONTENDERS:-triton,ours}" \
         --out "$WORK/suite" --budget "${TRITON_LIMIT:-150}"
    tar -C "$WORK" -czf "$OUT/suite.tgz" suite 2>/dev/null ;;
replay)
    [ "${SKIP_TESTS:-0}" = 1 ] || step gpu-tests 200 python3 -m pytest -q -rs tests/gpu
    step tune 300 python3 -m farm tune examples/h200-replay.yaml --devices gpu --out "$WORK/run"
    step publish 60 python3 -m farm publish "$WORK/run/overrides" --to "$WORK/published"
    step report 60 python3 -m farm report "$WORK/run/results"
    python3 -m farm report "$WORK/run/results" --json > "$OUT/report.json"
    step replay 240 python3 benchmarks/replay_overhead.py gpu --workload examples/h200-replay.yaml \
         --published "$WORK/published" --results "$WORK/run/results" --rounds "${ROUNDS:-5}" --json "$OUT/replay.json"
    step cpu-replay 60 python3 benchmarks/replay_overhead.py cpu
    tar -C "$WORK" -czf "$OUT/run.tgz" run/results run/overrides run/job.json published 2>/dev/null ;;
decisions-a)
    [ -n "${ENGINES-1}" ] && step engines 100 python3 benchmarks/replay_overhead.py engines --rounds 3 --json "$OUT/engines.json"
    tune "$WORK/d1" "$OUT/tune1.json" 300
    step report1 30 python3 -m farm report "$WORK/d1"
    step modes1 140 python3 benchmarks/call_modes.py "$WORK/d1" --rounds 5 --json "$OUT/modes1.json"
    tar -C "$WORK" -czf "$OUT/d1.tgz" --exclude='*.lock' d1 2>/dev/null ;;
decisions-b)
    tune "$WORK/d2" "$OUT/tune2.json" 300
    step modes2 100 python3 benchmarks/call_modes.py "$WORK/d2" --rounds 5 --json "$OUT/modes2.json"
    [ -n "${RUN1:-}" ] && step compare 60 python3 benchmarks/reproducibility.py --compare "$RUN1" "$WORK/d2" \
        --json "$OUT/reproducibility.json"
    wall=$(sed -n 's/.*wall \([0-9.]*\) s/\1/p' "$OUT/tune2.json.wall")
    step kill 300 python3 benchmarks/kill_recovery.py "$WORKLOAD" --devices gpu --uninterrupted "$WORK/d2" \
        --uninterrupted-s "$wall" --at 0.4 --out "$WORK/kill" --json "$OUT/kill.json"
    tar -C "$WORK" -czf "$OUT/d2.tgz" --exclude='*.lock' d2 kill/killed 2>/dev/null ;;
decisions-c)
    step engines 60 python3 benchmarks/replay_overhead.py engines --rounds 3 --json "$OUT/engines3.json"
    step kill 360 python3 benchmarks/kill_recovery.py "$WORKLOAD" --devices gpu --at 0.4 --out "$WORK/kill" \
        --json "$OUT/kill.json"
    tune "$WORK/d4" "$OUT/tune4.json" 160
    step compare 30 python3 benchmarks/reproducibility.py --compare "$WORK/kill/uninterrupted" "$WORK/d4" \
        --json "$OUT/reproducibility.json"
    step modes4 60 python3 benchmarks/call_modes.py "$WORK/d4" --rounds 5 --json "$OUT/modes4.json"
    tar -C "$WORK" -czf "$OUT/c.tgz" --exclude='*.lock' kill/uninterrupted kill/killed d4 2>/dev/null ;;
decisions-d)
    step kill 390 python3 benchmarks/kill_recovery.py "$WORKLOAD" --devices gpu --at 0.4 --out "$WORK/kill" \
        --json "$OUT/kill.json"
    step gpu-tests 150 python3 -m pytest -q -x -rs tests/gpu/test_ops_gpu.py tests/gpu/test_library_engines.py \
        -k "splitk or triton or decode or replay or graph"
    tar -C "$WORK" -czf "$OUT/d.tgz" --exclude='*.lock' kill/uninterrupted kill/killed 2>/dev/null ;;
eager-tests)
    step tests-new 120 python3 -m pytest -q -rs tests/gpu/test_eager_calls_gpu.py tests/gpu/test_ops_gpu.py
    step tests-rest 360 python3 -m pytest -q -rs tests/gpu --ignore=tests/gpu/test_eager_calls_gpu.py \
        --ignore=tests/gpu/test_ops_gpu.py
    step micro 40 python3 benchmarks/eager_calls.py micro --device gpu
    step host 90 python3 benchmarks/eager_calls.py host --device gpu --json "$OUT/host.json" ;;
eager-full)
    tune_verify examples/h200-library-plans.yaml lp 330 90
    tar -C "$WORK" -czf "$OUT/lp.tgz" lp/results lp/overrides lp/job.json 2>/dev/null
    tune_verify examples/h200-attention.yaml attn 90 30
    tar -C "$WORK" -czf "$OUT/attn.tgz" attn/results attn/overrides attn/job.json 2>/dev/null
    step host 40 python3 benchmarks/eager_calls.py host --device gpu --rounds 7 --json "$OUT/host.json" ;;
model-tune)
    step gpu-tests 150 python3 -m pytest -q -x -rs tests/gpu/test_models_gpu.py
    model decoder 420 --batches 1,8,32 --parts capture,meta,tune,apply,steps
    rm -rf "$WORK/model/inductor-cache"; tar -C "$WORK" -czf "$OUT/model.tgz" model 2>/dev/null ;;
model-inductor)
    model inductor 420 --batches 1 --parts inductor,start
    rm -rf "$WORK/model/inductor-cache"; tar -C "$WORK" -czf "$OUT/model.tgz" model 2>/dev/null ;;
model-cold)
    model cold 570 --batches 1,8,32 --parts capture,tune,apply,cold
    rm -rf "$WORK"/model/inductor-cold-*; tar -C "$WORK" -czf "$OUT/model.tgz" model 2>/dev/null ;;
*)
    echo "unknown step $part"; exit 2 ;;
esac
} > "$OUT/session.log" 2>&1
grep -v '^INFO\|^WARNING\|^(raylet)\|^(DeviceWorkerImpl' "$OUT/session.log" | tail -c 11000
