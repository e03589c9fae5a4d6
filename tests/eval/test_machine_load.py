"""Timings that say when they cannot be trusted: an eval run beside CPU-burning processes is
marked unreliable in its report, summary, card and leaderboard row, and publish refuses it
unless asked. (The quiet case is a bench script's, not a timed test's:
`python bench/machine_load_check.py`.)"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from draftzoo.eval import machine_load
from draftzoo.eval.machine_load import MachineLoad, timing_verdict
from draftzoo.inference.proposal_settings import from_name


@pytest.fixture
def real_bounds(monkeypatch):
    """The gate's own bounds (the suite opens it for every other test)."""
    monkeypatch.setattr(machine_load, "MAX_OTHER_SHARE", 0.10)
    monkeypatch.setattr(machine_load, "MAX_SPREAD", 0.15)
    monkeypatch.setattr(machine_load, "MAX_DEVICE_OTHERS", 0)


@pytest.fixture
def burners():
    """One busy-looping process per core, for as long as the test runs."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    time.sleep(0.5)  # running before the measurement starts
    yield
    for proc in procs:
        proc.kill()
        proc.wait()


def test_other_processes_cpu_time_marks_a_measurement_unreliable(real_bounds, burners):
    with MachineLoad() as load:
        time.sleep(1.5)  # this process idles; the burners use the cores
    record = load.record
    assert record["measured"] and record["other_share"] > 0.5, record
    verdict = timing_verdict(record, [0.01])
    assert not verdict["reliable"] and "other processes used" in verdict["why_unreliable"]
    assert timing_verdict({**record, "other_share": 0.0}, [0.3])["why_unreliable"].startswith(
        "its repeats disagree by 30%"
    )


def test_an_eval_beside_burners_is_marked_and_publish_refuses_it(
    real_bounds, burners, tiny_drafters, tiny_target_model, tmp_path
):
    from draftzoo.demo import _side_by_side
    from draftzoo.eval.leaderboard import render, row_from_report
    from draftzoo.eval.publish import PublishError, publish
    from draftzoo.eval.runner import EvalConfig, evaluate, summary_text, write_report
    from draftzoo.inference.load import load_drafter

    model, tokenizer, path = tiny_target_model
    folder = tiny_drafters["eagle3"]
    drafter = load_drafter(folder, model, tokenizer, from_name("chain", 3))
    config = EvalConfig(
        max_prompts=2, max_new_tokens=12, temperatures=(0.0,), certificate_samples=300
    )
    report = evaluate(model, tokenizer, drafter, config, str(path), show_progress=False)
    timing = report["timing"]
    assert not timing["reliable"] and timing["other_share"] > machine_load.MAX_OTHER_SHARE
    assert report["results"][0]["greedy_identity"]["identical"] == 2  # the clock only
    assert "Speedups UNRELIABLE: other processes used" in summary_text(report)
    demo_lines = _side_by_side({"busy": report})  # what `draftzoo demo` prints
    assert " busy " in demo_lines and f"{report['results'][0]['speedup']['mean']:.2f}x" not in (
        demo_lines
    )
    assert "busy: Speedups UNRELIABLE: other processes used" in demo_lines
    report_path = write_report(report, tmp_path / "eval")
    zoo = tmp_path / "zoo"
    with pytest.raises(PublishError, match="--allow-unreliable-timing"):
        publish(folder, report_path, zoo, "busy")
    assert not zoo.exists() or not any(p.name == "busy" for p in zoo.iterdir())
    published = publish(folder, report_path, zoo, "busy", allow_unreliable_timing=True)
    card = (published / "README.md").read_text()
    assert "Speedups UNRELIABLE" in card and "--allow-unreliable-timing" in card
    row = row_from_report(report, "busy")
    assert row.unreliable and "| unreliable timing |" in render([row], "t", plot=None)


def test_other_processes_on_the_cuda_device_mark_a_measurement_unreliable(
    real_bounds, tmp_path, monkeypatch
):
    """`nvidia-smi`'s compute processes on the evaluation's device (a stand-in `nvidia-smi` on
    PATH answers in its CSV format here; one of the processes is the evaluation itself)."""
    listing = tmp_path / "apps.csv"
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\ncat {listing}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    mine = "GPU-1a2b3c4d-0000-1111-2222-333344445555"
    listing.write_text(f"{mine}, 4242\nGPU-ffffffff-0000-1111-2222-333344445555, 77\n")
    assert machine_load.device_processes(mine) == 1
    assert machine_load.device_processes(mine.removeprefix("GPU-").upper()) == 1
    with MachineLoad(mine) as load:
        listing.write_text(f"{mine}, 4242\n{mine}, 99\n")  # another job joins our device
    assert load.record["device_other_processes"] == 1
    verdict = timing_verdict(load.record, [0.0])
    assert (
        not verdict["reliable"]
        and "1 other process(es) ran on the GPU" in verdict["why_unreliable"]
    )
    listing.write_text(f"{mine}, 4242\n")
    with MachineLoad(mine) as alone:
        pass
    assert alone.record["device_other_processes"] == 0
    fake.unlink()
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi at all: said, not guessed
    with MachineLoad(mine) as unknown:
        pass
    assert unknown.record["device_other_processes"] is None
    # an unknown device count marks nothing (the CPU share is this machine's, set aside here:
    # other jobs on it must not decide the test)
    assert timing_verdict({**unknown.record, "other_share": 0.0}, [0.0])["reliable"]
    with MachineLoad() as cpu:  # no device asked: no device field
        pass
    assert "device_other_processes" not in cpu.record and cpu.record["measured"]
