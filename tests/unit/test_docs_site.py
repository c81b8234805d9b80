"""The manual builds from docs/ and the docstrings with no warning (`mkdocs build --strict`), its API page documents
every public name of `gpuscale`, and its command-line page carries the help of every verb and sub-verb."""

from __future__ import annotations

import argparse
import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gpuscale
from gpuscale.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "WARNING" not in result.stderr, result.stderr[-3000:]
    return out


def test_the_api_page_documents_every_public_name(site):
    page = (site / "api" / "index.html").read_text()
    documented = set(re.findall(r'id="gpuscale\.([A-Za-z_][A-Za-z0-9_]*)"', page))
    assert set(gpuscale.__all__) - {"__version__"} <= documented, sorted(set(gpuscale.__all__) - documented)
    for name in ("StudySpec", "run_study", "analyse", "write_report"):
        assert re.search(rf'id="gpuscale\.study\.[a-z_.]*{name}"', page), name
    # the docstrings themselves, not only the names: each one's first line is on the page, as text
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", page)).split())
    for name in ("init", "Meter", "plan_batch", "scale_lr"):
        first = " ".join(getattr(gpuscale, name).__doc__.strip().splitlines()[0].split())
        assert re.sub(r"[`*]", "", first)[:50] in re.sub(r"[`*]", "", text), name


def _commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [words]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, (*words, name))
    return found


def test_the_command_line_page_has_every_verbs_help(site):
    page = html.unescape((site / "cli" / "index.html").read_text())
    commands = _commands(build_parser("*"))
    assert ("slurm", "submit") in commands and len(commands) > 10
    for words in commands:
        title = " ".join(("gpuscale", *words))
        assert f">{title}<" in page or f">{title}\n" in page, title
        assert f"usage: {title}" in page, title
