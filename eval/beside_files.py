"""Optional JSON files beside a drafter that `publish` carries into its zoo entry (a rerun's
cost figures, other engines' measurements): read here, refused in one line when unreadable."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..architectures.errors import DraftzooError


def read_json_beside(folder: Path, name: str, what: str, error: type[DraftzooError]) -> Any | None:
    """`folder/name` parsed, or None when there is no such file; `error` names it as not a
    `what` file when it cannot be read as JSON."""
    path = Path(folder) / name
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise error(f"{path}: not {what} ({err})") from None
