"""One `draftzoo train` at a time in a working folder; a killed holder leaves no stale lock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from draftzoo.cli import main
from draftzoo.train.run_lock import LOCK_FILE, hold_work_dir
from draftzoo.train.setup import work_dir_of
from tests.train.helpers import recipe_yaml, tiny_recipe, write_chat_jsonl


def test_a_second_run_in_the_same_working_folder_is_refused(testbed_tiny, tmp_path, capsys):
    chat = write_chat_jsonl(tmp_path / "chat.jsonl", 12)
    recipe = tiny_recipe(tmp_path, testbed_tiny[0], chat, data={"max_length": 512})
    path = str(recipe_yaml(recipe, tmp_path / "r.yaml"))
    work = work_dir_of(recipe)
    work.mkdir(parents=True)
    held = hold_work_dir(work)  # what a running `draftzoo train` of this recipe holds
    assert main(["train", path]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("draftzoo: error: ") and f"(pid {os.getpid()})" in err
    assert sorted(p.name for p in work.iterdir()) == [LOCK_FILE]  # no checkpoint touched
    assert not Path(recipe.output_dir).exists()
    held.release()
    assert main(["train", path]) == 0
    hold_work_dir(work).release()  # the finished run let go


def test_a_killed_holder_leaves_the_lock_free(tmp_path):
    code = (
        "import sys, time; from pathlib import Path\n"
        "from draftzoo.train.run_lock import hold_work_dir\n"
        "hold_work_dir(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    try:
        hold_work_dir(tmp_path)
    except Exception as err:
        assert f"pid {holder.pid}" in str(err)
    else:
        raise AssertionError("a held working folder was not refused")
    holder.kill()
    holder.wait()
    time.sleep(0.1)
    hold_work_dir(tmp_path).release()
