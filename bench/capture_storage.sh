#!/usr/bin/env bash
# Capture storage side by side: EAGLE-3 for testbed-small trained from bfloat16 shards and from
# FP8 (e4m3, a scale per token) shards of the same rows, with the same steps and seed; prints
# each format's bytes per token and shard bytes, and each drafter's tau at T = 0 and T = 1 on
# the same prompts (tau does not depend on the clock; nothing here is timed).
#   STEPS=800 SAMPLES=6000 bash bench/capture_storage.sh [OUT]   # default runs/capture-storage
# Resumable: a rerun keeps finished shards, resumes training from its checkpoints and skips an
# evaluation whose report exists.
set -euo pipefail
out=${1:-runs/capture-storage}
steps=${STEPS:-800}
samples=${SAMPLES:-6000}
recipe=recipes/eagle3/testbed-small.yaml
mkdir -p "$out"
data=(--set "data.max_samples=$samples")
for fmt in bfloat16 float8_e4m3; do
    shards="$out/shards-$fmt"
    storage=(--set "capture.dtype=$fmt")
    draftzoo capture "$recipe" --dir "$shards" "${data[@]}" "${storage[@]}" | tee "$out/capture-$fmt.txt"
    draftzoo train "$recipe" "${data[@]}" "${storage[@]}" --set capture.mode=offline \
        --set "capture.dir=$shards" --set "train.max_steps=$steps" --set train.checkpoint_every=200 \
        --set "output_dir=$out/eagle3-$fmt" --set "name=eagle3-testbed-small-$fmt"
    if [ ! -f "$out/eval-$fmt/report.json" ]; then
        draftzoo eval "$out/eagle3-$fmt" --prompt-set humaneval --prompt-set stdlib-heldout \
            --prompts 24 --max-new-tokens 128 --temperatures 0 1 --seed 0 --certificate-samples 0 \
            --output-dir "$out/eval-$fmt"
    fi
done
python - "$out" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = {}
for fmt in ("bfloat16", "float8_e4m3"):
    shards = out / f"shards-{fmt}"
    index = json.loads((shards / "index.json").read_text())
    size = sum(f.stat().st_size for f in shards.glob("shard-*.safetensors"))
    report = json.loads((out / f"eval-{fmt}" / "report.json").read_text())
    tau = {r["temperature"]: r["tau"] for r in report["results"]}
    rows[fmt] = (index["bytes_per_token"], size, tau)
    print(f"{fmt:12} {index['bytes_per_token']:6d} bytes/token  {size / 1e6:9.1f} MB shards  "
          f"tau T=0 {tau[0.0]:.3f}  T=1 {tau[1.0]:.3f}")
(b_tok, b_size, b_tau), (f_tok, f_size, f_tau) = rows["bfloat16"], rows["float8_e4m3"]
print(f"FP8 / bf16: bytes per token {f_tok / b_tok:.3f}, shard bytes {f_size / b_size:.3f}; "
      f"tau T=0 {f_tau[0.0] / b_tau[0.0] - 1:+.2%}, T=1 {f_tau[1.0] / b_tau[1.0] - 1:+.2%}")
PY
