#!/bin/bash
# The proposers' room (inference/proposers/): decode speed before (fdc5965, /tmp/fc's venv)
# and after (this checkout), alternating, alone; prints tau and the T = 0 speedup of each run.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=/tmp/room-sitting; rm -rf $out; mkdir -p $out
run() {  # side, python venv, folder, pair
  (cd "$3" && "$2/bin/draftzoo" eval eagle3-testbed-small --prompts 12 --temperatures 0 \
    --certificate-samples 0 --threads 2 --output-dir $out/$1-$4 > /dev/null 2>&1)
  python3 -c "
import json; r = json.load(open('$out/$1-$4/report.json'))['results'][0]
print('$4', '$1', round(r['tau'], 4), str(round(r['speedup']['mean'], 3)) + 'x')"
}
for pair in 1 2 3 4; do
  if [ $((pair % 2)) -eq 1 ]; then
    run before /tmp/fc/.venv /tmp/fc $pair; run after /work/venv /work/main $pair
  else
    run after /work/venv /work/main $pair; run before /tmp/fc/.venv /tmp/fc $pair
  fi
done | tee $here/sitting.txt
