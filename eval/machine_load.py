"""Whether a timing can be trusted: what else used the machine while it ran.

Speedups are ratios of wall-clock times, so another job on the same cores changes them while
tau, acceptance and greedy identity stay what they are. `MachineLoad` reads the machine's busy
CPU time (`/proc/stat`, all cores) and this process's own (with its children) around a
measurement; what the others used, as a share of the CPU time the machine had
(wall clock x cores), says whether the clock was shared. A speedup is marked **unreliable**
when that share passes `MAX_OTHER_SHARE`, or when repeats disagree by more than `MAX_SPREAD`
(std / mean). Where `/proc/stat` is absent (not Linux), the load is not measured and says so.
On CUDA, the compute processes `nvidia-smi` lists on the evaluation's device are counted before
and after (this process is one of them; its pid may differ inside a container); any other one
marks the speedups unreliable. Without `nvidia-smi` the device is not measured and says so.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from ..inference.proposal_settings import from_serving

#: other processes' share of the machine's CPU time above which timings are unreliable
MAX_OTHER_SHARE = 0.10
#: the speedup's spread over repeats (std / mean) above which it is unreliable
MAX_SPREAD = 0.15
#: other compute processes on the evaluation's CUDA device above which it is unreliable
MAX_DEVICE_OTHERS = 0


def _busy_cpu() -> tuple[float, int] | None:
    """(busy CPU seconds of every core since boot, cores) from /proc/stat; None elsewhere."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
    except OSError:
        return None
    fields = [int(x) for x in lines[0].split()[1:]]
    # user nice system idle iowait irq softirq steal: busy = all but idle and iowait
    busy = sum(fields[:8]) - fields[3] - fields[4]
    cores = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    return busy / os.sysconf("SC_CLK_TCK"), cores


def _own_cpu() -> float:
    """CPU seconds of this process and its finished children."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


def cuda_device_uuid(device) -> str | None:
    """The UUID `nvidia-smi` names a torch CUDA `device` by; None for other devices."""
    import torch

    if device is None or torch.device(device).type != "cuda":
        return None
    return str(torch.cuda.get_device_properties(torch.device(device)).uuid)


def _bare_uuid(uuid: str) -> str:
    return uuid.strip().lower().removeprefix("gpu-")


def device_processes(uuid: str) -> int | None:
    """How many compute processes `nvidia-smi` lists on the device `uuid` (None: no
    `nvidia-smi`, or it failed)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    command = [exe, "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[part.strip() for part in line.split(",")] for line in out.stdout.splitlines()]
    return sum(1 for row in rows if len(row) == 2 and _bare_uuid(row[0]) == _bare_uuid(uuid))


class MachineLoad:
    """Measures, around a `with` block, the CPU time other processes took from the machine
    and, given a CUDA device's UUID, the other compute processes on that device."""

    def __init__(self, device_uuid: str | None = None) -> None:
        self.device_uuid = device_uuid

    def __enter__(self) -> MachineLoad:
        self._start = (time.perf_counter(), _busy_cpu(), _own_cpu())
        self._on_device = self._device_count()
        self.record: dict[str, Any] = {}
        return self

    def _device_count(self) -> int | None:
        return device_processes(self.device_uuid) if self.device_uuid else None

    def __exit__(self, *exc) -> None:
        wall0, busy0, own0 = self._start
        wall, busy, own = time.perf_counter() - wall0, _busy_cpu(), _own_cpu() - own0
        self.record = self._device_record(self._on_device, self._device_count())
        if busy0 is None or busy is None or wall <= 0:
            self.record.update({"measured": False, "wall_seconds": round(wall, 3)})
            return
        cores = busy[1]
        other = max(0.0, busy[0] - busy0[0] - own)
        self.record.update(
            {
                "measured": True,
                "wall_seconds": round(wall, 3),
                "cores": cores,
                "own_cpu_seconds": round(own, 3),
                "other_cpu_seconds": round(other, 3),
                "other_share": round(other / (wall * cores), 4),
            }
        )

    def _device_record(self, before: int | None, after: int | None) -> dict[str, Any]:
        """{"device_other_processes": the most other compute processes seen on the device}
        (absent on CPU; None when it could not be read)."""
        if not self.device_uuid:
            return {}
        if before is None or after is None:
            return {"device_other_processes": None}
        return {"device_other_processes": max(0, max(before, after) - 1)}  # one of them is us


def timing_verdict(load: dict[str, Any], spreads: list[float]) -> dict[str, Any]:
    """The report's `timing`: the load, the largest speedup spread over repeats, and whether
    its timings are reliable, with one sentence why not."""
    spread = max(spreads, default=0.0)
    why = None
    if (load.get("device_other_processes") or 0) > MAX_DEVICE_OTHERS:
        why = (
            f"{load['device_other_processes']} other process(es) ran on the GPU while it ran "
            f"(bound {MAX_DEVICE_OTHERS})"
        )
    elif load.get("measured") and load["other_share"] > MAX_OTHER_SHARE:
        why = (
            f"other processes used {load['other_share']:.0%} of the machine's CPU time while it "
            f"ran (bound {MAX_OTHER_SHARE:.0%})"
        )
    elif spread > MAX_SPREAD:
        why = f"its repeats disagree by {spread:.0%} (std / mean; bound {MAX_SPREAD:.0%})"
    return {
        **load,
        "max_speedup_spread": round(spread, 4),
        "reliable": why is None,
        "why_unreliable": why,
    }


def unreliable_sentence(report: dict[str, Any]) -> str | None:
    """One sentence for summaries, cards and the demo when a report's speedups are unreliable
    (None when they are reliable, or the report predates the check)."""
    timing = report.get("timing") or {}
    if timing.get("reliable", True):
        return None
    timed = _clock_dependent(report.get("serving"))
    if timed:
        return (
            f"Speedups UNRELIABLE: {timing['why_unreliable']}; here tau, acceptance and which "
            f"tokens were drafted depend on the clock too, through {' and '.join(timed)} — "
            "rerun alone on the machine (or by scores, untimed, to reproduce them)."
        )
    return (
        f"Speedups UNRELIABLE: {timing['why_unreliable']}; tau, acceptance and greedy identity "
        "do not depend on the clock (this proposal times nothing), the speedups and tokens/s "
        "do — rerun alone on the machine."
    )


def _clock_dependent(serving: dict[str, Any] | None) -> tuple[str, ...]:
    """What in a report's proposal reads the clock (nothing for a report without one)."""
    if not serving:
        return ()
    return from_serving(serving, None).clock_dependent()
