"""Optional JSON files beside a drafter that `publish` carries into its zoo entry (a rerun's
cost figures, other engines' measurements): read here, refused in one line when unreadable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..architectures.errors import DraftzooError
from ..architectures.output_folders import open_own_file


def read_json_beside(folder: Path, name: str, what: str, error: type[DraftzooError]) -> Any | None:
    """`folder/name` parsed, or None when there is no such file; `error` names it as not a
    `what` file when it cannot be read as JSON."""
    path = Path(folder) / name
    if not path.is_file():
        return None
    with open_own_file(path, error) as handle:  # a link there is refused, never followed
        data = handle.read()
    try:
        return json.loads(data)
    except (UnicodeDecodeError, ValueError) as err:
        raise error(f"{path}: not {what} ({err})") from None
