#!/usr/bin/env bash
# Every family for SmolLM2-135M-Instruct trained on the same rows at one budget (the recipes'
# 1,100 steps x 4 packed rows of 512; Medusa-2 in two stages: 950 heads-only steps, then 150
# joint steps with the LoRA), from one
# offline capture of the union of the layers they read: EAGLE-3 taps 2, 15, 27, DFlash 2, 28
# and the final post-norm state 30 (EAGLE-1, Medusa-1, MTP, the draft LM's teacher). Medusa-2's
# joint stage trains online: its LoRA changes the target's states. Run `bash bench/smollm2_data.sh` first.
#   bash bench/smollm2_train.sh
# Resumable: a rerun keeps finished shards, resumes each run from its newest checkpoint and
# skips a family whose drafter exists. Settings (environment):
#   DATA      the data folder (runs/smollm2-data; its train.jsonl)
#   RUNS      where shards and drafters go (runs)
#   FMT       capture storage: float8_e4m3 (default, ~half of bfloat16) or bfloat16
#   TARGET_DTYPE  the target's weights in the capture's forwards: bfloat16 (default; 3.2x the
#             float32 forward on an AVX512-BF16 CPU, and FP8 storage rounds the states far more
#             than bfloat16 does) or float32, as the recipes load it for training and eval
#   FAMILIES  which, in order ("eagle3 eagle1 medusa1 mtp dflash draft_lm medusa2")
#   STEPS     steps for every family instead of the recipes' (a smoke run: STEPS=2)
#   SET_<stage>  more --set pairs for one run, e.g. SET_eagle3="eagle.draft_vocab_size=1024"
#             (stages: the families, and medusa2_heads for Medusa-2's heads-only stage)
set -euo pipefail
data=${DATA:-runs/smollm2-data}
runs=${RUNS:-runs}
fmt=${FMT:-float8_e4m3}
target_dtype=${TARGET_DTYPE:-bfloat16}
families=${FAMILIES:-eagle3 eagle1 medusa1 mtp dflash draft_lm medusa2}
shards="$runs/smollm2-capture-$fmt-$target_dtype"
common=(--set "data.source=$data/train.jsonl")
captured=$(date +%s)
draftzoo capture recipes/eagle3/smollm2-135m-instruct.yaml --dir "$shards" "${common[@]}" \
    --set "capture.dtype=$fmt" --set "target.dtype=$target_dtype" \
    --layer 2 --layer 15 --layer 27 --layer 28 --layer 30
echo "capture: $(($(date +%s) - captured)) s (a rerun that finds every shard done: seconds)"
train() {  # STAGE RECIPE_FAMILY OUT [--set pairs...]: one run, skipped when its drafter exists
    local stage=$1 recipe=$2 out=$3
    shift 3
    if [ -f "$out/draftzoo.json" ]; then
        echo "$stage: $out exists"
        return
    fi
    local args=("${common[@]}" --set "output_dir=$out" "$@")
    if [ -n "${STEPS:-}" ]; then  # the recipes warm up for up to 50 steps
        args+=(--set "train.max_steps=$STEPS" --set "train.warmup_steps=$((STEPS > 50 ? 50 : 0))")
    fi
    local extra="SET_$stage"
    for pair in ${!extra:-}; do args+=(--set "$pair"); done
    local started
    started=$(date +%s)
    draftzoo train "recipes/$recipe/smollm2-135m-instruct.yaml" "${args[@]}"
    echo "$stage: trained in $(($(date +%s) - started)) s -> $out"
}
offline=(--set capture.mode=offline --set "capture.dir=$shards" --set "capture.dtype=$fmt")
for family in $families; do
    if [ "$family" = medusa2 ]; then
        heads="$runs/medusa2-heads-smollm2-135m-instruct"
        train medusa2_heads medusa1 "$heads" "${offline[@]}" --set train.max_steps=950
        train medusa2 medusa2 "$runs/medusa2-smollm2-135m-instruct" --set "init_heads=$heads"
    else
        train "$family" "$family" "$runs/${family//_/-}-smollm2-135m-instruct" "${offline[@]}"
    fi
done
echo done
