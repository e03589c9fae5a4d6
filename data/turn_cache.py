"""The KV cache a batch of conversations keeps from one assistant turn to the next.

Regenerating turn k of a conversation asks for the target's answer given every earlier turn;
prefilling the whole conversation again for each turn costs more than the answers themselves on
a CPU. `TurnCache` keeps the batch's transformers cache between `generate` calls, so a turn
prefills only what is new: the user's turn after the answer just written.

Each row of the cache is a sequence of columns, each a token with a flag saying whether later
tokens attend to it (the attention mask). A new prompt is fully rendered and tokenized, as
without a cache; the row keeps the longest prefix of its attended tokens that equals the
prompt's first tokens, masks every attended column after it, and appends the rest of the
prompt, left-padded within the new segment so that every row ends at the last column (the
padding masked). Positions follow the mask (transformers numbers positions by its running
sum), so a kept column holds exactly what a fresh prefill of the prompt computes: it attended
to the same tokens at the same positions. Whatever the template or the tokenizer does at a
turn's boundary (an answer decoded and encoded again, a cut answer, text a template adds), the
answer is the one the full prompt gets. Masked columns stay in the cache as holes.
"""

from __future__ import annotations

import torch

from ..architectures.target import cache_parameter


class TurnCache:
    """The cache of one batch of conversations across their turns (rows in batch order)."""

    def __init__(self, model, rows: list[int], pad_id: int) -> None:
        self.rows = list(rows)  # the conversation each cache row belongs to
        self.pad_id = pad_id
        self.cache_name = cache_parameter(type(model))  # `cache` or `past_key_values`
        self.ids = torch.empty(len(rows), 0, dtype=torch.long, device=model.device)
        self.mask = torch.empty(len(rows), 0, dtype=torch.long, device=model.device)
        self.cache = None  # transformers' cache: every column but the last generated one

    def keep(self, rows: list[int]) -> None:
        """Drop every cache row whose conversation is not in `rows` (it has no turn left)."""
        kept = [i for i, r in enumerate(self.rows) if r in set(rows)]
        if len(kept) == len(self.rows):
            return
        index = torch.tensor(kept, dtype=torch.long, device=self.ids.device)
        self.rows = [self.rows[i] for i in kept]
        self.ids, self.mask = self.ids[index], self.mask[index]
        if self.cache is not None:
            self.cache.batch_select_indices(index)

    def inputs(self, prompts: dict[int, list[int]]) -> tuple[dict, dict[int, int]]:
        """`generate`'s inputs for the prompts (token ids, by conversation) of the rows that
        ask now, and how many tokens of each prompt the cache already held. A cache row not
        asking gets a masked segment: it keeps its place for a later turn."""
        reused = {}
        tails = []
        for i, row in enumerate(self.rows):
            prompt = prompts.get(row)
            if prompt is None:
                tails.append([])
                continue
            attended = torch.nonzero(self.mask[i], as_tuple=True)[0]
            held = self.ids[i, attended].tolist()
            same = 0
            for cached, wanted in zip(held, prompt, strict=False):
                if cached != wanted:
                    break
                same += 1
            if same == len(prompt):  # the last token feeds the answer: it is computed again
                same -= 1
            self.mask[i, attended[same:]] = 0
            reused[row] = same
            tails.append(prompt[same:])
        width = max(len(t) for t in tails)
        segment = torch.full((len(self.rows), width), self.pad_id, dtype=torch.long)
        segment_mask = torch.zeros(len(self.rows), width, dtype=torch.long)
        for i, tail in enumerate(tails):
            if tail:
                segment[i, width - len(tail) :] = torch.tensor(tail, dtype=torch.long)
                segment_mask[i, width - len(tail) :] = 1
        device = self.ids.device
        self.ids = torch.cat([self.ids, segment.to(device)], dim=1)
        self.mask = torch.cat([self.mask, segment_mask.to(device)], dim=1)
        inputs = {"input_ids": self.ids, "attention_mask": self.mask}
        if self.cache is not None:
            inputs[self.cache_name] = self.cache
        return inputs, reused

    def generated(self, sequences: torch.Tensor, cache, asking: list[int]) -> None:
        """Keep what `generate` returned: its sequences (the inputs and the new columns) and
        its cache; the new columns of rows that did not ask are masked."""
        new = sequences.shape[1] - self.ids.shape[1]
        new_mask = torch.zeros(len(self.rows), new, dtype=torch.long, device=self.ids.device)
        for i, row in enumerate(self.rows):
            if row in asking:
                new_mask[i] = 1
        self.ids = sequences
        self.mask = torch.cat([self.mask, new_mask], dim=1)
        self.cache = cache
