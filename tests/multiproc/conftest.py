"""Fixtures shared by the multi-process tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def example_data(tmp_path_factory) -> str:
    """One $GPUSCALE_DATA for the whole session: each example generates its offline data there once (dogs vs cats'
    images, the ViT's gratings, GPT-neo's tokenizer and chunks), under a name that carries the generator's version
    and settings, and every later run of any test file reuses it (about 30 s per example saved per file)."""
    return str(tmp_path_factory.mktemp("gpuscale-data"))
