#!/usr/bin/env bash
# Every family for SmolLM2-135M-Instruct trained on the same rows at one budget (the recipes'
# 1,400 steps x 4 packed rows of 512; Medusa-2 700 steps from Medusa-1's heads), from one
# offline capture of the union of the layers they read: EAGLE-3 taps 2, 15, 27, DFlash 2, 28
# and the final post-norm state 30 (EAGLE-1, Medusa-1, MTP, the draft LM's teacher). Medusa-2
# trains online: its LoRA changes the target's states. Run `bash bench/smollm2_data.sh` first.
#   bash bench/smollm2_train.sh
# Resumable: a rerun keeps finished shards, resumes each run from its newest checkpoint and
# skips a family whose drafter exists. Settings (environment):
#   DATA      the data folder (runs/smollm2-data; its train.jsonl)
#   RUNS      where shards and drafters go (runs)
#   FMT       capture storage: float8_e4m3 (default, ~half of bfloat16) or bfloat16
#   FAMILIES  which, in order ("eagle3 eagle1 medusa1 mtp dflash draft_lm medusa2")
#   STEPS     steps for every family instead of the recipes' (a smoke run: STEPS=2)
#   SET_<family>  more --set pairs for one family, e.g. SET_eagle3="eagle.draft_vocab_size=1024"
set -euo pipefail
data=${DATA:-runs/smollm2-data}
runs=${RUNS:-runs}
fmt=${FMT:-float8_e4m3}
families=${FAMILIES:-eagle3 eagle1 medusa1 mtp dflash draft_lm medusa2}
shards="$runs/smollm2-capture-$fmt"
common=(--set "data.source=$data/train.jsonl")
draftzoo capture recipes/eagle3/smollm2-135m-instruct.yaml --dir "$shards" "${common[@]}" \
    --set "capture.dtype=$fmt" --layer 2 --layer 15 --layer 27 --layer 28 --layer 30
for family in $families; do
    out="$runs/$family-smollm2-135m-instruct"
    if [ -f "$out/draftzoo.json" ]; then
        echo "$family: $out exists"
        continue
    fi
    args=("${common[@]}" --set "output_dir=$out")
    if [ "$family" = medusa2 ]; then
        args+=(--set "init_heads=$runs/medusa1-smollm2-135m-instruct")
    else
        args+=(--set capture.mode=offline --set "capture.dir=$shards" --set "capture.dtype=$fmt")
    fi
    if [ -n "${STEPS:-}" ]; then  # the recipes warm up for 50 steps
        args+=(--set "train.max_steps=$STEPS" --set "train.warmup_steps=$((STEPS > 50 ? 50 : 0))")
    fi
    extra="SET_$family"
    for pair in ${!extra:-}; do args+=(--set "$pair"); done
    started=$(date +%s)
    draftzoo train "recipes/$family/smollm2-135m-instruct.yaml" "${args[@]}"
    echo "$family: trained in $(($(date +%s) - started)) s -> $out"
done
echo done
