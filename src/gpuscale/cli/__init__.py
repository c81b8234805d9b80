"""The `gpuscale` command. One module per verb, each with `add_parser(subparsers)` and `run(args) -> int`.

Only the verb typed is imported (`gpuscale.cli.verbs.VERBS` names each verb's module and help line):
`gpuscale --help`, `lint`, `slurm ...`, `profiles`, `report` and `predict` load no torch and answer at
once; `run`, `study`, `doctor` and the other verbs that train or measure import what they need.

Mistakes in what the user typed end in one line on stderr and exit code 2, never a traceback.
Whatever the user's umask, nothing a verb writes (or the processes it starts write) is
world-writable: `main` tightens the umask first (`gpuscale.base.files.tighten_umask`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import select
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from gpuscale._version import __version__
from gpuscale.base.files import tighten_umask
from gpuscale.base.quickexit import skip_final_collection
from gpuscale.cli.verbs import VERBS
from gpuscale.slurm.jobs import SlurmError
from gpuscale.study.linkmeasure import MeasureError

EPILOG = """examples:
  gpuscale demo                                              # weak and strong scaling of an example, here
  gpuscale study --nproc 1,2 --out runs/study -- examples/dogs_vs_cats.py --epochs 2
  gpuscale report runs/study
  gpuscale predict runs/study/weak-1x1 --profile lumi-g --nproc 1,2,4,8 --nodes 1,2
  gpuscale run --nproc-per-node 2 examples/dogs_vs_cats.py --out runs/dvc
  gpuscale run --nproc-per-node 2 -m gpuscale env
  gpuscale env --json
  gpuscale run --nproc-per-node 2 -m gpuscale doctor           # placement, versions, all-reduce bandwidth
  gpuscale slurm script --profile lumi-g --account project_465000 --container $SIF --mode srun -- train.py
  gpuscale profiles lumi-g
  gpuscale consolidate runs/mine/checkpoints/step-000001000 model.pt
  gpuscale lint train.py                                     # multi-GPU mistakes in a training script
"""


def one_line(message: str) -> str:
    """An error message on one line, even where it quotes a value or path with a line break as it was typed."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line that names the fix; `verb`: the verb typed, whose help an
    unrecognized argument (found by the top-level parser, after the verb's) points to."""

    verb: str | None = None

    def error(self, message: str) -> NoReturn:
        prog = f"{self.prog} {self.verb}" if self.verb and message.startswith("unrecognized arguments") else self.prog
        self.exit(2, f"{prog}: error: {one_line(message)} (see '{prog} --help')\n")


def _verb_words(argv: Sequence[str]) -> str | None:
    """The verb typed, with its action for `gpuscale slurm` ("slurm submit"), for an error's pointer to its help."""
    verb = verb_in(argv)
    if verb not in VERBS:
        return None
    action = verb_in(argv[list(argv).index(verb) + 1:]) if verb == "slurm" else None
    return f"{verb} {action}" if action and action.isidentifier() else verb


def _reader_gone() -> bool:
    """Whether standard output is a pipe whose reader has closed it (poll says POLLERR on the writing end)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError, AttributeError):  # no poll here, or stdout closed or replaced
        return False


def verb_in(argv: Sequence[str]) -> str | None:
    """The verb of a command line: its first word that is not an option (the top-level parser's only
    options, -h and --version, take no value), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(verb: str | None = "*") -> Parser:
    """The parser of the `gpuscale` command: verb `verb` in full (its module imported), every other one
    as its help line only; "*" builds every verb in full (tests, documentation)."""
    parser = Parser(
        prog="gpuscale",
        description="Run one PyTorch training script unchanged from 1 CPU to all GPUs of many nodes, "
        "placed correctly, and measure how much faster it got.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuscale {__version__}")
    subparsers = parser.add_subparsers(dest="verb", metavar="VERB")
    for name, (module, help) in VERBS.items():
        if verb in (name, "*"):
            importlib.import_module(module).add_parser(subparsers)
        else:
            subparsers.add_parser(name, help=help, add_help=False)  # listed; never parsed, since it is not the verb typed
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(verb_in(argv))
    parser.verb = _verb_words(argv)
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    old_umask = tighten_umask()
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError as exc:
        if not _reader_gone():  # another pipe (a socket, a subprocess's): an error like any other
            print(f"gpuscale {parser.verb or args.verb}: error: {one_line(str(exc))}", file=sys.stderr)
            return 2
        # the reader of the output left (`gpuscale report runs/x | head -1`): end as a Unix tool that SIGPIPE ends
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush must not raise again
        return 128 + signal.SIGPIPE
    except (ValueError, OSError, SlurmError, MeasureError) as exc:  # bad input, an unreadable path, SLURM said no
        print(f"gpuscale {parser.verb or args.verb}: error: {one_line(str(exc))}", file=sys.stderr)  # "slurm submit": the action too
        return 2
    finally:
        os.umask(old_umask)  # main() is also called in-process (tests, scripts)


def console() -> int:
    """The `gpuscale` command and `python -m gpuscale`: `main` in a process of its own, whose exit skips the last
    garbage collection (`gpuscale.base.quickexit`: most of a second after a verb that imported torch)."""
    skip_final_collection()
    return main()


if __name__ == "__main__":
    sys.exit(console())
