"""Every 12th (or EVERY-th) `testbed-chat` request (a function signature and docstring from
the installed packages' source) as a SmolLM2 training request, its answer dropped; a file
already there is kept (another machine's packages give other requests).

    python bench/smollm2_code_requests.py DATA_DIR [EVERY]  # writes DATA_DIR/code-requests.jsonl
"""

import itertools
import json
import os
import sys
from pathlib import Path

from draftzoo.data.testbed_chat import iter_testbed_chat_rows


def main() -> None:
    out = Path(sys.argv[1]) / "code-requests.jsonl"
    every = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    if out.exists():
        print(f"{out}: kept")
        return
    rows = [
        {
            "messages": [row["messages"][0], {"role": "assistant", "content": ""}],
            "source": "testbed-chat",
        }
        for row in itertools.islice(iter_testbed_chat_rows(), 0, None, every)
    ]
    partial = out.with_name(out.name + ".tmp")
    partial.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(partial, out)
    print(f"{out}: {len(rows)} code requests")


if __name__ == "__main__":
    main()
