"""Conversation sources known by name (`data.source: testbed-chat`, `data.source: sharegpt`).

A named source is its rows plus a content key; `conversations.iter_rows` and
`token_dataset.source_hash` read this table, so a new one is its own module plus one line here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class NamedSource:
    """A conversation source with a stable name."""

    rows: Callable[[], Iterator[dict]]  # raw rows, as `conversations.normalise_row` reads them
    content_hash: Callable[[], str]  # changes whenever the rows would


def named_source(name: str) -> NamedSource | None:
    """The source called `name`, or None for a path or hub name."""
    from .sharegpt import SHAREGPT, iter_sharegpt_rows, sharegpt_hash
    from .testbed_chat import TESTBED_CHAT, iter_testbed_chat_rows, testbed_chat_hash

    sources = {
        TESTBED_CHAT: NamedSource(iter_testbed_chat_rows, testbed_chat_hash),
        SHAREGPT: NamedSource(iter_sharegpt_rows, sharegpt_hash),
    }
    return sources.get(str(name))
