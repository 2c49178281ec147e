"""byteps_thc.waits: a worker logs the push_pulls it has waited on for BYTEPS_THC_STALL_WARN s."""
import io

from byteps_thc.waits import WaitLog


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_a_long_wait_is_logged_once_with_tensor_and_rank():
    clock, out = Clock(), io.StringIO()
    log = WaitLog(warn_s=60, out=out, clock=clock)
    with log.waiting("Gradient.fc.weight", 1):
        clock.t += 59
        assert log.check() == 0 and out.getvalue() == ""
        clock.t += 2
        assert log.check() == 1
        clock.t += 100
        assert log.check() == 0          # once per wait
    text = out.getvalue()
    assert "worker 1 has waited 61 s" in text and "'Gradient.fc.weight'" in text
    assert "BYTEPS_THC_STALL_WARN=60" in text


def test_finished_waits_are_forgotten_and_zero_turns_it_off():
    clock, out = Clock(), io.StringIO()
    log = WaitLog(warn_s=5, out=out, clock=clock)
    with log.waiting("a", 0):
        pass
    clock.t += 10
    assert log.check() == 0
    off = WaitLog(warn_s=0, out=out, clock=clock)
    with off.waiting("b", 0):
        clock.t += 1000
        assert off.check() == 0
    assert out.getvalue() == ""
