"""Unit tests for gpuscale.detect.log: rank 0 talks, every rank warns (tagged), progress on rank 0 only."""

from __future__ import annotations

import io
import logging
import os

import pytest

import gpuscale.detect.log as glog
from gpuscale.detect.log import configure_logging, current_rank, get_logger, print0, progress

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID",
               "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    """No launcher variables, no placement from init(), and the placement reset afterwards."""
    for name in list(os.environ):
        if name.startswith("SLURM_") or name in LAUNCH_VARS:
            monkeypatch.delenv(name)
    monkeypatch.setattr(glog, "_placement", None)
    root = logging.getLogger(glog.ROOT)
    level = root.level
    yield monkeypatch
    glog._placement = None
    root.setLevel(level)


@pytest.fixture
def log_stream(monkeypatch):
    """Where the gpuscale handler writes, for this test only."""
    glog._root_logger()
    handler = next(h for h in logging.getLogger(glog.ROOT).handlers if getattr(h, "_gpuscale", False))
    buf = io.StringIO()
    monkeypatch.setattr(handler, "stream", buf)
    return buf


def torchrun_env(monkeypatch, rank, world):
    for name, value in {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": world,
                        "GROUP_RANK": 0, "TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": 29400}.items():
        monkeypatch.setenv(name, str(value))


# --------------------------------------------------------------------------------------------------
# current_rank


def test_current_rank_plain_process():
    assert current_rank() == (0, 1)


def test_current_rank_from_launcher_environment(clean):
    torchrun_env(clean, 3, 4)
    assert current_rank() == (3, 4)


def test_current_rank_from_configure_logging_wins_over_environment(clean):
    torchrun_env(clean, 3, 4)
    configure_logging(1, 2)
    assert current_rank() == (1, 2)


# --------------------------------------------------------------------------------------------------
# progress


def test_progress_rank0_writes_lines_to_a_log_file(monkeypatch):
    clock = iter(range(0, 10_000, 10))  # each reading of the clock is 10 s later
    monkeypatch.setattr("gpuscale.detect.log.time.perf_counter", lambda: next(clock))
    stream = io.StringIO()
    items = list(progress(range(100), desc="epoch 1", stream=stream))
    assert items == list(range(100))
    lines = stream.getvalue().splitlines()
    # 100 items, 10 s apart: a line every 30 s (about every third item), not one per item
    assert 25 <= len(lines) <= 40
    assert all(line.startswith("epoch 1") for line in lines)
    assert "100/100" in lines[-1]
    assert "\r" not in stream.getvalue()  # not a terminal: no redraws


def test_progress_in_a_log_file_writes_one_line_for_a_quick_pass():
    stream = io.StringIO()
    list(progress(range(100), desc="epoch 1", stream=stream))
    assert stream.getvalue().count("\n") == 1


def test_progress_of_a_pass_resumed_part_way_counts_the_batches_before_it():
    """An epoch resumed after 12 of its 16 batches: the line ends at 16/16, not 4/16 (as if it stopped early)."""
    stream = io.StringIO()
    list(progress(range(4), desc="epoch 2/4", total=16, stream=stream, initial=12))
    assert stream.getvalue().startswith("epoch 2/4 16/16 ")


def test_progress_rank1_is_silent_but_iterates(clean):
    torchrun_env(clean, 1, 2)
    stream = io.StringIO()
    assert list(progress(range(100), desc="epoch 1", stream=stream)) == list(range(100))
    assert stream.getvalue() == ""


def test_progress_rank1_from_configure_logging_is_silent():
    configure_logging(1, 2)
    stream = io.StringIO()
    assert list(progress(range(10), stream=stream)) == list(range(10))
    assert stream.getvalue() == ""


def test_progress_rank0_from_configure_logging_talks():
    configure_logging(0, 2)
    stream = io.StringIO()
    list(progress(range(10), desc="eval", stream=stream))
    assert "10/10" in stream.getvalue()


def test_progress_without_length_counts():
    stream = io.StringIO()
    assert list(progress(iter(range(7)), desc="d", stream=stream)) == list(range(7))
    assert stream.getvalue().splitlines()[-1].startswith("d 7 ")


def test_progress_postfix_is_shown():
    stream = io.StringIO()
    bar = progress(range(3), desc="train", stream=stream)
    for _ in bar:
        bar.postfix["loss"] = 0.3125
    assert "loss=0.3125" in stream.getvalue().splitlines()[-1]


def test_progress_on_a_terminal_redraws_one_line():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    list(progress(range(5), desc="x", total=5, stream=stream))
    out = stream.getvalue()
    assert out.startswith("\r") and out.endswith("\n")
    assert out.count("\n") == 1
    assert "[####################] 5/5" in out


def test_progress_empty_iterable():
    stream = io.StringIO()
    assert list(progress([], desc="none", stream=stream)) == []
    assert stream.getvalue().count("\n") == 1


# --------------------------------------------------------------------------------------------------
# print0


def test_print0_on_rank0(capsys):
    configure_logging(0, 2)
    print0("hello", 42)
    assert capsys.readouterr().out == "hello 42\n"


def test_print0_on_rank1_prints_nothing(capsys):
    configure_logging(1, 2)
    print0("hello")
    assert capsys.readouterr().out == ""


def test_print0_reads_the_launcher_environment(clean, capsys):
    torchrun_env(clean, 1, 2)
    print0("hello")
    assert capsys.readouterr().out == ""
    torchrun_env(clean, 0, 2)
    print0("hello")
    assert capsys.readouterr().out == "hello\n"


def test_print0_passes_print_arguments(capsys):
    print0("a", "b", sep="-", end="!")
    assert capsys.readouterr().out == "a-b!"


# --------------------------------------------------------------------------------------------------
# logger


def test_info_on_rank0_only(log_stream):
    log = get_logger("train")
    configure_logging(0, 2)
    log.info("epoch %d", 1)
    configure_logging(1, 2)
    log.info("epoch %d", 2)
    assert log_stream.getvalue() == "[gpuscale] epoch 1\n"


def test_warnings_on_every_rank_tagged_with_rank_and_host(log_stream):
    log = get_logger("train")
    for rank in range(2):
        configure_logging(rank, 2)
        log.warning("loss is %s", "NaN")
    lines = log_stream.getvalue().splitlines()
    assert len(lines) == 2
    for rank, line in enumerate(lines):
        assert line.startswith(f"[gpuscale] WARNING [rank {rank}/2 {glog._HOST}]")
        assert line.endswith("loss is NaN")


def test_errors_on_every_rank_tagged(log_stream):
    configure_logging(3, 8)
    get_logger().error("out of memory")
    assert log_stream.getvalue().startswith("[gpuscale] ERROR [rank 3/8 ")


def test_warning_of_a_single_process_is_not_tagged(log_stream):
    configure_logging(0, 1)
    get_logger("x").warning("careful")
    assert log_stream.getvalue() == "[gpuscale] WARNING careful\n"


def test_warning_tag_from_launcher_environment(clean, log_stream):
    torchrun_env(clean, 1, 2)
    get_logger("x").warning("w")
    assert "[rank 1/2 " in log_stream.getvalue()


def test_one_handler_however_often_configured(log_stream):
    for _ in range(3):
        configure_logging(0, 1)
        get_logger("a")
    handlers = [h for h in logging.getLogger(glog.ROOT).handlers if getattr(h, "_gpuscale", False)]
    assert len(handlers) == 1
    get_logger("a").info("once")
    assert log_stream.getvalue().count("once") == 1


def test_exception_is_logged_with_traceback(log_stream):
    configure_logging(0, 1)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        get_logger().exception("failed")
    out = log_stream.getvalue()
    assert "failed" in out and "RuntimeError: boom" in out


def test_logging_survives_a_malformed_rank_variable(clean, log_stream):
    clean.setenv("RANK", "abc")
    get_logger("x").warning("the environment is broken")
    print0("still here")
    assert "the environment is broken" in log_stream.getvalue()
