#!/usr/bin/env bash
# SmolLM2-135M-Instruct drafters from ShareGPT's own answers (fixed text, prefill capture: no
# generation) at about ten times the first drafters' budget, and the scaling curve on the way.
# One offline FP8 capture of the `sharegpt` source at max_length 1024 (14,733 packed rows,
# 13.4 M tokens, 10.2 M of them supervised: one pass is the budget), taps for every family (2,
# 15, 27: EAGLE-3; 28: DFlash; 30, the final post-norm state: EAGLE-1, Medusa, MTP and every
# family's teacher logits), shards of 128 rows (a stopped capture loses at most one), then
# EAGLE-3 trained from it.
#   pip install "draftzoo[sharegpt]" && draftzoo target get smollm2-135m-instruct
#   bash bench/smollm2_sharegpt.sh
# The scaling curve costs one run: the largest budget trains with the "wsd" schedule (warm-up,
# a stable rate, a linear decay over its last DECAY share) and pins a checkpoint where each
# smaller budget's own decay would begin; each smaller budget then starts from that checkpoint
# (`train.start_from`) and decays over its own last share: the same rows in the same order and
# the same rates as a run of that budget on its own (tests/train/test_branching.py), for a
# DECAY share of its steps instead of all of them.
# Resumable: a rerun keeps finished shards, resumes each run from its newest checkpoint (the
# largest run keeps one every 50 steps, ~8 min on two Zen 3 cores: what a stopped session
# loses) and skips a run whose drafter exists. Measured on two cores, alone: AMD EPYC (AVX512-BF16, bf16)
# the capture's target forwards ~780-1,000 tokens/s (~4-5 h), an EAGLE-3 step of 4 rows of 1,024
# ~5.3 s (bench/results/cpu-2026-12-06-eagle3-step/), so one pass ~5.4 h; Intel Xeon (Ice Lake,
# no native bf16: float32) the whole capture ~630 tokens/s (~5.9 h;
# bench/results/cpu-2026-12-07-capture-by-sample/), a step ~6.8 s, one pass ~6.9 h.
# Settings (environment):
#   RUNS        where the capture and drafters go (runs)
#   CAPTURE     offline (default: the FP8 shards above, then training reads them) or online
#               (no capture stage: each training step runs the target itself, as on a GPU, where
#               a forward costs milliseconds and the shards would fill the disk;
#               bench/smollm2_sharegpt_gpu.sh)
#   CAPTURE_DTYPE  the target's weights while capturing (default: bfloat16 where the CPU
#               multiplies it natively, float32 elsewhere; a capture resumes only in its own)
#   STAGES      "capture train" (default both; "ablate" adds the ablation rows, "curve"
#               evaluates every budget's drafter (tau counts tokens, not seconds: no quiet
#               machine needed) and fits the curve, bench/scaling_curve.py)
#   FAMILY      which family trains at each budget (eagle3)
#   BUDGETS     supervised tokens in millions ("0.3 1 2 4 10"; the largest trains, the others
#               branch from it; a step supervises ~2,760 tokens: 4 rows of 1,024 at 0.674
#               supervised per token)
#   DECAY       the share of each budget's steps that decays (0.2)
#   WARMUP      warm-up steps of every run (50)
#   SET_EXTRA   more --set pairs for every run
#   ABLATIONS   NAME:KEY=VALUE[,KEY=VALUE] rows trained at ABLATION_BUDGET M (default 0.5)
#               from scratch with the curve's schedule, one pass over the first rows the budget
#               needs (4 a step: 724 at 0.5 M, so a capture still under way serves them once
#               its first 6 shards are done): "base:eagle.init_layer=null init:
#               lk:eagle.token_loss=lk passes2:train.rows=HALF" (the recipe as it was, its layer
#               from random weights; the recipe as it is, its layer started from the target's
#               last, which the base row lost to; then on top of it LK's acceptance loss, and
#               the budget as two passes over the first half of those rows: HALF is replaced by
#               that half).
#               `ablate-eval` scores each row's drafter (teacher-forced and runtime tau,
#               held-out ShareGPT prompts) and writes the table, bench/ablation_table.py.
#               `regenerate` writes the fixed-against-regenerated row's data: the first
#               REGENERATE_ROWS (1100) conversations' assistant turns rewritten by SmolLM2 as
#               bench/smollm2_data.sh does (T = 0.7, top-p 0.95, <= 384 tokens a turn); add
#               "regenerated:data.source=$RUNS/smollm2-sharegpt-regenerated.jsonl,capture.mode=online"
#               to ABLATIONS to train and score it (online: its own text has no capture)
set -euo pipefail
runs=${RUNS:-runs}
stages=${STAGES:-capture train}
family=${FAMILY:-eagle3}
budgets=${BUDGETS:-0.3 1 2 4 10}
shards="$runs/smollm2-sharegpt-capture"
data=(--set data.source=sharegpt --set data.max_length=1024 --set capture.dtype=float8_e4m3)
capture=${CAPTURE:-offline}
case $capture in
offline) from_capture=(--set capture.mode=offline --set "capture.dir=$shards") ;;
online) from_capture=(--set capture.mode=online) ;;
*) echo "CAPTURE must be offline or online, not $capture" >&2; exit 2 ;;
esac
if [[ " $stages " == *" capture "* ]] && [ "$capture" = offline ]; then
    native=$(python -c "import torch; from draftzoo.train.precision import native_bf16
print('bfloat16' if native_bf16(torch.device('cpu')) else 'float32')" 2>/dev/null | tail -n 1)
    capture_dtype=${CAPTURE_DTYPE:-$native}
    started=$(date +%s)
    draftzoo capture recipes/eagle3/smollm2-135m-instruct.yaml --dir "$shards" "${data[@]}" \
        --set target.dtype="$capture_dtype" --set capture.shard_samples=128 \
        --layer 2 --layer 15 --layer 27 --layer 28 --layer 30
    echo "capture: $(($(date +%s) - started)) s (a rerun that finds every shard done: seconds)"
fi
decay=${DECAY:-0.2}
warmup=${WARMUP:-50}
# optimizer steps of a budget in millions of supervised tokens; the step where its decay begins
steps_of() { python -c "print(round($1 * 1e6 / 2760))"; }
decay_start_of() { python -c "s = $1; print(s - round(s * $decay))"; }
# one EAGLE-3 (or $family) run of `budget` million supervised tokens into `out`; more --set
# pairs after them
train_budget() {
    local budget=$1 out=$2
    shift 2
    local steps
    steps=$(steps_of "$budget")
    if [ -f "$out/draftzoo.json" ]; then
        echo "$out exists"
        return
    fi
    local args=("${data[@]}" "${from_capture[@]}" --set "output_dir=$out"
        --set "train.max_steps=$steps" --set train.schedule=wsd
        --set "train.decay_fraction=$decay" --set "train.warmup_steps=$warmup")
    for pair in ${SET_EXTRA:-} "$@"; do args+=(--set "$pair"); done
    local started
    started=$(date +%s)
    draftzoo train "recipes/$family/smollm2-135m-instruct.yaml" "${args[@]}"
    echo "$out ($steps steps): trained in $(($(date +%s) - started)) s"
}
if [[ " $stages " == *" train "* ]]; then
    largest=$(printf "%s\n" $budgets | sort -g | tail -1)
    main="$runs/$family-smollm2-sharegpt-${largest}m"
    pins=()
    for budget in $budgets; do
        [ "$budget" = "$largest" ] || pins+=("$(decay_start_of "$(steps_of "$budget")")")
    done
    train_budget "$largest" "$main" \
        "train.checkpoint_steps=[$(IFS=,; echo "${pins[*]}")]" train.checkpoint_every=50
    for budget in $budgets; do
        [ "$budget" = "$largest" ] && continue
        branch=$(decay_start_of "$(steps_of "$budget")")
        train_budget "$budget" "$runs/$family-smollm2-sharegpt-${budget}m-wsd" \
            "train.start_from=$main.work/checkpoints/step-$branch"
    done
fi
# where each budget's drafter is: the largest trained, the others branched from it
drafter_of() {
    local largest
    largest=$(printf "%s\n" $budgets | sort -g | tail -1)
    if [ "$1" = "$largest" ]; then
        echo "$runs/$family-smollm2-sharegpt-${1}m"
    else
        echo "$runs/$family-smollm2-sharegpt-${1}m-wsd"
    fi
}
if [[ " $stages " == *" regenerate "* ]]; then
    draftzoo regenerate "recipes/$family/smollm2-135m-instruct.yaml" "${data[@]}" \
        --output "$runs/smollm2-sharegpt-regenerated.jsonl" --limit "${REGENERATE_ROWS:-1100}" \
        --temperature 0.7 --top-p 0.95 --max-new-tokens 384 --batch-size "${BATCH:-32}" \
        --sort-window 4 --seed 0
fi
# the ablation table's rows, NAME:KEY=VALUE[,KEY=VALUE...]: the same rows in the same order and
# the same schedule for each, scored on the same prompts (ABLATION_PROMPTS)
ablation_budget=${ABLATION_BUDGET:-0.5}
one_pass=$(($(steps_of "$ablation_budget") * 4))
ablations=${ABLATIONS:-base:eagle.init_layer=null init: lk:eagle.token_loss=lk passes2:train.rows=HALF}
ablations=${ablations//HALF/$((one_pass / 2))}
ablation_dir() { echo "$runs/$family-smollm2-sharegpt-${ablation_budget}m-$1"; }
if [[ " $stages " == *" ablate "* ]]; then
    for ablation in $ablations; do
        name=${ablation%%:*}
        IFS=, read -r -a pairs <<< "${ablation#*:}"
        train_budget "$ablation_budget" "$(ablation_dir "$name")" "train.rows=$one_pass" \
            ${pairs[@]+"${pairs[@]}"}
    done
fi
if [[ " $stages " == *" ablate-eval "* ]]; then
    rows=()
    for ablation in $ablations; do
        name=${ablation%%:*}
        drafter=$(ablation_dir "$name")
        out="$runs/ablate/$name"
        [ -f "$drafter/draftzoo.json" ] || { echo "$drafter not trained yet"; continue; }
        [ -f "$out/report.json" ] || draftzoo eval "$drafter" --prompt-set sharegpt-heldout \
            --prompts "${ABLATION_PROMPTS:-10}" --temperatures 0 1 --num-speculative-tokens 4 \
            --teacher-forced --certificate-samples 0 --threads 2 --output-dir "$out"
        rows+=(--row "$name=$drafter")
    done
    python bench/ablation_table.py "${rows[@]}" --reports "$runs/ablate" \
        --output "$runs/ablate/table.md"
fi
if [[ " $stages " == *" curve "* ]]; then
    reports=()
    for budget in $budgets; do
        drafter=$(drafter_of "$budget")
        out="$runs/curve/$family-${budget}m"
        [ -f "$drafter/draftzoo.json" ] || { echo "$drafter not trained yet"; continue; }
        [ -f "$out/report.json" ] || draftzoo eval "$drafter" --prompt-set sharegpt-heldout \
            --prompt-set mt-bench --prompts 16 --temperatures 0 1 --num-speculative-tokens 4 \
            --certificate-samples 0 --threads 2 --output-dir "$out"
        reports+=(--report "$budget=$out/report.json")
    done
    if [ "${#reports[@]}" -ge 4 ]; then  # two budgets at least
        python bench/scaling_curve.py "${reports[@]}" --goal 2.0 --output-dir "$runs/curve"
    fi
fi
echo done
