"""Run a draftzoo command on a disk that fills: from the AT-th file write on (every tensor file
draftzoo, Accelerate or safetensors writes: `torch.save`, safetensors' `save_file`), each
write fails with ENOSPC, as a full disk does, and keeps failing.

    python -m tests.full_disk AT draftzoo-args...

Exits with the command's own exit code; its last stdout line is JSON: how many writes were
attempted and whether the disk filled before the command ended.
"""

from __future__ import annotations

import errno
import json
import sys


def install(at: int) -> dict:
    """Patch the writers; returns the live tally."""
    import accelerate.utils.other as accelerate_other
    import safetensors.torch
    import torch

    tally = {"writes": 0, "filled": False}

    def failing(real):
        def write(*args, **kwargs):
            tally["writes"] += 1
            if tally["writes"] >= at:
                tally["filled"] = True
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            return real(*args, **kwargs)

        return write

    torch.save = failing(torch.save)
    safetensors.torch.save_file = failing(safetensors.torch.save_file)
    accelerate_other.safe_save_file = failing(accelerate_other.safe_save_file)
    return tally


def main() -> int:
    at, argv = int(sys.argv[1]), sys.argv[2:]
    tally = install(at)
    from draftzoo.cli import main as draftzoo

    code = draftzoo(argv)
    print(json.dumps(tally))
    return code


if __name__ == "__main__":
    raise SystemExit(main())
