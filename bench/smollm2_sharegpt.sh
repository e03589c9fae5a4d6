#!/usr/bin/env bash
# SmolLM2-135M-Instruct drafters from ShareGPT's own answers (fixed text, prefill capture: no
# generation) at about ten times the first drafters' budget. One offline FP8 capture of the
# `sharegpt` source at max_length 1024 (14,733 packed rows, 13.4 M tokens, 10.2 M of them
# supervised: one pass is the budget), taps for every family (2, 15, 27: EAGLE-3; 28: DFlash;
# 30, the final post-norm state: EAGLE-1, Medusa, MTP and every family's teacher logits), then
# the families in FAMILIES trained from it.
#   pip install "draftzoo[sharegpt]" && draftzoo target get smollm2-135m-instruct
#   bash bench/smollm2_sharegpt.sh
# Resumable: a rerun keeps finished shards, resumes each run from its newest checkpoint and
# skips a family whose drafter exists. Settings (environment):
#   RUNS        where the capture and drafters go (runs)
#   STAGES      "capture train" (default both)
#   FAMILIES    which to train, in order ("eagle3")
#   STEPS       training steps (default 3683: one pass of 4 rows of 1024 a step)
#   SET_<family> more --set pairs for one family's run
set -euo pipefail
runs=${RUNS:-runs}
stages=${STAGES:-capture train}
families=${FAMILIES:-eagle3}
steps=${STEPS:-3683}
shards="$runs/smollm2-sharegpt-capture"
data=(--set data.source=sharegpt --set data.max_length=1024 --set capture.dtype=float8_e4m3)
if [[ " $stages " == *" capture "* ]]; then
    started=$(date +%s)
    draftzoo capture recipes/eagle3/smollm2-135m-instruct.yaml --dir "$shards" "${data[@]}" \
        --set target.dtype=bfloat16 --layer 2 --layer 15 --layer 27 --layer 28 --layer 30
    echo "capture: $(($(date +%s) - started)) s (a rerun that finds every shard done: seconds)"
fi
if [[ " $stages " == *" train "* ]]; then
    for family in $families; do
        out="$runs/$family-smollm2-sharegpt"
        if [ -f "$out/draftzoo.json" ]; then
            echo "$family: $out exists"
            continue
        fi
        args=("${data[@]}" --set capture.mode=offline --set "capture.dir=$shards"
            --set "output_dir=$out" --set "train.max_steps=$steps")
        extra="SET_$family"
        for pair in ${!extra:-}; do args+=(--set "$pair"); done
        started=$(date +%s)
        draftzoo train "recipes/$family/smollm2-135m-instruct.yaml" "${args[@]}"
        echo "$family: trained in $(($(date +%s) - started)) s -> $out"
    done
fi
echo done
