"""What every verb of the `gpuscale` command shares: its parser, made the same way for all of them."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["verb_parser"]


def verb_parser(subparsers: Any, name: str, help: str, description: str | None, epilog: str | None) -> argparse.ArgumentParser:
    """The sub-parser of verb `name`: its one-line help in `gpuscale --help`, its module docstring as the
    description and its examples as the epilog, both printed as written."""
    return subparsers.add_parser(name, help=help, description=description, epilog=epilog,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
