#!/usr/bin/env bash
# The leaderboard sitting of 2026-12-02: every family at one budget, measured side by side in
# one process on one machine (2 threads), nothing else running during the eval phase.
set -euo pipefail
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
out=bench/results/cpu-families-2026-12-02
# train what the zoo does not already hold from the very same recipe (Medusa-2 at the budget)
python bench/families.py --phase train
# measure from scratch: every row of the board comes from this one process
stamp=$(date +%s)
if [ -d runs/families/reports ]; then mv runs/families/reports "runs/families/reports-$stamp"; fi
if [ -f runs/families/references.json ]; then
    mv runs/families/references.json "runs/families/references-$stamp.json"
fi
# measure every trained family (chain, and tree where it has them), prompt lookup and
# transformers' assisted generation, then rank them
python bench/families.py --phase eval --threads 2 2>&1 | tee "$out/eval.log"
python bench/families.py --phase board --output-dir "$out"
cp runs/families/references.json "$out/"
for report in runs/families/reports/*/; do cp "$report/summary.txt" "$out/$(basename "$report").txt"; done
# ship each family's best row into the zoo, then regenerate the zoo's board and the README table
python bench/families.py --phase ship
draftzoo leaderboard --zoo recipes/zoo --target testbed-small --output-dir recipes/zoo --readme README.md
# the certificate's power on real checkpoints
python bench/certificate_power.py eagle1-testbed-small --threads 2 > "$out/certificate-power.txt"
python bench/certificate_power.py medusa1-testbed-small --tree --threads 2 >> "$out/certificate-power.txt"
