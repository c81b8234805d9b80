"""A plain script (no gpuscale) that waits for a signal: OUT/ready-RANK once its handlers are in place, then
OUT/got-RANK holding the name of the first of SIGUSR1/SIGTERM it received, and exit 75 (a stop on request).

argv: OUT. Exits 1 if no signal came within a minute.
"""

import os
import signal
import sys
import time
from pathlib import Path

out, rank = Path(sys.argv[1]), os.environ["RANK"]


def got(signum, frame):
    (out / f"got-{rank}").write_text(signal.Signals(signum).name)
    sys.exit(75)


for name in ("SIGUSR1", "SIGTERM"):
    signal.signal(getattr(signal, name), got)
(out / f"ready-{rank}").write_text("")
time.sleep(60)
sys.exit(1)
