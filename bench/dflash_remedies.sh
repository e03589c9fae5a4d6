#!/usr/bin/env bash
# DFlash on testbed-small: the remedies for its low acceptance side by side at one short budget
# (the recipe's data and rows, STEPS steps each, seed 0), then each drafter's chain tau on the
# same prompts (bench/dflash_tau.py). Resumable: a variant whose drafter exists is not retrained.
#   bash bench/dflash_remedies.sh [WORK]          # default runs/dflash-remedies; STEPS=600
# Variants (name: --set pairs over recipes/dflash/testbed-small.yaml):
set -euo pipefail
work=${1:-runs/dflash-remedies}
steps=${STEPS:-600}
variants=(
    "baseline:"
    "layers4:dflash.num_layers=4"
    "block4:dflash.block_size=4"
    "taps4:dflash.layers=[1,4,7,10]"
    "decay2:dflash.loss_decay=2.0"
)
mkdir -p "$work"
for variant in "${variants[@]}"; do
    name=${variant%%:*}
    out="$work/$name"
    if [ -f "$out/draftzoo.json" ]; then
        echo "$name: exists"
        continue
    fi
    args=(--set "output_dir=$out" --set "train.max_steps=$steps" --set "train.checkpoint_every=$steps")
    for pair in ${variant#*:}; do args+=(--set "$pair"); done
    started=$(date +%s)
    draftzoo train recipes/dflash/testbed-small.yaml "${args[@]}" > "$work/$name.log" 2>&1
    echo "$name: trained $steps steps in $(($(date +%s) - started)) s"
done
folders=()
for variant in "${variants[@]}"; do folders+=("$work/${variant%%:*}"); done
python bench/dflash_tau.py recipes/zoo/dflash-testbed-small "${folders[@]}" | tee "$work/tau.txt"
