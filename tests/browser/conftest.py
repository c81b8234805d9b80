"""A real headless Chromium for the browser tests, driven by playwright's sync API.

The session fixture uses Debian's Chromium (/usr/bin/chromium, or $GPUSCALE_CHROMIUM). Where it
is missing and this is root, scripts/install-browser.sh installs it (apt-get). Where it still is
missing, or the playwright package is not importable, the browser tests are skipped with the
reason, except under CI (CI=true), where browser tests must run: there they fail instead.

The machine may have no network: the launch flags keep Chromium from reaching for it (updates,
sync, field trials), and pages must not need it either.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "scripts" / "install-browser.sh"
CHROMIUM = Path(os.environ.get("GPUSCALE_CHROMIUM", "/usr/bin/chromium"))
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"browser tests must run in CI, but: {reason}")
    pytest.skip(reason)


def _runs(path: Path) -> bool:
    try:
        return subprocess.run([str(path), "--version"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def chromium() -> Path:
    """The Chromium executable, installed by scripts/install-browser.sh when missing and root."""
    if not _runs(CHROMIUM):
        if os.geteuid() != 0:
            _unavailable(f"{CHROMIUM} is missing and installing it needs root (scripts/install-browser.sh)")
        result = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=900)
        if result.returncode != 0:
            _unavailable(f"scripts/install-browser.sh failed: {(result.stderr or result.stdout).strip().splitlines()[-1:]}")
    if not _runs(CHROMIUM):
        _unavailable(f"{CHROMIUM} does not run after scripts/install-browser.sh")
    return CHROMIUM


@pytest.fixture(scope="session")
def browser(chromium: Path) -> Iterator[Any]:
    """A headless playwright Browser on that Chromium, for the whole session."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as e:
        _unavailable(f"playwright is not importable ({e}); pip install -e '.[test]'")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium), args=ARGS, headless=True, timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Page:
    """A fresh page and what it reported: console errors, uncaught exceptions, requests, dialogs."""
    page: Any
    errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)


@pytest.fixture
def page(browser: Any) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(30_000)
    seen = Page(context.new_page())
    seen.page.on("console", lambda m: seen.errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    seen.page.on("pageerror", lambda e: seen.errors.append(f"page error: {e}"))
    seen.page.on("request", lambda r: seen.requests.append(r.url))
    seen.page.on("dialog", lambda d: (seen.dialogs.append(d.message), d.dismiss()))
    try:
        yield seen
    finally:
        context.close()
