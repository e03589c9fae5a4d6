#!/usr/bin/env bash
# Each family's per-step training loss before the "one home per family" work (ed8d3d7) and
# after it (this tree), same recipe, seed and machine, one thread each: the curves must be
# bit-identical. BEFORE: a checkout of ed8d3d7; BEFORE_PYTHON: a venv python with
# `pip install --no-deps -e $BEFORE`. RECIPES: a subset (default all six). Medusa-2 starts
# from the shipped medusa1-testbed-small heads. Output: loss-curves.txt (appended to).
set -u
before=${BEFORE:?a checkout of ed8d3d7}
before_python=${BEFORE_PYTHON:?a venv python for it}
after=$(pwd)
out=$after/bench/results/cpu-2026-12-03-one-cache-path/loss-curves.txt
recipes=${RECIPES:-draft_lm/testbed-small eagle1/testbed-small eagle3/testbed-small \
    medusa1/testbed-small medusa2/testbed-small mtp/testbed-small-d2}
for recipe in $recipes; do
  extra=""
  if [ $recipe = medusa2/testbed-small ]; then
    extra="--set init_heads=$after/recipes/zoo/medusa1-testbed-small"
  fi
  for side in before after; do
    if [ $side = before ]; then dir=$before; py=$before_python; else dir=$after; py=python; fi
    (cd "$dir" && OMP_NUM_THREADS=1 $py bench/loss_curve.py recipes/$recipe.yaml --steps 12 \
        $extra 2>/dev/null | grep -E "^(train/|  step)") > /tmp/loss-$side.txt
    echo "== $recipe $side" >> "$out"; cat /tmp/loss-$side.txt >> "$out"
  done
  if [ ! -s /tmp/loss-after.txt ]; then verdict="NO CURVE (the run failed)"
  elif cmp -s /tmp/loss-before.txt /tmp/loss-after.txt; then verdict=identical
  else verdict=DIFFERENT; fi
  echo "== $recipe: $verdict" >> "$out"
done
