"""`gpuscale lint SCRIPT...`: find the classic multi-GPU mistakes in training scripts, before they run.

The scripts are read, never run or imported. A script that runs as several processes (it starts
a process group, wraps its model in DDP, FSDP or DeepSpeed, or uses gpuscale or Accelerate) is
checked for the mistakes that make N GPUs train wrong or slow:

    GS101  DataLoader without a DistributedSampler (every rank reads the whole dataset)
    GS102  DistributedSampler, set_epoch() never called (the same shuffle every epoch)
    GS103  print() on every rank              GS104  INFO logging on every rank
    GS105  torch.save / save_pretrained on every rank
    GS106  the DDP wrapper's state_dict() saved ('module.' keys)
    GS107  accuracy of one rank's shard, never reduced over ranks
    GS108  parameters unfrozen after the model was wrapped (gradients never synchronised)
    GS109  batch // world_size (the remainder silently dropped)
    GS110  hard-coded MASTER_PORT             GS111  hard-coded GPU index ("cuda:0")
    GS112  init_process_group() without destroy_process_group()
    GS113  DeepSpeed config batch sizes that disagree with the DataLoader
    GS114  random_split / shuffle unseeded (or seeded per rank) before sharding: validation leaks into training
    GS115  a function run by mp.spawn reads a global set only under if __name__ == "__main__"
    GS116  .cuda() / "cuda" with no torch.cuda.set_device: every rank of the node on GPU 0

Each finding prints as `path:line:col: GS1xx what is wrong`, then why it matters and the fix (the
gpuscale call that does it right). Folders are linted recursively (*.py).

Silence a finding with a comment on its line (or on any line of its statement):
`# gpuscale: ignore[GS103]` (ids comma separated), or `# gpuscale: ignore` for every rule there.

Exit code: 0 no findings, 1 findings, 2 bad input (a missing file, not Python, a syntax error). A
file that cannot be parsed is reported on stderr and the other files are still linted (and their
findings printed); the exit code is then 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gpuscale.cli.verbs import verb_parser
from gpuscale.lint import RULE_IDS, format_findings, lint_paths, select_rules

EPILOG = """examples:
  gpuscale lint train.py
  gpuscale lint examples/ --format json
  gpuscale lint train.py --ignore GS103,GS104
  gpuscale lint train.py --select GS101,GS102
"""


def _ids(text: str) -> list[str]:
    return [part for part in text.split(",") if part.strip()]


def add_parser(subparsers: Any) -> None:
    parser = verb_parser(subparsers, "lint", __doc__, EPILOG)
    parser.add_argument("paths", nargs="+", metavar="SCRIPT", help="training scripts or folders of them")
    parser.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or a JSON list of findings")
    parser.add_argument("--select", type=_ids, default=None, metavar="IDS",
                        help=f"only these rules, comma separated ({RULE_IDS[0]}..{RULE_IDS[-1]})")
    parser.add_argument("--ignore", type=_ids, default=None, metavar="IDS", help="skip these rules, comma separated")
    parser.set_defaults(func=run)


def _not_checked(skipped: list[str]) -> str:
    """What the summary line adds for scripts named on the command line that lint did not check (a folder's helper
    modules are no training scripts): their names (a few), and why."""
    if not skipped:
        return ""
    names = ", ".join(skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
    return (f"; not checked: {names} (no sign of running as several processes: no process group, DDP/FSDP/DeepSpeed, "
            "gpuscale, Accelerate, HF or Lightning Trainer, or RANK/WORLD_SIZE read; see docs/lint.md)")


def run(args: argparse.Namespace) -> int:
    rules = select_rules(args.select, args.ignore)
    errors: list[str] = []  # files that cannot be parsed: reported, the others still linted
    skipped: list[str] = []  # scripts with no sign of several processes: not checked
    findings = lint_paths(args.paths, rules, errors=errors, skipped=skipped)
    for error in errors:
        print("gpuscale lint: error: " + error.replace("\r", "\\r").replace("\n", "\\n"), file=sys.stderr)
    if args.format == "json":
        print(json.dumps([f.as_dict() for f in findings], indent=2))
    else:
        for line in format_findings(findings):
            print(line)
        files = len({f.path for f in findings})
        unread = f" ({len(errors)} file(s) not linted: above)" if errors else ""
        named = [path for path in skipped if Path(path).resolve() in {Path(given).resolve() for given in args.paths}]
        print((f"{len(findings)} finding(s) in {files} file(s)" if findings else "no findings") + unread + _not_checked(named))
    if errors:
        return 2
    return 1 if findings else 0
