#!/usr/bin/env bash
# SmolLM2's hybrid rows under the hybrid rule that weighs paces (`HybridSettings.pace`: no
# drafter round while the drafter's rounds commit fewer tokens a second than plain decoding
# steps), measured alone on the machine in one sitting beside what they are weighed against:
# prompt lookup and the best drafter alone (EAGLE-3's chain; REFERENCES adds suffix-chain and
# medusa2-chain). About 35 min on two cores, after `bash bench/smollm2_sitting.sh`:
#   bash bench/smollm2_pace_sitting.sh
# The leaderboard's hybrid reports measured before the rule weighed paces (no
# `serving.hybrid_rule` in them) move to <runs>/reports-by-scores/, and `bench/families.py
# --phase eval` measures those rows again; the references go to $OUT/<row>/ with the
# leaderboard rows' settings. Resumable: what is measured is kept.
# Settings (environment): RUNS (runs), DATA (runs/smollm2-data), OUT ($RUNS/sitting/pace),
# REFERENCES (which, in order: "prompt-lookup eagle3-chain").
set -euo pipefail
runs=${RUNS:-runs}
data=${DATA:-runs/smollm2-data}
out=${OUT:-$runs/sitting/pace}
mkdir -p "$out" "$runs/reports-by-scores"
started=$(date +%s)
for row in eagle3-hybrid dflash-hybrid; do
    report="$runs/reports/$row/report.json"
    if [ -f "$report" ] && ! grep -q '"hybrid_rule"' "$report"; then
        mv "$runs/reports/$row" "$runs/reports-by-scores/$row"
        echo "$row: the earlier rule's report kept in $runs/reports-by-scores/$row"
    fi
done
python bench/families.py --target smollm2-135m-instruct --work "$runs" --phase eval \
    --threads 2 --certificate-later
common=(--prompt-set humaneval --prompt-set "$data/eval-turns.jsonl"
    --heldout-from "$data/train.jsonl" --prompts 8 --max-new-tokens 128 --temperatures 0 1
    --certificate-samples 0 --threads 2)
source "$(dirname "$0")/measure_row.sh"
declare -A reference=(
    [prompt-lookup]="--prompt-lookup --target smollm2-135m-instruct"
    [suffix-chain]="--suffix --target smollm2-135m-instruct"
    [eagle3-chain]="$runs/eagle3-smollm2-135m-instruct"
    [medusa2-chain]="$runs/medusa2-smollm2-135m-instruct"
)
for name in ${REFERENCES:-prompt-lookup eagle3-chain}; do
    read -r -a args <<< "${reference[$name]}"
    measure "$name" "${args[@]}"
done
echo "pace sitting: $(($(date +%s) - started)) s"
