"""Fixtures of the unit tests."""

import logging
import os

import pytest
import torch
from hypothesis import settings

import gpuscale
import gpuscale.detect.log

# In CI the property tests draw the same examples every run: a red CI then always means the code, never the dice.
# Locally they stay random, to keep finding new cases.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                 "TORCHELASTIC_RUN_ID", "GROUP_RANK", "OMP_NUM_THREADS", "TOKENIZERS_PARALLELISM",
                 "GPUSCALE_BIND", "GPUSCALE_TIMEOUT", "GPUSCALE_OMP_FROM_LAUNCHER", "GPUSCALE_LAUNCH_TIME",
                 "LOCAL_SIZE")


@pytest.fixture
def single_process(monkeypatch):
    """A plain single process: no launcher or SLURM variables; affinity, threads and the placement log restored after."""
    for name in list(os.environ):
        if name in LAUNCHER_VARS or name.startswith("SLURM_"):
            monkeypatch.delenv(name)
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    yield
    os.sched_setaffinity(0, affinity)
    torch.set_num_threads(threads)
    gpuscale.detect.log._placement = None


@pytest.fixture
def warnings_seen():
    """gpuscale's warnings, as messages (its logger does not propagate to pytest's caplog)."""
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("gpuscale")
    logger.addHandler(handler)
    yield seen
    logger.removeHandler(handler)
