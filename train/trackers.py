"""Experiment trackers through Accelerate: tensorboard, and wandb offline unless logged in."""

from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)

TRACKERS = ("tensorboard", "wandb")


def wandb_logged_in() -> bool:
    """True when wandb has credentials (WANDB_API_KEY or a netrc entry from `wandb login`)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore")


def prepare_trackers(log_with: tuple[str, ...], work_dir: Path) -> list[str] | None:
    """Validate tracker names and route wandb offline (into work_dir) unless the user logged in.

    An explicit WANDB_MODE is respected.
    """
    unknown = sorted(set(log_with) - set(TRACKERS))
    if unknown:
        raise ValueError(f"unknown tracker(s) {unknown}; known: {', '.join(TRACKERS)}")
    if "wandb" in log_with:
        os.environ.setdefault("WANDB_DIR", str(work_dir))
        if "WANDB_MODE" not in os.environ and not wandb_logged_in():
            os.environ["WANDB_MODE"] = "offline"
            logger.info("wandb: not logged in, logging offline to %s (wandb sync later)", work_dir)
    return list(log_with) or None
