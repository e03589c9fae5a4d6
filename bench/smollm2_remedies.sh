#!/usr/bin/env bash
# EAGLE-3 for SmolLM2 past its equal-budget recipe: one change at a time, each trained from the
# same offline FP8 capture as `bench/smollm2_train.sh`'s runs, then every variant scored side
# by side by teacher-forced acceptance (clock-free: it may share the machine).
#   bash bench/smollm2_remedies.sh            # after bench/smollm2_train.sh
# Variants (each a folder under RUNS; a rerun skips a finished one and resumes a stopped one):
#   eagle3-smollm2-vocab16k   draft vocabulary 16,384 instead of 8,192 (same steps)
#   eagle3-smollm2-3passes    3,300 steps instead of 1,100: three passes over the same rows
# Settings (environment): DATA (runs/smollm2-data), RUNS (runs), VARIANTS (which, in order: "vocab16k 3passes"),
# PROMPTS (per prompt set, 8), STEPS (every variant's steps instead: a smoke run).
set -euo pipefail
data=${DATA:-runs/smollm2-data}
runs=${RUNS:-runs}
variants=${VARIANTS:-vocab16k 3passes}
shards="$runs/smollm2-capture-float8_e4m3-bfloat16"
recipe=recipes/eagle3/smollm2-135m-instruct.yaml
offline=(--set "data.source=$data/train.jsonl" --set capture.mode=offline --set "capture.dir=$shards" --set capture.dtype=float8_e4m3)
declare -A changes=(
    [vocab16k]="eagle.draft_vocab_size=16384"
    [3passes]="train.max_steps=3300"
)
scored=(--eagle3 "$(realpath "$runs/eagle3-smollm2-135m-instruct")")
for variant in $variants; do
    out="$runs/eagle3-smollm2-$variant"
    scored+=(--eagle3 "$(realpath -m "$out")")
    if [ -f "$out/draftzoo.json" ]; then
        echo "$variant: $out exists"
        continue
    fi
    args=("${offline[@]}" --set "output_dir=$out" --set "${changes[$variant]}")
    if [ -n "${STEPS:-}" ]; then
        args+=(--set "train.max_steps=$STEPS" --set train.warmup_steps=0)
    fi
    started=$(date +%s)
    draftzoo train "$recipe" "${args[@]}"
    echo "$variant: trained in $(($(date +%s) - started)) s -> $out"
done
turns=$(realpath "$data/eval-turns.jsonl")
cd bench
python teacher_forced_bench.py --target smollm2-135m-instruct "${scored[@]}" \
    --prompt-set humaneval --prompt-set "$turns" \
    --prompts "${PROMPTS:-8}" --max-new-tokens 128 --temperatures 0 1 --threads 1
