"""The timeout `gpuscale run --timeout` asks for reaches a process group the script starts itself."""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist
from torch.distributed import distributed_c10d

from gpuscale.runtime import collective_timeout


@pytest.fixture
def calls(monkeypatch):
    """torch's init_process_group replaced by a recorder of what it was called with (restored after)."""
    seen: list[tuple[tuple, dict]] = []

    def record(*args, **kwargs):
        seen.append((args, kwargs))

    monkeypatch.setattr(distributed_c10d, "init_process_group", record)
    monkeypatch.setattr(dist, "init_process_group", record)
    return seen


def _timeout(call):
    args, kwargs = call
    return args[2] if len(args) >= 3 else kwargs.get("timeout")


def test_torchs_default_however_a_script_passes_it_becomes_the_requested_timeout(calls, capsys):
    assert collective_timeout.use_requested_timeout({"GPUSCALE_TIMEOUT": "12.5", "RANK": "0"}) == 12.5
    thirty_minutes = datetime.timedelta(minutes=30)
    dist.init_process_group("gloo")  # the DDP tutorial: torch's default
    dist.init_process_group(backend="gloo", timeout=thirty_minutes)  # Lightning and the Trainer: 30 minutes, by keyword
    distributed_c10d.init_process_group("gloo", "env://", thirty_minutes, 2, 0)  # by position, through the module
    assert [_timeout(call) for call in calls] == [datetime.timedelta(seconds=12.5)] * 3
    assert calls[2][0][3:] == (2, 0) and calls[1][1]["backend"] == "gloo"  # the rest as the script gave it
    assert collective_timeout.use_requested_timeout({"GPUSCALE_TIMEOUT": "12.5"}) == 12.5  # once: not wrapped twice
    dist.init_process_group("gloo")
    assert len(calls) == 4 and capsys.readouterr().err == ""


def test_a_timeout_the_script_chose_itself_is_kept_and_rank_0_says_so(calls, capsys):
    """HF's ddp_timeout=7200 for a long tokenisation behind a barrier: shortening it would end a job that works."""
    collective_timeout.use_requested_timeout({"GPUSCALE_TIMEOUT": "300", "RANK": "0"})
    two_hours = datetime.timedelta(hours=2)
    dist.init_process_group(backend="nccl", timeout=two_hours)
    assert _timeout(calls[0]) == two_hours
    assert capsys.readouterr().err == ("gpuscale: the script's own collective timeout (2:00:00) is kept; GPUSCALE_TIMEOUT=300 s "
                                       "replaces torch's default only\n")


def test_without_a_request_nothing_changes(calls):
    original = dist.init_process_group
    assert collective_timeout.use_requested_timeout({}) is None
    assert dist.init_process_group is original


@pytest.mark.parametrize("text", ["soon", "0", "-3"])
def test_a_bad_request_is_named(text):
    with pytest.raises(ValueError, match=f"GPUSCALE_TIMEOUT='{text}' is not a positive number of seconds"):
        collective_timeout.requested_timeout_s({"GPUSCALE_TIMEOUT": text})
