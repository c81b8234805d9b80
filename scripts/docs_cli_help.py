"""mkdocs hook: docs/cli.md's `<!-- cli-help -->` becomes the `--help` of `gpuscale` and of every verb and sub-verb,
from the command's own parser (`gpuscale.cli.build_parser`), so the manual's command line is the one installed."""

from __future__ import annotations

import argparse
import os
from typing import Any

from gpuscale.cli import build_parser

MARKER = "<!-- cli-help -->"


def _commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(words, parser) for the command and each verb below it, depth first, in the order the help lists them."""
    found = [(words, parser)]
    for action in parser._actions:  # argparse keeps its sub-commands here; it has no public accessor
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*words, name))
    return found


def cli_help_markdown() -> str:
    """One section per command: its name as the heading, its --help as a text block."""
    os.environ["COLUMNS"] = "110"  # argparse wraps at the terminal's width: the same width on every machine
    sections = []
    for words, parser in _commands(build_parser("*")):
        title = " ".join(("gpuscale", *words))
        sections.append(f"## {title}\n\n```text\n{parser.format_help().rstrip()}\n```\n")
    return "\n".join(sections)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    return markdown.replace(MARKER, cli_help_markdown()) if MARKER in markdown else markdown
