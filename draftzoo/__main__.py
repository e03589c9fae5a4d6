"""`python -m draftzoo ...` (and `accelerate launch -m draftzoo ...`) runs the CLI."""

import sys

from draftzoo.cli import main

sys.exit(main())
