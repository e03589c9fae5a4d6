#!/usr/bin/env bash
# The SmolLM2-135M-Instruct training conversations and held-out requests, every answer written
# by the target itself. Each step resumes where a stopped run left off; rerun until it prints
# "done". Hours on two cores (the answers: ~1.2 M tokens at 100-150 tokens/s).
#   bash bench/smollm2_data.sh [DATA_DIR]          # default runs/smollm2-data
# BATCH sets the generation batch size (default 64; a GPU takes hundreds). DTYPE the target's
# weights while writing (default float32; bfloat16 samples ~1.8x faster on CPUs with AVX512-BF16,
# measured 156 -> 289 tokens/s at batch 64, and draws from nearly the same distribution).
# TURNS (default 2500) and CODE_EVERY (default 12) size a smaller set: TURNS=512 CODE_EVERY=60
# gives about 1,000 training requests (~40 min in bfloat16 at BATCH=128).
# Writes, in DATA_DIR:
#   user-turns.jsonl    TURNS requests SmolLM2 wrote from its own chat template (seed 0)
#   code-requests.jsonl every CODE_EVERY-th `testbed-chat` request ("Complete this Python function"
#                       with a docstring from installed packages' source), answer dropped;
#                       kept when present (another machine's packages give other requests)
#   requests.jsonl      both, the training requests
#   train.jsonl         the requests with SmolLM2's answers (T 0.7, top-p 0.95, <= 384 tokens)
#   eval-turns.jsonl    300 more requests (seed 1): the natural-language eval set; eval drops
#                       any that overlaps training (draftzoo eval --heldout-from train.jsonl)
set -euo pipefail
DATA=${1:-runs/smollm2-data}
TARGET=smollm2-135m-instruct
RECIPE=recipes/eagle3/smollm2-135m-instruct.yaml
BATCH=${BATCH:-64}
DTYPE=${DTYPE:-float32}
TURNS=${TURNS:-2500}
CODE_EVERY=${CODE_EVERY:-12}
mkdir -p "$DATA"
draftzoo target get "$TARGET"
draftzoo user-turns --target "$TARGET" --output "$DATA/user-turns.jsonl" --count "$TURNS" \
  --seed 0 --batch-size "$BATCH" --max-new-tokens 128 --dtype "$DTYPE"
draftzoo user-turns --target "$TARGET" --output "$DATA/eval-turns.jsonl" --count 300 \
  --seed 1 --batch-size "$BATCH" --max-new-tokens 128 --dtype "$DTYPE"
if [ ! -f "$DATA/requests.jsonl" ]; then
  python bench/smollm2_code_requests.py "$DATA" "$CODE_EVERY"
  cat "$DATA/user-turns.jsonl" "$DATA/code-requests.jsonl" > "$DATA/requests.jsonl.tmp"
  mv "$DATA/requests.jsonl.tmp" "$DATA/requests.jsonl"
  echo "requests: $(wc -l < "$DATA/user-turns.jsonl") user turns + $(wc -l < "$DATA/code-requests.jsonl") code requests"
fi
draftzoo regenerate "$RECIPE" --set data.source="$DATA/requests.jsonl" --set target.dtype="$DTYPE" \
  --output "$DATA/train.jsonl" --temperature 0.7 --top-p 0.95 --max-new-tokens 384 \
  --batch-size "$BATCH" --sort-window 4 --seed 0
echo done
