#!/usr/bin/env bash
# EAGLE-1 and EAGLE-3 chains at T = 1 before and after the cache-path change, on 40 HumanEval
# prompts: chain drafts at T > 0 now come from the slot code's Gumbel-max draws on uniforms
# drawn from the request's generator (an exact draw from q, as on static caches before)
# instead of the CDF-inversion sampler, so the random stream and the sampled outputs differ by
# design. Both are lossless (the TV tests); this checks that tau agrees within sampling noise.
# Speed is not compared (the test suite ran beside it). Output: t1-chain-tau.txt.
set -u
before=${BEFORE:?a checkout of the parent tree}
before_python=${BEFORE_PYTHON:?a venv python for it}
after=$(pwd)
out=$after/bench/results/cpu-2026-12-03-one-cache-path/t1-chain-tau.txt
args="--eagle3 $after/recipes/zoo/eagle3-testbed-small --eagle1 $after/recipes/zoo/eagle1-testbed-small --temperatures 1 --prompts 40 --threads 1"
: > "$out"
for side in before after; do
  if [ $side = before ]; then dir=$before; py=$before_python; else dir=$after; py=python; fi
  echo "== $side" >> "$out"
  (cd "$dir" && $py bench/drafter_bench.py $args 2>&1 | grep -v -e "Loading weights" -e arn) >> "$out"
done
