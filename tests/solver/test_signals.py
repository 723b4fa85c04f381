"""The signal handler only records; the solver asks for the action between iterations."""
import os
import signal

import pytest

from caffe_py.solver.signals import SignalHandler


def test_signals_map_to_effects_once_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGHUP)
    with SignalHandler("stop", "snapshot") as handler:
        assert handler.requested_action() == "none"
        os.kill(os.getpid(), signal.SIGHUP)
        assert handler.requested_action() == "snapshot"
        assert handler.requested_action() == "none"
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGINT)
        assert handler.requested_action() == "stop"  # SIGINT is checked first, as Caffe
        assert handler.requested_action() == "snapshot"
    assert signal.getsignal(signal.SIGHUP) is before


def test_none_effect_ignores_the_signal():
    with SignalHandler("none", "none") as handler:
        os.kill(os.getpid(), signal.SIGINT)
        assert handler.requested_action() == "none"


def test_unknown_effect_is_rejected():
    with pytest.raises(ValueError, match="signal effect 'halt'"):
        SignalHandler("halt")
