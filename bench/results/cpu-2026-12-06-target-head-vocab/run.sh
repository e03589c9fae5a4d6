#!/bin/bash
# EAGLE-1, MTP and DFlash for SmolLM2 as shipped beside their copies drafting over EAGLE-3's
# 8,192-token draft vocabulary (bench/target_head_vocab.py), chains of 4, one process, alone.
set -euo pipefail
for f in eagle1 mtp dflash; do
  [ -d runs/$f-smollm2-vocab8k ] || python bench/target_head_vocab.py \
    recipes/zoo/$f-smollm2-135m-instruct runs/$f-smollm2-vocab8k \
    --vocab-from recipes/zoo/eagle3-smollm2-135m-instruct
done
python bench/drafter_bench.py --target smollm2-135m-instruct --chains-only \
  --drafter recipes/zoo/eagle1-smollm2-135m-instruct --drafter runs/eagle1-smollm2-vocab8k \
  --drafter recipes/zoo/mtp-smollm2-135m-instruct --drafter runs/mtp-smollm2-vocab8k \
  --drafter recipes/zoo/dflash-smollm2-135m-instruct --drafter runs/dflash-smollm2-vocab8k \
  --prompt-set humaneval --prompt-set runs/smollm2-data/eval-turns.jsonl \
  --prompts 6 --temperatures 0 1 --threads 2
