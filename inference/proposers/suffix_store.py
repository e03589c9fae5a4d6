"""A global suffix cache kept in a file, so earlier requests' outputs serve later processes.

`SuffixSettings(cache_path=FILE)` (`draftzoo generate --suffix-cache FILE`): the cache starts
from the outputs the file holds (oldest first, within the token budget) and writes itself back
after every finished request, whole and atomically (a unique temporary file beside it, fsynced,
then renamed), so a killed process leaves the last complete version. The file records the
tokenizer it counts tokens of and the depth it matches; another tokenizer's or depth's file is
refused, and so is anything else at that path (a file draftzoo did not write, a folder, a
symbolic link) and a folder that cannot be written — before any decoding, changing nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...architectures.output_folders import write_text_atomically
from ..errors import GenerationError
from .suffix import SuffixCache, SuffixSettings

#: what the file says it is
FORMAT = "draftzoo suffix cache"
VERSION = 1


class SuffixCacheFileError(GenerationError):
    """A global suffix cache file that cannot be used."""


def _tokenizer_id(tokenizer) -> str:
    from ...architectures.target import tokenizer_hash

    return tokenizer_hash(tokenizer)


def check_cache_path(path: Path) -> None:
    """Refuse a path the cache cannot live at, or a file there that is not a suffix cache
    (nothing is written)."""
    if path.is_symlink():
        raise SuffixCacheFileError(f"suffix cache {path} is a symbolic link; name a regular file")
    if path.exists() and not path.is_file():
        raise SuffixCacheFileError(f"suffix cache {path} is not a file")
    folder = path.parent
    if not folder.is_dir():
        raise SuffixCacheFileError(f"suffix cache {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.R_OK)):
        raise SuffixCacheFileError(f"suffix cache {path} is not writable here")
    if path.exists():
        read_cache_file(path)


def read_cache_file(path: Path) -> dict:
    """The file's contents, checked to be a suffix cache draftzoo wrote."""
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not a suffix cache")
        outputs = data["outputs"]
        if not all(isinstance(o, list) and all(type(t) is int for t in o) for o in outputs):
            raise ValueError("outputs are not lists of token ids")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise SuffixCacheFileError(
            f"{path} is not a draftzoo suffix cache ({err}); name a new file (nothing was changed)"
        ) from err
    return data


class SuffixCacheFile(SuffixCache):
    """A `SuffixCache` read from and written back to `path`."""

    def __init__(self, path: Path | str, depth: int, max_tokens: int, tokenizer) -> None:
        super().__init__(depth, max_tokens)
        self.path = Path(path)
        self.tokenizer = _tokenizer_id(tokenizer)
        self.vocab_size = len(tokenizer)
        check_cache_path(self.path)
        if self.path.exists():
            for output in self._read():
                super().add(output)

    def _read(self) -> list[list[int]]:
        data = read_cache_file(self.path)
        if data.get("tokenizer") != self.tokenizer:
            raise SuffixCacheFileError(
                f"suffix cache {self.path} counts another tokenizer's tokens; name a new file"
            )
        if data.get("depth") != self.trie.depth:
            raise SuffixCacheFileError(
                f"suffix cache {self.path} matches {data.get('depth')} tokens deep, these "
                f"settings {self.trie.depth}; name a new file or the same depth"
            )
        outputs = data["outputs"]
        if any(not 0 <= token < self.vocab_size for output in outputs for token in output):
            raise SuffixCacheFileError(
                f"suffix cache {self.path} holds token ids outside the tokenizer's "
                f"{self.vocab_size}; name a new file"
            )
        return outputs

    def add(self, output) -> None:
        super().add(output)
        self.save()

    def clear(self) -> None:
        super().clear()
        self.save()

    def save(self) -> None:
        """Write the held outputs to the file, atomically."""
        payload = {
            "format": FORMAT,
            "version": VERSION,
            "tokenizer": self.tokenizer,
            "depth": self.trie.depth,
            "outputs": [list(output) for output in self.held],
        }
        write_text_atomically(self.path, json.dumps(payload))


def global_cache(settings: SuffixSettings, tokenizer=None) -> SuffixCache:
    """The global cache `settings` ask for: in memory, or kept in `settings.cache_path` (which
    needs the `tokenizer` whose tokens it counts)."""
    if settings.cache_path is None:
        return SuffixCache(settings.depth, settings.max_global_tokens)
    if tokenizer is None:
        raise SuffixCacheFileError("a suffix cache file needs the target's tokenizer")
    return SuffixCacheFile(
        settings.cache_path, settings.depth, settings.max_global_tokens, tokenizer
    )
