"""gpuscale.StopSignal in one process: a signal becomes a stop request, exit() is a clean exit 75, handlers come back."""

import os
import signal

import pytest

import gpuscale
from gpuscale.train.preempt import EXIT_STOPPED, Stopped


@pytest.fixture(autouse=True)
def _single_process(single_process):
    """A plain single process (tests/unit/conftest.py)."""


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_a_signal_is_a_stop_request_and_exit_is_a_clean_75(sig, capfd):
    before = signal.getsignal(sig)
    with pytest.raises(SystemExit) as ended:
        with gpuscale.init(show_placement=False):
            with gpuscale.StopSignal() as stop:
                assert not stop.requested()
                os.kill(os.getpid(), sig)  # the process lives on: the handler only takes note
                assert stop.received and stop.requested() and stop.signal_name == sig.name
                stop.exit()
    assert isinstance(ended.value, Stopped) and ended.value.code == EXIT_STOPPED == 75
    err = capfd.readouterr().err
    assert f"rank 0 got {sig.name}" in err and "failed" not in err  # a requested stop is not reported as a failure
    # on its way out after the checkpoint, a late signal (torchrun's TERM, a warning handed on twice) does nothing
    assert signal.getsignal(sig) == signal.SIG_IGN
    os.kill(os.getpid(), sig)
    signal.signal(sig, before)


def test_closed_without_a_stop_the_previous_handlers_are_back():
    before = signal.getsignal(signal.SIGUSR1)
    with gpuscale.init(show_placement=False):
        with gpuscale.StopSignal():
            assert signal.getsignal(signal.SIGUSR1) != before
    assert signal.getsignal(signal.SIGUSR1) == before


def test_one_process_checks_its_own_flag_at_every_call():
    """every=K spares ranks an all-reduce (tests/multiproc/test_stop_signal.py); alone, checking costs nothing."""
    with gpuscale.init(show_placement=False):
        with gpuscale.StopSignal(every=3) as stop:
            assert not stop.requested()
            os.kill(os.getpid(), signal.SIGUSR1)
            assert stop.requested()


@pytest.mark.parametrize("every, interval_s, message", [
    (0, 0.5, "every=0 must be 'auto' or at least 1"),
    ("often", 0.5, "every='often' must be 'auto' or at least 1"),
    (True, 0.5, "every=True must be 'auto' or at least 1"),
    ("auto", 0, "interval_s=0 must be a positive number of seconds"),
])
def test_bad_check_settings_are_refused(every, interval_s, message):
    with gpuscale.init(show_placement=False):
        with pytest.raises(ValueError, match=message):
            gpuscale.StopSignal(every=every, interval_s=interval_s)


def test_a_stop_signal_tells_the_batch_script_it_stops_at_a_checkpoint(tmp_path, monkeypatch):
    """The notes the batch script reads (slurm.stopping): the marker exists while a StopSignal handles the signals,
    and exit() leaves "stopped" beside it. An earlier attempt's "stopped" is gone once this attempt's StopSignal is
    made: a launcher must not take a later death for a stop."""
    marker = tmp_path / "stops-at-checkpoint"
    monkeypatch.setenv("GPUSCALE_STOP_MARKER", str(marker))
    (tmp_path / "stops-at-checkpoint.stopped").write_text("an earlier attempt's stop\n")  # torchrun restarted the group
    with pytest.raises(SystemExit) as ended:
        with gpuscale.init(show_placement=False):
            with gpuscale.StopSignal() as stop:
                assert marker.exists() and not (tmp_path / "stops-at-checkpoint.stopped").exists()
                os.kill(os.getpid(), signal.SIGUSR1)
                assert stop.requested()
                stop.exit()
    assert ended.value.code == EXIT_STOPPED
    assert (tmp_path / "stops-at-checkpoint.stopped").read_text() == "stopped at a checkpoint\n"
    assert not marker.exists(), "closed: the handlers are gone, so the batch script must keep USR1 to itself again"


def test_without_the_batch_scripts_folder_a_stop_signal_leaves_no_note(tmp_path, monkeypatch):
    """A rank on another node than the batch script's: the marker's folder is not there, and nothing fails."""
    monkeypatch.setenv("GPUSCALE_STOP_MARKER", str(tmp_path / "elsewhere" / "stops-at-checkpoint"))
    with gpuscale.init(show_placement=False):
        with gpuscale.StopSignal():
            pass
    assert not (tmp_path / "elsewhere").exists()
    monkeypatch.delenv("GPUSCALE_STOP_MARKER")
    with gpuscale.init(show_placement=False):
        with gpuscale.StopSignal():
            pass
    assert list(tmp_path.iterdir()) == []
