#!/usr/bin/env bash
# Decode speed before/after in one sitting: the parent commit checked out in /tmp/before and
# installed (editable, no deps) into its own venv, this tree with the main interpreter,
# alternating twice. Output: runtime-before-after.txt.
set -u
before=${BEFORE:?a checkout of the parent commit (git worktree add DIR ed8d3d7)}
before_python=${BEFORE_PYTHON:?a venv python with `pip install --no-deps -e $BEFORE`}
args="--prompts 10 --max-new-tokens 128 --draft recipes/zoo/draft-lm-testbed-small --draftzoo-only --static --threads 2"
for round in 1 2; do
  (cd "$before" && $before_python bench/runtime_bench.py $args 2>&1 | grep -v "Loading weights") > /tmp/before-$round.txt
  python bench/runtime_bench.py $args 2>&1 | grep -v "Loading weights" > /tmp/after-$round.txt
done
