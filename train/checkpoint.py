"""Atomic Accelerate checkpoints: `save_state` into a scratch folder of a fresh name, then one
rename.

A run killed during a save leaves only a scratch folder (`checkpoints/.step-N.XXXXXXXX.tmp`),
which is never loaded and is removed on the next start; `latest` only ever returns complete
checkpoints (`progress.json` is written inside the folder before the rename). Saved files get
the permissions the umask gives.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from ..architectures.output_folders import fresh_dir, fresh_names_left, usual_permissions

PROGRESS_FILE = "progress.json"


class CheckpointManager:
    """Numbered checkpoints `step-<N>` under `root`, keeping the newest `keep` and every one
    at a `pinned` step."""

    def __init__(self, root: Path, keep: int = 2, pinned: tuple[int, ...] = ()) -> None:
        self.root = Path(root)
        self.keep = keep
        self.pinned = frozenset(pinned)

    def complete(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.root.is_dir():
            return []
        found = [
            p
            for p in self.root.glob("step-*")
            if p.is_dir() and (p / PROGRESS_FILE).is_file() and p.name[5:].isdigit()
        ]
        return sorted(found, key=lambda p: int(p.name[5:]))

    def latest(self) -> tuple[Path, dict[str, Any]] | None:
        """The newest complete checkpoint and its progress record, or None."""
        done = self.complete()
        if not done:
            return None
        return done[-1], json.loads((done[-1] / PROGRESS_FILE).read_text())

    def clean_partial(self) -> None:
        """Remove the scratch folders a save that was interrupted left (main process only).
        Links are never followed."""
        for tmp in fresh_names_left(self.root, "step-*"):
            shutil.rmtree(tmp, ignore_errors=True)

    def save(self, accelerator, step: int, progress: dict[str, Any]) -> Path:
        """`save_state` at `step`; every process calls it."""
        final = self.root / f"step-{step}"
        scratch = [None]
        if accelerator.is_main_process:
            self.root.mkdir(parents=True, exist_ok=True)
            scratch = [str(fresh_dir(final))]
        tmp = Path(_from_main_process(accelerator, scratch))
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            (tmp / PROGRESS_FILE).write_text(json.dumps({"step": step, **progress}))
            usual_permissions(tmp)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            for old in self.complete()[: -self.keep]:
                if int(old.name[5:]) not in self.pinned:
                    shutil.rmtree(old, ignore_errors=True)
        accelerator.wait_for_everyone()
        return final


def _from_main_process(accelerator, value: list):
    """The main process's `value[0]` on every process."""
    if accelerator.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(value, from_process=0)
    return value[0]
