#!/usr/bin/env bash
# Every shipped zoo card's T = 0 numbers reproduced through the family registry's loading code:
# each drafter's own report.json config rerun at T = 0, batch 1 (24 prompts, 128 tokens), and
# tau plus every prompt's (tokens, verification forwards) compared with the card's report.
# One thread; the test suite ran beside it, so no speed is compared.
set -euo pipefail
python bench/zoo_greedy_check.py --threads 1 2>&1 | grep -v -e "Loading weights" -e "eval:" \
    -e "warn" -e "Warning" > bench/results/cpu-2026-12-03-registry/zoo-greedy-check.txt
