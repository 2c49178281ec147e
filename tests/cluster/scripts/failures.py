"""What the failure workers share (tf_failures.py, mxnet_failures.py): an expected error is caught
and its text written where the test reads it, OUT_DIR/<style>_<rank>.txt."""
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
