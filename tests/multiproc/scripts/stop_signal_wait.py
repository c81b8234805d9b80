"""gpuscale.StopSignal waiting for a signal to the launcher: OUT/ready-RANK once its handlers are in place, then
steps of 20 ms until the ranks agree to stop, OUT/checkpoint-RANK (the checkpoint a real script writes there), and
StopSignal.exit() (exit code 75).

argv: OUT. Exits 1 if no signal came within a minute.
"""

import sys
import time
from pathlib import Path

import gpuscale

out = Path(sys.argv[1])
with gpuscale.init() as rt:
    stop = gpuscale.StopSignal(every=1)
    (out / f"ready-{rt.rank}").write_text("")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if stop.requested():
            (out / f"checkpoint-{rt.rank}").write_text(stop.signal_name or "another rank's")
            stop.exit()
        time.sleep(0.02)
    sys.exit(1)
