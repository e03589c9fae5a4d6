#!/usr/bin/env bash
# Each family's per-step training loss before the "one home per family" work (ed8d3d7) and
# after it (this tree), same recipe, seed and machine, one thread each: the curves must be
# bit-identical. BEFORE: a checkout of ed8d3d7; BEFORE_PYTHON: a venv python with
# `pip install --no-deps -e $BEFORE`. Output: loss-curves.txt.
set -u
before=${BEFORE:?a checkout of ed8d3d7}
before_python=${BEFORE_PYTHON:?a venv python for it}
after=$(pwd)
out=$after/bench/results/cpu-2026-12-03-one-cache-path/loss-curves.txt
: > "$out"
for recipe in draft_lm/testbed-small eagle1/testbed-small eagle3/testbed-small \
    medusa1/testbed-small medusa2/testbed-small mtp/testbed-small-d2; do
  for side in before after; do
    if [ $side = before ]; then dir=$before; py=$before_python; else dir=$after; py=python; fi
    (cd "$dir" && OMP_NUM_THREADS=1 $py bench/loss_curve.py recipes/$recipe.yaml --steps 12 \
        2>/dev/null | grep -E "^(train/|  step)") > /tmp/loss-$side.txt
    echo "== $recipe $side" >> "$out"; cat /tmp/loss-$side.txt >> "$out"
  done
  if cmp -s /tmp/loss-before.txt /tmp/loss-after.txt; then verdict=identical; else verdict=DIFFERENT; fi
  echo "== $recipe: $verdict" >> "$out"
done
