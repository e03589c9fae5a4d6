#!/usr/bin/env bash
# Every shipped zoo card's T = 0 numbers reproduced after the cache-path change (one forward
# interface for one row or many; EAGLE's chain and greedy tree as one tensor code): each
# drafter's own report.json config rerun at T = 0, batch 1, tau plus every prompt's (tokens,
# verification forwards) compared with the card's report. One thread; other deterministic
# jobs ran beside it, so no speed is compared.
set -euo pipefail
python bench/zoo_greedy_check.py --threads 1 2>&1 | grep -v -e "Loading weights" -e "eval:" \
    -e "warn" -e "Warning" > bench/results/cpu-2026-12-03-one-cache-path/zoo-greedy-check.txt
