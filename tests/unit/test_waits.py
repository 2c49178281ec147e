"""byteps_thc.waits: a worker logs the push_pulls it has waited on for BYTEPS_THC_STALL_WARN s."""
import io

from byteps_thc.waits import OpenWaitsLog, WaitLog, watch_fork_waits


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


def test_open_waits_of_the_fork_are_logged_once_each_when_old_enough():
    out = io.StringIO()
    listed = [[(3, 59.0, "Gradient.dense/kernel"), (4, 1.0, "Parameter.dense/bias")]]
    log = OpenWaitsLog(lambda: listed[0], rank=lambda: 1, warn_s=60, out=out)
    assert log.check() == 0 and out.getvalue() == ""
    listed[0] = [(3, 61.0, "Gradient.dense/kernel"), (4, 3.0, "Parameter.dense/bias")]
    assert log.check() == 1
    listed[0] = [(3, 62.0, "Gradient.dense/kernel"), (4, 60.5, "Parameter.dense/bias")]
    assert log.check() == 1                  # id 3 was logged already; id 4 is now old enough
    text = out.getvalue()
    assert "worker 1 has waited 61 s" in text and "'Gradient.dense/kernel'" in text
    assert "worker 1 has waited 60 s" in text and "'Parameter.dense/bias'" in text
    assert "BYTEPS_THC_STALL_WARN=60" in text
    listed[0] = []                           # both done: forgotten
    assert log.check() == 0
    listed[0] = [(5, 70.0, "Gradient.dense/kernel")]   # the same tensor waits again: a new wait
    assert log.check() == 1 and out.getvalue().count("'Gradient.dense/kernel'") == 2


def test_open_waits_off_at_zero():
    log = OpenWaitsLog(lambda: [(0, 1e6, "x")], rank=lambda: 0, warn_s=0, out=io.StringIO())
    assert log.check() == 0 and log.start()._thread is None


def test_fork_waits_are_watched_once_per_plugin_and_not_without_a_list():
    class Lib:
        def __init__(self, plugin, waits):
            self.plugin, self.waits, self.calls = plugin, waits, 0

        def open_waits(self):
            self.calls += 1
            return self.waits

    first = watch_fork_waits(Lib("test-a", []), lambda: 0)
    assert isinstance(first, OpenWaitsLog)
    again = Lib("test-a", [])
    assert watch_fork_waits(again, lambda: 0) is first and again.calls == 0
    assert watch_fork_waits(Lib("test-b", None), lambda: 0) is None  # a build without the list
