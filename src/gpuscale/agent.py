"""``python -m gpuscale.agent TORCHRUN_ARGS``: the stable name of gpuscale's torchrun (`gpuscale.launch.agent`).

Batch scripts call it by this name on each node in torchrun mode, and find it as the file agent.py beside
gpuscale's ``__init__`` (a job Python whose gpuscale lacks it gets plain torchrun): scripts rendered by any
version, and kept by their users, keep working when the code behind it moves.
"""

import sys

from gpuscale.base.quickexit import skip_final_collection
from gpuscale.launch.agent import main

if __name__ == "__main__":
    skip_final_collection()  # the agent imported torch: its exit skips the last garbage collection
    sys.exit(main())
