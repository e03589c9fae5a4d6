#!/bin/bash
# one drafter per process, alone on the machine, the same prompts and command for every row
cd "$(dirname "$0")/../../.."
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT=bench/results/cpu-mtp-2026-12-01
run() {  # name drafter chain [extra]
  name=$1; drafter=$2; n=$3; shift 3
  python -m draftzoo eval "$drafter" --prompt-set humaneval --prompt-set stdlib-heldout \
    --prompts 12 --max-new-tokens 128 --temperatures 0 1 --num-speculative-tokens "$n" \
    --output-dir $OUT/$name "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$?" >&2
}
run mtp1-chain1 runs/mtp-testbed-small 1
run mtp1-chain4 runs/mtp-testbed-small 4
run mtp2-chain2 runs/mtp2-testbed-small 2
run mtp2-chain4 runs/mtp2-testbed-small 4
run eagle1-chain4 recipes/zoo/eagle1-testbed-small 4
run eagle3-chain4 recipes/zoo/eagle3-testbed-small 4
run draft-lm-chain4 recipes/zoo/draft-lm-testbed-small 4
run medusa1-tree recipes/zoo/medusa1-testbed-small 4 --tree
run medusa2-tree recipes/zoo/medusa2-testbed-small 4 --tree

