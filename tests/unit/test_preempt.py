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


def test_every_k_checks_only_every_kth_call():
    with gpuscale.init(show_placement=False):
        with gpuscale.StopSignal(every=3) as stop:
            os.kill(os.getpid(), signal.SIGUSR1)
            assert [stop.requested() for _ in range(4)] == [False, False, True, True]
        with pytest.raises(ValueError, match="every=0 must be at least 1"):
            gpuscale.StopSignal(every=0)
