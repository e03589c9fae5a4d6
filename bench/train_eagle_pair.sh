#!/usr/bin/env bash
# EAGLE-1 and EAGLE-3 trained side by side on one CUDA machine from the testbed-small recipes
# (same data, rows and steps; EAGLE-3 taps 2, 6, 11 as in the budget table of docs/eagle.md), then packed
# under $OUT (default ./eagle-pair): each finished drafter as <family>-drafter.tar; a run stopped
# by the deadline leaves its newest checkpoint in 15 MB parts (<family>-ckpt.tar.part-*), which
# `draftzoo train` resumes anywhere (same recipe, same --set flags, output_dir beside the .work).
#   STEPS=12800 DEADLINE=480 bash bench/train_eagle_pair.sh
# DATA=file.jsonl trains both on that conversation file instead of `testbed-chat` (which reads
# the installed Python and packages: write it with `draftzoo testbed export-chat FILE` where
# they are the testbed's); TOKENS=archive.tar.xz unpacks a tokenized-data
# cache (data/tokens-KEY) into $DRAFTZOO_CACHE first; CHECKPOINT_EVERY (400) and RUNS (where
# the runs write) as named; SET="data.max_length=512 train.lr=1e-3" adds --set flags to both
# runs (rows of 512 keep 6.4 M supervised tokens of `testbed-chat` against 3.3 M at 256).
# `pytest -m gpu` runs beside the pair; with time left, a CUDA drafter bench of the new pair.
set -u -o pipefail
steps=${STEPS:-12800}
deadline=${DEADLINE:-480}
every=${CHECKPOINT_EVERY:-400}
out=${OUT:-eagle-pair}
runs=${RUNS:-/tmp/eagle-pair}
export PYTHONUNBUFFERED=1 DRAFTZOO_CACHE=${DRAFTZOO_CACHE:-/tmp/draftzoo-cache}
mkdir -p "$out" "$runs" "$DRAFTZOO_CACHE"
began=$(date +%s)
elapsed() { echo $(($(date +%s) - began)); }
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
if [ -n "${TOKENS:-}" ]; then
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" \
        "$TOKENS" "$DRAFTZOO_CACHE" || exit 1
fi
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
} | tee "$out/device.txt"

common=(--set "train.max_steps=$steps" --set "train.checkpoint_every=$every")
[ -n "${DATA:-}" ] && common+=(--set "data.source=$DATA")
for setting in ${SET:-}; do common+=(--set "$setting"); done
# Tokenize once (or load the cache), so that the two runs do not both build it.
python3 - recipes/eagle1/testbed-small.yaml --set "output_dir=$runs/eagle1" "${common[@]}" <<'PY' ||
import sys
from pathlib import Path

from transformers import AutoTokenizer

from draftzoo.data.token_dataset import build_token_dataset
from draftzoo.train.registry import load_recipe
from draftzoo.train.setup import resolve_dirs, target_path

recipe = load_recipe(Path(sys.argv[1]), [arg for arg in sys.argv[2:] if arg != "--set"])
tokenizer = AutoTokenizer.from_pretrained(target_path(recipe.target))
dataset, report, key = build_token_dataset(recipe.data, tokenizer, resolve_dirs(recipe)[2])
print(f"data {recipe.data.source}: {len(dataset)} rows, key {key}, {report.summary()}")
PY
    exit 1
declare -A pid
start() {  # family, extra --set flags
    local family=$1
    shift
    python3 -m draftzoo train "recipes/$family/testbed-small.yaml" --set "output_dir=$runs/$family" \
        "${common[@]}" "$@" >"$out/$family.log" 2>&1 &
    pid[$family]=$!
}
timeout 180 python3 -m pytest -q -m gpu tests/inference/test_cuda_graphs.py -p no:cacheprovider \
    >"$out/pytest-gpu.txt" 2>&1 &
tests=$!
start eagle1
start eagle3 --set 'eagle.layers=[2,6,11]'
progress() { tail -c 400 "$out/$1.log" | tr '\r' '\n' | grep -a 'it/s\|s/it' | tail -1; }
while :; do
    sleep 20
    running=0
    for family in eagle1 eagle3; do
        kill -0 "${pid[$family]}" 2>/dev/null && running=$((running + 1))
        echo "$(elapsed)s $family: $(progress "$family")"
    done
    [ "$running" = 0 ] && break
    if [ "$(elapsed)" -ge "$deadline" ]; then
        echo "deadline: stopping the runs"
        kill "${pid[@]}" 2>/dev/null
        sleep 5
        break
    fi
done
for family in eagle1 eagle3; do
    wait "${pid[$family]}"
    echo "$family exit $?: $(grep -a -A3 '^drafter:' "$out/$family.log" | tr '\n' ' ')"
    if [ -f "$runs/$family/model.safetensors" ]; then
        tar cf "$out/$family-drafter.tar" -C "$runs" "$family"
    else
        latest=$(ls -dv "$runs/$family.work/checkpoints"/step-* 2>/dev/null | tail -1)
        [ -n "$latest" ] || continue
        echo "$family: packing $latest"
        tar cf - -C "$runs" "$family.work/checkpoints/$(basename "$latest")" |
            split -b 15M - "$out/$family-ckpt.tar.part-"
    fi
done
wait "$tests"
tail -1 "$out/pytest-gpu.txt"
left=$((deadline + 50 - $(elapsed)))
if [ -f "$runs/eagle3/model.safetensors" ] && [ -f "$runs/eagle1/model.safetensors" ] &&
    [ "$left" -ge 60 ]; then
    timeout "$left" python3 bench/drafter_bench.py --device cuda --static --prompts 8 \
        --temperatures 0 --eagle1 "$runs/eagle1" --eagle1-tree --eagle3 "$runs/eagle3" 2>&1 |
        grep -v "Loading weights" >"$out/drafters-cuda.txt"
fi
echo "done in $(elapsed)s"
