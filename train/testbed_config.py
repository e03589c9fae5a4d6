"""Typed config of a testbed target recipe (`recipes/testbed/*.yaml`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..data.corpus import DEFAULT_PACKAGES, CorpusSpec


@dataclass(frozen=True)
class TokenizerConfig:
    """The byte-level BPE."""

    vocab_size: int = 8192  # including the 3 special tokens
    sample_every: int = 4  # train the BPE on every n-th training file (speed; stable order)

    def __post_init__(self) -> None:
        if self.sample_every < 1:
            raise ValueError("sample_every must be >= 1")


@dataclass(frozen=True)
class ModelConfig:
    """The `LlamaForCausalLM` shape (transformers `LlamaConfig` fields of the same names)."""

    hidden_size: int = 256
    num_hidden_layers: int = 12
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    intermediate_size: int = 768
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be divisible by num_key_value_heads")


@dataclass(frozen=True)
class PretrainConfig:
    """The pretraining loop."""

    seed: int = 0  # seeds the weights and every batch
    seq_len: int = 256  # tokens per training window
    micro_batch_size: int = 16  # windows per process per forward
    grad_accum: int = 2  # micro-batches per optimizer step
    max_steps: int = 1000  # optimizer steps
    lr: float = 2e-3  # peak learning rate (AdamW)
    min_lr_ratio: float = 0.1  # cosine floor as a share of lr
    warmup_steps: int = 100  # linear warm-up steps
    weight_decay: float = 0.1  # AdamW decoupled weight decay (matrices only)
    beta2: float = 0.95  # AdamW beta2
    grad_clip: float = 1.0  # max gradient norm
    mixed_precision: str = "auto"  # "auto" (bf16 where native, else float32), "bf16" or "no"
    eval_every: int = 200  # steps between held-out evaluations
    eval_windows: int = 128  # held-out windows per evaluation (fixed, evenly spaced)
    checkpoint_every: int = 100  # steps between `save_state` checkpoints (resume points)
    log_with: tuple[str, ...] = ()  # Accelerate trackers, e.g. ["tensorboard"] or ["wandb"]

    def __post_init__(self) -> None:
        if self.mixed_precision not in ("auto", "bf16", "no"):
            raise ValueError(
                f"mixed_precision must be 'auto', 'bf16' or 'no', got {self.mixed_precision!r}"
            )
        if self.warmup_steps >= self.max_steps:
            raise ValueError("warmup_steps must be < max_steps")
        if min(self.seq_len, self.micro_batch_size, self.grad_accum, self.max_steps) < 1:
            raise ValueError("seq_len, micro_batch_size, grad_accum and max_steps must be >= 1")


@dataclass(frozen=True)
class CorpusConfig:
    """Which sources form the corpus (see `draftzoo.data.corpus`)."""

    packages: tuple[str, ...] = DEFAULT_PACKAGES  # distributions read besides the stdlib
    include_stdlib: bool = True  # read the running Python's standard library
    heldout_percent: float = 6.0  # share of stdlib module groups held out
    max_file_bytes: int = 400_000  # skip larger files
    max_files: int | None = None  # cap per origin (tiny corpora); None reads everything
    chat_pairs: bool = True  # add signature+docstring -> function chat pairs

    def spec(self) -> CorpusSpec:
        """The corpus spec these settings describe."""
        return CorpusSpec(
            packages=self.packages,
            include_stdlib=self.include_stdlib,
            heldout_percent=self.heldout_percent,
            max_file_bytes=self.max_file_bytes,
            max_files=self.max_files,
        )


@dataclass(frozen=True)
class TestbedConfig:
    """A whole testbed recipe: corpus -> tokenizer -> model -> pretraining."""

    __test__ = False  # not a pytest class

    name: str = "testbed"  # the size's name, e.g. "testbed-small"
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: PretrainConfig = field(default_factory=PretrainConfig)
