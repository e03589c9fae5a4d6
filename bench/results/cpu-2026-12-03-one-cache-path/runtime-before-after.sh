#!/usr/bin/env bash
# Decode speed before/after the cache-path change in one sitting, nothing else running: the
# parent tree (b21f896) installed (editable, no deps) in its own venv, this tree with the
# main interpreter, alternating twice. Growing caches (the CPU default) for EAGLE-3 chains and
# trees and MTP at T = 0 and 1 (bench/drafter_bench.py), and the draft LM, prompt lookup and
# target-only on growing and static caches (bench/runtime_bench.py). 2 threads, 10 HumanEval
# prompts, 128 tokens. Output: runtime-before-after.txt.
set -u
before=${BEFORE:?a checkout of the parent tree}
before_python=${BEFORE_PYTHON:?a venv python with `pip install --no-deps -e $BEFORE`}
after=$(pwd)
out=$after/bench/results/cpu-2026-12-03-one-cache-path/runtime-before-after.txt
zoo=$after/recipes/zoo
drafters="--eagle3 $zoo/eagle3-testbed-small --mtp $zoo/mtp-testbed-small --prompts 10 --threads 2"
runtime="--prompts 10 --max-new-tokens 128 --draft $zoo/draft-lm-testbed-small --draftzoo-only --static --threads 2"
: > "$out"
for round in 1 2; do
  for side in before after; do
    if [ $side = before ]; then dir=$before; py=$before_python; else dir=$after; py=python; fi
    echo "== $side, round $round: drafter_bench" >> "$out"
    (cd "$dir" && $py bench/drafter_bench.py $drafters 2>&1 | grep -v -e "Loading weights" -e arn) >> "$out"
    echo "== $side, round $round: runtime_bench" >> "$out"
    (cd "$dir" && $py bench/runtime_bench.py $runtime 2>&1 | grep -v -e "Loading weights" -e arn) >> "$out"
  done
done
