import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from draftzoo.data.prompts import load_prompt_set
from draftzoo.inference.batch import BatchGenerator
from draftzoo.inference.generate import SpeculativeGenerator
from draftzoo.inference.proposers import PromptLookupProposer
from draftzoo.inference.sampling import SamplingParams
from draftzoo.train.testbed import committed_testbed_dir
tok = AutoTokenizer.from_pretrained(committed_testbed_dir())
t = AutoModelForCausalLM.from_pretrained(committed_testbed_dir(), dtype=torch.float32).eval()
prompts = [p.render(tok, chat=True) for p in load_prompt_set("humaneval")]
params = SamplingParams(max_new_tokens=128)
pl = BatchGenerator(t, tok, lambda: PromptLookupProposer(1, 3), 4, max_speculative_batch=4)
plain4 = BatchGenerator(t, tok, None, 4)
single = SpeculativeGenerator(t, tok)
for start in range(0, len(prompts), 4):
    group = prompts[start:start+4]
    outs = pl.generate(group, params).outputs
    for j, o in enumerate(outs):
        ref = single.generate(group[j], params).token_ids
        if o.token_ids != ref:
            k = next(i for i, (a, b) in enumerate(zip(o.token_ids, ref)) if a != b)
            ids = tok(group[j], add_special_tokens=False).input_ids + ref[:k]
            with torch.no_grad():
                logits = t(input_ids=torch.tensor([ids])).logits[0, -1]
            top = logits.topk(2)
            p4 = plain4.generate(group, params).outputs[j].token_ids
            print("prompt", start + j, "diverges at", k, "spec", o.token_ids[k], "ref", ref[k],
                  "top2", top.indices.tolist(), "margin %.6f" % (top.values[0] - top.values[1]).item(),
                  "plain batch-4 equals ref:", p4 == ref)
