"""What every verb of the `gpuscale` command shares: the table of verbs and their parser, made the same way.

The table names each verb's module and its one-line help, so that `gpuscale --help` lists every verb
and `gpuscale VERB ...` imports that verb's module alone: a verb that does not train or measure
(`lint`, `slurm`, `profiles`, `report`, `predict`) answers without importing torch.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["VERBS", "verb_parser"]

VERBS: dict[str, tuple[str, str]] = {  # name: (module, help), in the order `gpuscale --help` lists them
    "demo": ("gpuscale.cli.demo", "a weak and strong scaling study of the dogs-vs-cats example, here"),
    "run": ("gpuscale.cli.run", "launch a script on all GPUs/cores of this node (or of many nodes)"),
    "env": ("gpuscale.cli.env", "show the detected environment and where every rank runs"),
    "doctor": ("gpuscale.cli.doctor", "preflight checks: placement, software, environment, network, all-reduce bandwidth"),
    "study": ("gpuscale.cli.study", "run a script on 1..N devices, weak and strong; table, report and prediction"),
    "report": ("gpuscale.cli.report", "table, report.md, report.html and plots of a study"),
    "predict": ("gpuscale.cli.predict", "predict throughput and efficiency on N devices from a 1-device run"),
    "slurm": ("gpuscale.cli.slurm", "SLURM batch scripts for a cluster profile"),
    "profiles": ("gpuscale.cli.profiles", "list cluster profiles or show one"),
    "consolidate": ("gpuscale.cli.consolidate", "turn a (sharded) checkpoint into one plain state dict"),
    "lint": ("gpuscale.cli.lint", "find multi-GPU mistakes in training scripts (statically)"),
}


def verb_parser(subparsers: Any, name: str, description: str | None, epilog: str | None) -> argparse.ArgumentParser:
    """The sub-parser of verb `name`: its one-line help (from VERBS) in `gpuscale --help`, its module
    docstring as the description and its examples as the epilog, both printed as written."""
    return subparsers.add_parser(name, help=VERBS[name][1], description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
