"""What the failure workers share (tf_failures.py, mxnet_failures.py, tf_stall.py, mxnet_stall.py):
an expected error is caught and its text written where the test reads it,
OUT_DIR/<style>_<rank>.txt."""
import os


def catcher(out_dir, rank, errors, text=str):
    """caught(style, body): runs body(); an exception of `errors` is caught, "<class>: text(e)"
    written to OUT_DIR/<style>_<rank>.txt, and the result is True; no exception: False; any other
    exception propagates (the worker fails)."""
    def caught(style, body):
        try:
            body()
        except errors as e:
            with open(os.path.join(out_dir, f"{style}_{rank}.txt"), "w") as f:
                f.write(f"{type(e).__name__}: {text(e)}")
            return True
        return False
    return caught


def fail_cluster_twice(rank, delay, push, fail_cluster, cluster_failure, caught, out_dir):
    """The stall scripts' failure half (tf_stall.py, mxnet_stall.py): worker 0 pushes a tensor
    that worker 1 never pushes and fails its cluster 2 s later; worker 1 fails its own after
    `delay`. The push_pull in flight (`pending`) and a later one (`later`) must raise into
    caught(); OUT_DIR/reason_<rank>.txt gets what cluster_failure() said."""
    import threading
    import time
    assert cluster_failure() is None
    if rank == 0:
        threading.Timer(2.0, fail_cluster, args=("test: node 1 declared dead",)).start()
        ok = caught("pending", lambda: push("never"))  # worker 1 never pushes it
    else:
        time.sleep(delay)
        fail_cluster("test: node 0 declared dead")
        ok = True
    ok = caught("later", lambda: push("sync")) and ok
    with open(os.path.join(out_dir, f"reason_{rank}.txt"), "w") as f:
        f.write(cluster_failure() or "")
    if not ok:
        raise SystemExit("a push_pull did not raise after fail_cluster")
