#!/usr/bin/env bash
# Library models on a GPU lease (issue 63), one named part per 10-minute device call; the run folders live in
# runs/library (kept while the machine is warm), logs and JSON tarred to $OUT:
#   OUT=DIR bash benchmarks/library_models_session.sh tests     # the GPU tests of farm.apply on models
#   OUT=DIR bash benchmarks/library_models_session.sh llama     # transformers' Llama-3.2-1B shape, M = 1 and 8:
#                                                               # capture, tune, the model checks, steps, Inductor
#   OUT=DIR bash benchmarks/library_models_session.sh qwen2     # transformers' Qwen2.5-1.5B shape, the same
#   OUT=DIR bash benchmarks/library_models_session.sh resnet    # timm's ResNet-50, fp16, channels-last, N = 16
# SMALL=1 runs the same parts at the tests' tiny sizes (a CPU's check of the script itself); PARTS=capture,tune
# runs some of benchmarks/model_step.py's parts (the rest in a later call: each writes its JSON), LIMIT=SECONDS
# bounds them, APPLY_MODES=max-autotune compiles the applied model in Inductor's max-autotune mode (its default:
# reduce-overhead; measured slower for the applied model), BATCHES=1 the decoders at M = 1 alone. A part cut by
# LIMIT is finished by a later call with PARTS=inductor (the part that remains) while the machine is warm.
set -u
part=${1:?a part: tests, llama, qwen2, resnet}
OUT=${OUT:-runs/library-$part}
WORK=${WORK:-runs/library}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
step() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s): $*"; local t0=$SECONDS
         timeout "$limit" "$@"; echo "== $name: exit $? after $((SECONDS - t0)) s"; }
if [ "${SMALL:-0}" = 1 ]; then
  llama="library_models:llama:size=tiny,context=64"; qwen2="library_models:qwen2:size=tiny,context=64"
  resnet="library_models:resnet:batch=2,image=64,channels_last=1"; limit=300; rounds=8
else
  llama="library_models:llama:size=llama3.2-1b,context=512,dtype=bfloat16"
  qwen2="library_models:qwen2:size=qwen2.5-1.5b,context=512,dtype=bfloat16"
  resnet="library_models:resnet:name=resnet50,batch=16,image=224,channels_last=1,dtype=float16"; limit=560; rounds=${ROUNDS:-11}
fi
limit=${LIMIT:-$limit}
parts=${PARTS:-capture,tune,apply,steps,inductor}
bench() {  # bench NAME PARTS MODEL-ARGS...: benchmarks/model_step.py into $WORK/NAME
  step "$1-$2" "$limit" python3 benchmarks/model_step.py run --out "$WORK/$1" --parts "$2" --rounds "$rounds" \
    --apply-modes "${APPLY_MODES:-reduce-overhead}" "${@:3}"
}
case "$part" in
  tests)
    step gpu-tests 200 python3 -m pytest -q -rs -x tests/gpu/test_library_models_gpu.py tests/gpu/test_models_gpu.py \
      2>&1 | tee "$OUT/tests.log" ;;
  llama|qwen2)
    model=$llama; [ "$part" = qwen2 ] && model=$qwen2
    bench "$part" "$parts" --models "$model" --batches "${BATCHES:-1,8}" 2>&1 | tee "$OUT/$part.log" ;;
  resnet)
    bench resnet "$parts" --models "$llama" --batches "" --convnet "$resnet" \
      2>&1 | tee "$OUT/resnet.log" ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
tar -C "$WORK" -czf "$OUT/$part-json.tgz" --exclude='*/results/*' --exclude='inductor-cache' . 2>/dev/null
python3 benchmarks/model_step.py table "$WORK/$part" > "$OUT/$part-table.md" 2>/dev/null
tail -n 40 "$OUT/$part.log" 2>/dev/null || true
