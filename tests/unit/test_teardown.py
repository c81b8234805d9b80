"""gpuscale.runtime.teardown's count of ranks at exit, in a store (torch's HashStore standing in for the group's), for
a world of two: the other rank's arrival is played by a thread or left out."""

from __future__ import annotations

import threading
import time

import pytest
import torch.distributed as dist

from gpuscale.runtime import teardown


@pytest.fixture
def store(monkeypatch):
    shared = dist.HashStore()
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: shared)
    monkeypatch.setattr(dist, "get_world_size", lambda *a, **k: 2)
    return shared


def test_the_wait_ends_when_the_other_rank_arrives(store):
    threading.Timer(0.3, lambda: store.add(teardown.AT_EXIT_KEY, 1)).start()
    started = time.monotonic()
    assert teardown.all_ranks_at_exit(5.0)
    assert 0.25 < time.monotonic() - started < 3


def test_a_rank_still_busy_ends_the_wait_at_the_timeout(store):
    started = time.monotonic()
    assert not teardown.all_ranks_at_exit(0.5)
    assert 0.45 < time.monotonic() - started < 3


def test_a_rank_that_failed_ends_the_wait_at_once(store):
    store.add(teardown.FAILED_KEY, 1)
    started = time.monotonic()
    assert not teardown.all_ranks_at_exit(5.0)
    assert time.monotonic() - started < 1


def test_an_earlier_groups_count_lets_no_rank_through_early(store):
    """Two ranks of an earlier group on the same store counted 2: this rank's 3 belongs to the next generation, so it
    waits for the other rank of its own group (a count alone, 3 of 2, would have let it through at once)."""
    store.add(teardown.AT_EXIT_KEY, 2)
    threading.Timer(0.3, lambda: store.add(teardown.AT_EXIT_KEY, 1)).start()
    started = time.monotonic()
    assert teardown.all_ranks_at_exit(5.0)
    assert time.monotonic() - started > 0.25
