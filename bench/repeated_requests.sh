#!/usr/bin/env bash
# A repeated-request workload, where suffix decoding's global cache should pay: a warm-up
# prompt, 6 HumanEval prompts (category `first`), the same 6 asked again (`repeat`)
# (bench/results/cpu-2026-12-03-repeated-requests/prompts.jsonl). Prompt lookup, suffix
# decoding, EAGLE-3 and DFlash alone and with suffix branches (hybrid), each in its own
# `draftzoo eval` process (target-only and speculative interleaved in it, so every speedup is a
# same-process ratio), no certificate. Run it alone on the machine.
#   bash bench/repeated_requests.sh                     # the testbed's zoo drafters
#   TARGET=smollm2-135m-instruct EAGLE3=runs/eagle3-smollm2-135m-instruct \
#       DFLASH=runs/dflash-smollm2-135m-instruct OUT=runs/repeated-smollm2 \
#       bash bench/repeated_requests.sh
# Settings (environment): TARGET (testbed-small), EAGLE3 (eagle3-testbed-small), DFLASH
# (dflash-testbed-small), OUT (runs/repeated-requests), TEMPERATURES ("0"), TOKENS (96),
# THREADS (2). A method whose report exists is not measured again.
set -euo pipefail
target=${TARGET:-testbed-small}
eagle3=${EAGLE3:-eagle3-testbed-small}
dflash=${DFLASH:-dflash-testbed-small}
out=${OUT:-runs/repeated-requests}
prompts=bench/results/cpu-2026-12-03-repeated-requests/prompts.jsonl
read -r -a temperatures <<< "${TEMPERATURES:-0}"
common=(--prompt-set "$prompts" --prompts 12 --max-new-tokens "${TOKENS:-96}"
    --temperatures "${temperatures[@]}" --certificate-samples 0 --threads "${THREADS:-2}")
source "$(dirname "$0")/measure_row.sh"
measure prompt-lookup --prompt-lookup --target "$target"
measure suffix --suffix --target "$target"
measure eagle3 "$eagle3"
measure eagle3-hybrid "$eagle3" --hybrid
measure dflash "$dflash" --num-speculative-tokens 7
measure dflash-hybrid "$dflash" --num-speculative-tokens 7 --hybrid
python - "$out" <<'EOF'
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
print(f"{'method':16} {'T':>3} {'tau first':>9} {'repeat':>7} {'tau':>6} {'speedup':>8} identity")
for name in ("prompt-lookup", "suffix", "eagle3", "eagle3-hybrid", "dflash", "dflash-hybrid"):
    report = json.loads((out / name / "report.json").read_text())
    for result in report["results"]:
        cats, same = result["categories"], result.get("greedy_identity") or {}
        identity = f"{same['identical']}/{same['decodes']}" if same else "-"
        print(
            f"{name:16} {result['temperature']:3g} {cats['first']['tau']:9.2f} "
            f"{cats['repeat']['tau']:7.2f} {result['tau']:6.2f} "
            f"{result['speedup']['mean']:7.2f}x {identity}"
        )
EOF
