"""gpuscale.StopSignal in one process: a signal becomes a stop request, exit() is a clean exit 75, handlers come back."""

import os
import signal

import pytest

import gpuscale
from gpuscale.preempt import EXIT_STOPPED, Stopped


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
    assert signal.getsignal(sig) == before  # the previous handler is back


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
