#!/usr/bin/env bash
# EAGLE-3 and DFlash for SmolLM2 past their equal-budget recipes: one change at a time, each
# trained from the same offline FP8 capture as `bench/smollm2_train.sh`'s runs, then scored
# beside the recipe's drafter on the same prompts (clock-free: it may share the machine):
# EAGLE-3 by teacher-forced acceptance, DFlash by its chain's tau (bench/dflash_tau.py).
#   bash bench/smollm2_remedies.sh            # after bench/smollm2_train.sh
# Variants (each a folder under RUNS; a rerun skips a finished one and resumes a stopped one):
#   eagle3-smollm2-vocab16k   draft vocabulary 16,384 instead of 8,192 (same steps)
#   eagle3-smollm2-vocab4k    draft vocabulary 4,096: the same question on a smaller set, whose
#                             answers hold fewer than 16,384 distinct tokens
#   eagle3-smollm2-3passes    3,300 steps instead of 1,100: three passes over the same rows
#   dflash-smollm2-combined   the testbed's three remedies together (4 draft layers, taps at
#                             layers 2, 15, 27, 28, slot weights decaying by 2 instead of 4)
# Settings (environment): DATA (runs/smollm2-data), RUNS (runs), VARIANTS (which, in order:
# "vocab16k 3passes combined"), PROMPTS (per prompt set, 8), STEPS (every variant's steps
# instead, warm-up as bench/smollm2_train.sh's STEPS: a smoke run, or a smaller set's budget).
set -euo pipefail
data=${DATA:-runs/smollm2-data}
runs=${RUNS:-runs}
variants=${VARIANTS:-vocab16k 3passes combined}
shards="$runs/smollm2-capture-float8_e4m3-bfloat16"
offline=(--set "data.source=$data/train.jsonl" --set capture.mode=offline --set "capture.dir=$shards" --set capture.dtype=float8_e4m3)
declare -A family_of=([vocab16k]=eagle3 [vocab4k]=eagle3 [3passes]=eagle3 [combined]=dflash)
declare -A changes=(
    [vocab16k]="eagle.draft_vocab_size=16384"
    [vocab4k]="eagle.draft_vocab_size=4096"
    [3passes]="train.max_steps=3300"
    [combined]="dflash.num_layers=4 dflash.layers=[2,15,27,28] dflash.loss_decay=2.0"
)
scored_eagle3=(--eagle3 "$(realpath "$runs/eagle3-smollm2-135m-instruct")")
scored_dflash=("$(realpath "$runs/dflash-smollm2-135m-instruct")")
for variant in $variants; do
    family=${family_of[$variant]}
    out="$runs/$family-smollm2-$variant"
    if [ "$family" = eagle3 ]; then
        scored_eagle3+=(--eagle3 "$(realpath -m "$out")")
    else
        scored_dflash+=("$(realpath -m "$out")")
    fi
    if [ -f "$out/draftzoo.json" ]; then
        echo "$variant: $out exists"
        continue
    fi
    args=("${offline[@]}" --set "output_dir=$out")
    for pair in ${changes[$variant]}; do args+=(--set "$pair"); done
    if [ -n "${STEPS:-}" ]; then
        args+=(--set "train.max_steps=$STEPS" --set "train.warmup_steps=$((STEPS > 50 ? 50 : 0))")
    fi
    started=$(date +%s)
    draftzoo train "recipes/$family/smollm2-135m-instruct.yaml" "${args[@]}"
    echo "$variant: trained in $(($(date +%s) - started)) s -> $out"
done
turns=$(realpath "$data/eval-turns.jsonl")
sets=(--prompt-set humaneval --prompt-set "$turns")
if [ ${#scored_dflash[@]} -gt 1 ]; then
    python bench/dflash_tau.py "${scored_dflash[@]}" "${sets[@]}" --prompts "${PROMPTS:-8}" \
        --gamma 7
fi
if [ ${#scored_eagle3[@]} -gt 2 ]; then
    cd bench
    python teacher_forced_bench.py --target smollm2-135m-instruct "${scored_eagle3[@]}" \
        "${sets[@]}" --prompts "${PROMPTS:-8}" --max-new-tokens 128 --temperatures 0 1 \
        --threads 1
fi
