#!/bin/bash
# Every testbed recipe's first 4 losses through this checkout, beside the values recorded in
# bench/results/cpu-2026-12-06-proposal-value/loss_curves.txt (same machine, same seeds).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
for f in eagle3 eagle1 draft_lm medusa1 medusa2 mtp dflash; do
  echo "== $f"
  python bench/loss_curve.py recipes/$f/testbed-small.yaml --steps 4 2>/dev/null | grep -A5 "^train/loss" || true
done > $here/loss_curves.txt
python3 - "$here/loss_curves.txt" bench/results/cpu-2026-12-06-proposal-value/loss_curves.txt <<'PY'
import re, sys
def curves(path):
    out, family = {}, None
    for line in open(path):
        if line.startswith("== "):
            family = line.split()[1]
        elif m := re.match(r"\s+step\s+(\d+): (\S+)", line):
            out.setdefault(family, []).append(m.group(2))
    return out
now, then = curves(sys.argv[1]), curves(sys.argv[2])
for family in then:
    print(family, "identical" if now.get(family) == then[family] else f"DIFFERS {now.get(family)} vs {then[family]}")
PY
