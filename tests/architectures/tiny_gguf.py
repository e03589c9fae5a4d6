"""A tiny Llama written as a GGUF file with the `gguf` package's own writer: byte-level BPE
tokenizer (the 256 bytes, a few merges, ChatML specials, a chat template) and random float32
weights. What `draftzoo target convert` and `target get` convert in the tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
MERGES = ["Ġ t", "h e", "i n", "Ġt he", "e r", "o n"]


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet, in byte order."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def write_tiny_gguf(
    path: Path,
    architecture: str = "llama",
    layers: int = 2,
    seed: int = 0,
    skip: tuple[str, ...] = (),
) -> Path:
    """A tiny GGUF model file at `path` (hidden 64, 4 heads / 2 KV heads), without the tensors
    named in `skip`."""
    import gguf

    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *_byte_tokens()]
    tokens += [merge.replace(" ", "") for merge in MERGES]
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * (len(tokens) - 3)
    hidden, ffn, heads, kv_heads = 64, 128, 4, 2
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny")
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(seed)

    def weight(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    head_dim = hidden // heads
    tensors = {
        "token_embd.weight": weight(len(tokens), hidden),
        "output_norm.weight": np.ones(hidden, dtype=np.float32),
        "output.weight": weight(len(tokens), hidden),
    }
    for i in range(layers):
        tensors[f"blk.{i}.attn_norm.weight"] = np.ones(hidden, dtype=np.float32)
        tensors[f"blk.{i}.attn_q.weight"] = weight(heads * head_dim, hidden)
        tensors[f"blk.{i}.attn_k.weight"] = weight(kv_heads * head_dim, hidden)
        tensors[f"blk.{i}.attn_v.weight"] = weight(kv_heads * head_dim, hidden)
        tensors[f"blk.{i}.attn_output.weight"] = weight(hidden, heads * head_dim)
        tensors[f"blk.{i}.ffn_norm.weight"] = np.ones(hidden, dtype=np.float32)
        tensors[f"blk.{i}.ffn_gate.weight"] = weight(ffn, hidden)
        tensors[f"blk.{i}.ffn_up.weight"] = weight(ffn, hidden)
        tensors[f"blk.{i}.ffn_down.weight"] = weight(hidden, ffn)
    for name, tensor in tensors.items():
        if name not in skip:
            writer.add_tensor(name, tensor)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
