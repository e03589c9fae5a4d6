"""SpecForge writes a drafter: warm-start its EAGLE-3 draft model from a folder, move every
weight but the embedding off draftzoo's values (seeded), save it as its SGLang exporter does
(the embedding dropped, its serving-key check, `save_pretrained`, legacy rope fields).

    python specforge_save.py SOURCE TARGET OUT SEED

Prints one JSON line. Runs in the SpecForge venv.
"""

import json
import sys
from importlib.metadata import version

import torch
from specforge.export.checkpoint_io import apply_legacy_rope_scaling
from specforge.export.to_sglang import WEIGHT_MAPS, _serving_state
from specforge.modeling.auto import AutoDraftModel
from specforge.training.model_loading import warm_start_draft_model
from transformers import AutoConfig

source, target, out, seed = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
config = AutoConfig.from_pretrained(source)
model = AutoDraftModel.from_config(config, attention_backend="sdpa", torch_dtype=torch.float32)
warm_start_draft_model(
    model, source, draft_config=config, strategy="ddp", allow_missing_embedding=True
)
model.load_embedding(target)
generator = torch.Generator().manual_seed(seed)
with torch.no_grad():
    for name, parameter in model.named_parameters():
        if "embed" not in name.lower():
            noise = torch.randn(parameter.shape, generator=generator)
            parameter.mul_(1 + 0.1 * noise)
full = {k: v for k, v in model.state_dict().items() if "embed" not in k.lower()}
model.save_pretrained(out, state_dict=_serving_state(full, WEIGHT_MAPS[type(model).__name__]))
apply_legacy_rope_scaling(out)
print(json.dumps({"peer": f"specforge {version('specforge')}", "class": type(model).__name__}))
