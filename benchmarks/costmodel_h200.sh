#!/usr/bin/env bash
# The cost model's GPU measurements (docs/costmodel.md, benchmarks/RESULTS.md), on one GPU:
#   bash benchmarks/costmodel_h200.sh train OUT              # every candidate of the training families
#   bash benchmarks/costmodel_h200.sh heldout OUT MODEL      # held-out families: --prune MODEL, then exhaustive
#   bash benchmarks/costmodel_h200.sh more OUT TRAIN_RUN     # more training data (two families and the project's
#        own GPU workloads), a model trained on it and TRAIN_RUN, and the held-out families pruned with it
# Each step writes its run folders, the farm's output and timings under OUT.
set -uo pipefail
step=$1; out=$2; model=${3:-}
mkdir -p "$out"
python benchmarks/costmodel_workloads.py --target gpu --out "$out/workloads" > "$out/workloads.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$out/gpu.txt" 2>&1
tune() {  # name, extra args...: one timed farm tune, cut short (Ctrl-C) at the budget
    local name=$1; shift
    local t0=$(date +%s.%N)
    # a kernel cache of its own per run: neither run compiles for the other
    TRITON_CACHE_DIR="/tmp/triton-$name-$$" timeout -s INT "${BUDGET_S:-540}" python -m farm tune "$@" --devices gpu --out "$out/$name" --progress-every 30 \
        --allow-partial > "$out/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc wall_s=$(python -c "print(round($(date +%s.%N) - $t0, 1))")" | tee -a "$out/timings.txt"
    # one archive per run folder: the device tool brings back files, not deep folder trees
    tar -C "$out" -czf "$out/$name.tgz" "$name" && rm -rf "${out:?}/$name"
}
case $step in
  train) tune train "$out/workloads/cm-gpu-train.yaml" ;;
  heldout)  # the pruned tune first: if anything, the machine is colder for it
    tune heldout-pruned "$out/workloads/cm-gpu-heldout.yaml" --prune "$model"
    tune heldout-exhaustive "$out/workloads/cm-gpu-heldout.yaml" ;;
  more)
    BUDGET_S=200 tune extra "$out/workloads/cm-gpu-extra.yaml"
    BUDGET_S=150 tune library-plans examples/h200-library-plans.yaml
    BUDGET_S=90 tune suite examples/h200-suite.yaml
    mkdir -p "$out/data" && for r in extra library-plans suite; do tar -C "$out/data" -xzf "$out/$r.tgz"; done
    python -m farm model train "$model" "$out"/data/* --out "$out/model-more.json" > "$out/model-more.log" 2>&1
    BUDGET_S=70 tune heldout-pruned-more "$out/workloads/cm-gpu-heldout.yaml" --prune "$out/model-more.json"
    rm -rf "$out/data" ;;
  *) echo "usage: $0 train|heldout|more OUT [MODEL|TRAIN_RUN]" >&2; exit 2 ;;
esac
