#!/usr/bin/env bash
# Every timed SmolLM2 measurement in one sitting, alone on the machine (about 2.5 h on two
# cores), after `bash bench/smollm2_train.sh` has trained every family:
#   1. the leaderboard's rows (`bench/families.py --phase eval --certificate-later`: every
#      family's chain, trees, EAGLE-3's and DFlash's hybrids, prompt lookup, suffix decoding,
#      transformers' assisted generation with the draft LM);
#   2. EAGLE-3's chain with target and drafter in bfloat16 (CPUs that multiply it natively);
#   3. the repeated-request workload (`bench/repeated_requests.sh`), T = 0 and T = 1;
#   4. suffix decoding's memory per token and lookup time against SmolLM2's forward.
#   bash bench/smollm2_sitting.sh
# Resumable: each step skips what it already measured. Then, in any sitting:
#   python bench/families.py --target smollm2-135m-instruct --work runs --phase certify
#   python bench/families.py --target smollm2-135m-instruct --work runs --phase board \
#       --output-dir bench/results/<folder>
# Settings (environment): RUNS (runs: drafters, reports), DATA (runs/smollm2-data), OUT (where
# the extra measurements go: $RUNS/sitting).
set -euo pipefail
runs=${RUNS:-runs}
data=${DATA:-runs/smollm2-data}
out=${OUT:-$runs/sitting}
mkdir -p "$out"
started=$(date +%s)
python bench/families.py --target smollm2-135m-instruct --work "$runs" --phase eval \
    --threads 2 --certificate-later
echo "rows: $(($(date +%s) - started)) s"
if [ ! -f "$out/eagle3-chain-bfloat16/report.json" ]; then
    draftzoo eval "$runs/eagle3-smollm2-135m-instruct" --dtype bfloat16 \
        --prompt-set humaneval --prompt-set "$data/eval-turns.jsonl" \
        --heldout-from "$data/train.jsonl" --prompts 8 --max-new-tokens 128 \
        --temperatures 0 1 --certificate-samples 0 --threads 2 \
        --output-dir "$out/eagle3-chain-bfloat16"
fi
TARGET=smollm2-135m-instruct EAGLE3="$runs/eagle3-smollm2-135m-instruct" \
    DFLASH="$runs/dflash-smollm2-135m-instruct" OUT="$out/repeated" TEMPERATURES="0 1" \
    bash bench/repeated_requests.sh | tee "$out/repeated.txt"
if [ ! -f "$out/suffix-cost.txt" ]; then
    python bench/suffix_cost.py --target smollm2-135m-instruct --answers "$data/train.jsonl" \
        --heldout-skip 4500 --tokens 20000 100000 --rounds 100 > "$out/suffix-cost.part"
    mv "$out/suffix-cost.part" "$out/suffix-cost.txt"
fi
echo "sitting: $(($(date +%s) - started)) s"
