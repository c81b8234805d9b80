"""`python -m gpuscale ...` is `gpuscale ...` (and lets launchers start `-m gpuscale env`)."""

import sys

from gpuscale.cli import console

sys.exit(console())
