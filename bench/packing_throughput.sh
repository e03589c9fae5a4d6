#!/usr/bin/env bash
# Supervised tokens per second with packed rows and with one conversation per (padded) row:
# one recipe (default EAGLE-3 for testbed-small), the same conversations, steps, rows per step
# and seed, one after the other on this machine; each drafter's record states its rate.
#   STEPS=60 SAMPLES=2000 bash bench/packing_throughput.sh [OUT]   # default runs/packing
#   RECIPE=recipes/eagle3/smollm2-135m-instruct.yaml SET="data.source=F eagle.draft_vocab_size=4096" ...
set -euo pipefail
out=${1:-runs/packing}
steps=${STEPS:-60}
samples=${SAMPLES:-2000}
recipe=${RECIPE:-recipes/eagle3/testbed-small.yaml}
extra=()
for pair in ${SET:-}; do extra+=(--set "$pair"); done
mkdir -p "$out"
for packing in true false; do
    rm -rf "$out/eagle3-packing-$packing" "$out/eagle3-packing-$packing.work"
    draftzoo train "$recipe" "${extra[@]}" --set "data.packing=$packing" \
        --set "data.max_samples=$samples" --set "train.max_steps=$steps" \
        --set train.warmup_steps=5 --set train.checkpoint_every=1000 \
        --set "output_dir=$out/eagle3-packing-$packing" > "$out/train-packing-$packing.log" 2>&1
done
python - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rates = {}
for packing in ("true", "false"):
    training = json.loads((out / f"eagle3-packing-{packing}" / "draftzoo.json").read_text())["training"]
    rates[packing] = training["supervised_tokens_per_second"]
    print(f"packing {packing:5}: {training['supervised_tokens']:7d} supervised tokens in "
          f"{training['train_seconds']:6.1f} s = {rates[packing]:7.1f} tokens/s")
print(f"packed / one per row: {rates['true'] / rates['false']:.2f}x")
PY
