"""Loading causal LMs (targets, writers, draft LMs) so that loading cannot run the files' code.

Weights are read from safetensors only: a folder whose weights are a pickle
(`pytorch_model.bin`, `*.pt`, `*.pth`, `*.ckpt`, `*.pkl`) is refused unless the user allows
pickles explicitly (`draftzoo --allow-pickle ...`, or `DRAFTZOO_ALLOW_PICKLE=1`), and
`trust_remote_code` is never set: a local folder whose `config.json` or
`tokenizer_config.json` names its own code (`auto_map`) is refused before transformers reads it,
and transformers' own refusal of a hub model's code is turned into the same one-line error.
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


CUSTOM_CODE_CONFIGS = ("config.json", "tokenizer_config.json")


def check_no_custom_code(folder: Path | str) -> None:
    """Refuse a local folder whose configs name Python files of its own (`auto_map`)."""
    import json

    folder = Path(folder).expanduser()
    for name in CUSTOM_CODE_CONFIGS:
        path = folder / name
        try:
            config = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            continue  # unreadable configs are refused by whatever reads them
        code = config.get("auto_map") if isinstance(config, dict) else None
        if code:
            named = ", ".join(sorted(str(v) for v in _flatten(code)))
            raise UnsafeFileError(
                f"{path} names the model's own code ({named}); draftzoo never runs a "
                "model's own code (trust_remote_code): use a model transformers implements"
            )


def _flatten(value) -> list:
    if isinstance(value, dict):
        return [item for v in value.values() for item in _flatten(v)]
    if isinstance(value, (list, tuple)):
        return [item for v in value for item in _flatten(v)]
    return [value]


def _remote_code_refused(err: Exception, name) -> UnsafeFileError | None:
    """transformers' refusal to run a hub model's code, as our one-line error."""
    if "trust_remote_code" in str(err):
        return UnsafeFileError(
            f"{name} needs its own code to load (trust_remote_code); draftzoo never runs a "
            "model's own code: use a model transformers implements"
        )
    return None


def load_config(name_or_path: str | Path):
    """`AutoConfig.from_pretrained` that never trusts remote code (one line if it is needed)."""
    from transformers import AutoConfig

    check_no_custom_code(name_or_path)
    try:
        return AutoConfig.from_pretrained(name_or_path)
    except ValueError as err:
        refused = _remote_code_refused(err, name_or_path)
        if refused is None:
            raise
        raise refused from err


def load_causal_lm(name_or_path: str | Path, **kwargs):
    """`AutoModelForCausalLM.from_pretrained` that reads safetensors only (unless pickles are
    allowed) and never trusts remote code."""
    from transformers import AutoModelForCausalLM

    if kwargs.pop("trust_remote_code", False):
        raise UnsafeFileError("draftzoo never loads a model's own code (trust_remote_code)")
    check_no_pickle(name_or_path)
    check_no_custom_code(name_or_path)
    safetensors_only = None if pickles_allowed() else True
    try:
        return AutoModelForCausalLM.from_pretrained(
            name_or_path, use_safetensors=safetensors_only, **kwargs
        )
    except ValueError as err:
        refused = _remote_code_refused(err, name_or_path)
        if refused is None:
            raise
        raise refused from err


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
    check_no_custom_code(name_or_path)
    try:
        return AutoTokenizer.from_pretrained(name_or_path)
    except (ValueError, KeyError) as err:
        refused = _remote_code_refused(err, name_or_path)
        if refused is not None:
            raise refused from err
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DraftzooError(f"the tokenizer of {name_or_path} cannot be loaded: {first}") from err
