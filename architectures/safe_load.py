"""Loading causal LMs (targets, writers, draft LMs) so that loading cannot run the files' code.

Weights are read from safetensors only: a folder whose weights are a pickle
(`pytorch_model.bin`, `*.pt`, `*.pth`, `*.ckpt`, `*.pkl`) is refused unless the user allows
pickles explicitly (`draftzoo --allow-pickle ...`, or `DRAFTZOO_ALLOW_PICKLE=1`), and
`trust_remote_code` is never set, so a model whose architecture lives in the repository's own
Python files is refused by transformers.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import DraftzooError

#: set to 1 by `draftzoo --allow-pickle`, inherited by `accelerate launch` workers
ALLOW_PICKLE_ENV = "DRAFTZOO_ALLOW_PICKLE"
PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


class UnsafeFileError(DraftzooError, ValueError):
    """A file that could run code when loaded, and no permission to load it."""


def pickles_allowed() -> bool:
    """Whether the user allowed pickled weights for this process."""
    return os.environ.get(ALLOW_PICKLE_ENV) == "1"


def pickled_weights(folder: Path) -> list[str]:
    """The pickle files a folder would be loaded from (none when it has safetensors)."""
    folder = Path(folder)
    if not folder.is_dir() or any(folder.glob("*.safetensors")):
        return []
    return sorted(p.name for pattern in PICKLE_PATTERNS for p in folder.glob(pattern))


def check_no_pickle(folder: Path | str) -> None:
    """Refuse a local folder whose weights are only a pickle, unless pickles are allowed."""
    found = pickled_weights(Path(folder))
    if found and not pickles_allowed():
        raise UnsafeFileError(
            f"{folder} holds its weights as a pickle ({', '.join(found)}), which can run code "
            "when loaded; convert it to safetensors, or pass --allow-pickle if you trust it"
        )


def load_causal_lm(name_or_path: str | Path, **kwargs):
    """`AutoModelForCausalLM.from_pretrained` that reads safetensors only (unless pickles are
    allowed) and never trusts remote code."""
    from transformers import AutoModelForCausalLM

    if kwargs.pop("trust_remote_code", False):
        raise UnsafeFileError("draftzoo never loads a model's own code (trust_remote_code)")
    check_no_pickle(name_or_path)
    safetensors_only = None if pickles_allowed() else True
    return AutoModelForCausalLM.from_pretrained(
        name_or_path, use_safetensors=safetensors_only, **kwargs
    )


#: files one of which a local model folder's tokenizer is read from
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(name_or_path: str | Path):
    """`AutoTokenizer.from_pretrained`, refusing in one line a local folder that has no
    tokenizer files, or a tokenizer transformers cannot build."""
    from transformers import AutoTokenizer

    folder = Path(name_or_path).expanduser()
    if folder.is_dir() and not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise DraftzooError(
            f"{folder} has no tokenizer ({', '.join(TOKENIZER_FILES)}): a target folder needs "
            "the tokenizer it was trained with"
        )
    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except (ValueError, KeyError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DraftzooError(f"the tokenizer of {name_or_path} cannot be loaded: {first}") from err
