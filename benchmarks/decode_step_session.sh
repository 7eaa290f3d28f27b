#!/usr/bin/env bash
# The whole decode step (issue 70) on a GPU lease, one named step a call, each fitting a 10-minute call:
#   OUT=DIR bash benchmarks/decode_step_session.sh pieces        # GPU tests of the step's pieces; masked decode
#                                                                # attention per call in a graph against torch's SDPA
#   OUT=DIR bash benchmarks/decode_step_session.sh farm MODEL    # capture, tune, apply, steps of MODEL at M = 1 and 8
#   OUT=DIR bash benchmarks/decode_step_session.sh inductor MODEL BATCHES   # Inductor both modes, compile(apply)
#   OUT=DIR bash benchmarks/decode_step_session.sh cold MODEL    # Inductor max-autotune from an empty cache, M = 1, 8
# MODEL: llama (Llama-3.1-8B's shape), qwen2 (Qwen2.5-7B's) or mistral (Mistral-7B's, a sliding window of 512 over
# a static cache of 1,032). Run folders live in $WORK (kept between calls of one lease; tar them to $OUT).
set -u
part=${1:?a step: pieces, farm, inductor, cold}
OUT=${OUT:-runs/decode-$part}
WORK=${WORK:-/tmp/w/decode}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
step() { local name=$1 limit=$2; shift 2; echo "== $name (limit ${limit}s): $*"; local t0=$SECONDS
         timeout "$limit" "$@"; echo "== $name: exit $? after $((SECONDS - t0)) s"; }
spec() {
    case "$1" in
    llama) echo "library_models:llama:size=llama3.1-8b,context=1032,dtype=bfloat16" ;;
    qwen2) echo "library_models:qwen2:size=qwen2.5-7b,context=1032,dtype=bfloat16" ;;
    mistral) echo "library_models:mistral:size=mistral-7b,context=1032,window=512,dtype=bfloat16" ;;
    *) echo "unknown model $1" >&2; exit 2 ;;
    esac
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
case "$part" in
pieces)
    step gpu-tests 240 python3 -m pytest -q -rs -x tests/gpu/test_decode_step_gpu.py \
        "tests/gpu/test_gpu_engines.py::test_decode_attention_is_right_for_every_split_and_in_graph_replays"
    step attention-llama 120 python3 benchmarks/masked_decode_attention.py --batches 1 8 --kv 1024 4096 8192
    step attention-qwen 90 python3 benchmarks/masked_decode_attention.py --batches 1 8 --kv 1024 8192 --heads 28 4
    ;;
farm)
    model=${2:?a model}
    step "farm-$model" "${LIMIT:-560}" python3 benchmarks/model_step.py run --out "$WORK/$model" --models "$(spec "$model")" \
        --batches "${BATCHES:-1,8}" --parts capture,tune,apply,steps --rounds 9
    ;;
inductor)
    model=${2:?a model}
    step "inductor-$model" 570 python3 benchmarks/model_step.py run --out "$WORK/$model" --models "$(spec "$model")" \
        --batches "${3:-1}" --parts inductor --rounds 9 --budget-s 400
    ;;
cold)
    model=${2:?a model}
    step "cold-$model" 570 python3 benchmarks/model_step.py run --out "$WORK/$model" --models "$(spec "$model")" \
        --batches "${BATCHES:-1,8}" --parts cold
    ;;
esac
for d in "$WORK"/*/; do
    [ -d "$d" ] && python3 benchmarks/model_step.py table "$d" 2>/dev/null | sed "s|^|$(basename "$d"): |"
done
