"""The THC comm hook's pipeline thread (byteps_thc/ddp/hook.py, `_Pipeline`) and its stop at exit.

The rounds are generators that yield collectives; these need no process group, so the thread is
driven here with rounds that yield nothing. What is checked is the exit rule: the atexit handler
joins every pipeline thread that has not ended, including one that already took its stop and is
still releasing its last future (the release of a future's value runs in that thread; a thread
not joined then is ended by the interpreter's finalization, which aborts the process).
"""
import threading

import torch

from byteps_thc.ddp import hook

WAIT_S = 30.0


def _round(value):
    """A round with no collective: returns its value at once."""
    return value
    yield  # a generator


class _SlowRelease:
    """A value whose release takes a while, and says when it began."""

    def __init__(self, began: threading.Event, seconds: float):
        self.began, self.seconds = began, seconds

    def __del__(self):
        self.began.set()
        threading.Event().wait(self.seconds)


def _thread_of(pipeline):
    (thread,) = [t for t, q in hook._LIVE.items() if q is pipeline._queue]
    return thread


def test_rounds_complete_in_order_of_submission():
    p = hook._Pipeline()
    thread = _thread_of(p)
    futs = [p.submit(_round(torch.tensor([float(k)])), last=(k == 2)) for k in range(3)]
    assert [f.wait().item() for f in futs] == [0.0, 1.0, 2.0]
    hook._stop_pipelines()
    assert not thread.is_alive()


def test_exit_joins_a_thread_that_is_still_releasing_its_last_future():
    p = hook._Pipeline()
    thread = _thread_of(p)
    began = threading.Event()
    fut = p.submit(_round(_SlowRelease(began, 1.0)), last=True)
    fut.wait()
    del fut  # the thread now holds the last reference to the future and its value
    del p    # the state was dropped: the thread takes its stop and releases its frame
    assert began.wait(WAIT_S), "the pipeline thread did not release its last future"
    assert thread.is_alive()  # inside that release
    hook._stop_pipelines()
    assert not thread.is_alive()
