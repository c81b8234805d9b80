"""Paths and readers shared by the SLURM tests (the fixture that starts the cluster is in conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"
EXAMPLE = ROOT / "examples" / "dogs_vs_cats.py"


def read_ranks(directory: Path) -> list[dict]:
    """The rank*.json reports the probe script wrote, in rank order."""
    return sorted((json.loads(p.read_text()) for p in directory.glob("rank*.json")), key=lambda r: r["rank"])
