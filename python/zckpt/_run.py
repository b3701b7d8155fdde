"""Runs one library call: progress, cancellation (Ctrl-C or the callback) and errors.

The call runs in a helper thread while the main thread waits with its own SIGINT handler
in place: a Ctrl-C asks the library to stop through the progress callback (non-zero
cancels), the job removes what it had written, exactly as the zckpt command does on
Ctrl-C, and then the previous handler runs (KeyboardInterrupt by default).
zck_last_error() is per thread, so the message is read in the thread that made the call.
"""
import signal
import sys
import threading

from . import _native as N


class Error(Exception):
    """A zckpt failure. str() is the library's one-line message ("FILE: what is wrong");
    .status is the status name ("format error", "damaged", ...)."""

    def __init__(self, message, status="error"):
        super().__init__(message)
        self.message = message
        self.status = status


class Canceled(Error):
    """The progress callback asked to stop; nothing was written."""


def error_from(status):
    msg = (N.lib.zck_last_error() or b"").decode("utf-8", "replace")
    name = N.STATUS_NAMES[status] if 0 <= status < len(N.STATUS_NAMES) else f"status {status}"
    if not msg:
        msg = name
    return (Canceled if status == N.ERR_CANCELED else Error)(msg, name)


class _Progress:
    """Adapts the user's choice (callable, True/None for tqdm, False) to the C callback."""

    def __init__(self, progress, label):
        self.user = None
        self.bar = None
        self.stop = False
        self.exc = None
        if callable(progress):
            self.user = progress
        elif progress is None or progress is True:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None and (progress is True or sys.stderr.isatty()):
                self.bar = tqdm(total=0, unit="B", unit_scale=True, desc=label, leave=False)
        self.cfunc = N.PROGRESS(self._called)

    def _called(self, ctx, done, total):
        if self.stop:
            return 1
        try:
            if self.bar is not None:
                if self.bar.total != total:
                    self.bar.total = total
                self.bar.update(done - self.bar.n)
            if self.user is not None and self.user(done, total):
                self.stop = True
        except BaseException as e:  # raised to the caller after the job stopped
            self.exc = e
            self.stop = True
        return 1 if self.stop else 0

    def close(self):
        if self.bar is not None:
            self.bar.close()


def _run_interruptible(call, finished, p):
    """Runs call in a helper thread; a SIGINT meanwhile cancels the job, which cleans up,
    and then goes to the handler that was in place (KeyboardInterrupt by default)."""
    hits = []

    def on_sigint(signum, frame):
        hits.append(frame)
        p.stop = True  # the job stops at its next progress report and cleans up

    old = signal.signal(signal.SIGINT, on_sigint)
    try:
        threading.Thread(target=call, name="zckpt-job", daemon=True).start()
        while not finished.wait(0.25):
            pass
    finally:
        signal.signal(signal.SIGINT, old)
    if hits:
        if callable(old):
            old(signal.SIGINT, hits[0])
        raise KeyboardInterrupt


def run(fn, *args, progress=None, label="zckpt", opts=None, damaged_is_result=False):
    """Calls fn(*args) with opts.progress set; returns (status, error), raises Error on
    failure. damaged_is_result: ERR_DAMAGED is an answer, returned (verify, the completeness
    check), not a failure; for a job it is one (a damaged input, nothing written)."""
    p = _Progress(progress, label)
    if opts is not None:
        opts.progress = p.cfunc
    result = {}

    finished = threading.Event()

    def call():
        try:
            N.lib.zck_clear_error()
            st = fn(*args)
            result["status"] = st
            if st != N.OK:
                result["error"] = error_from(st)
        finally:
            finished.set()

    try:
        if threading.current_thread() is threading.main_thread():
            _run_interruptible(call, finished, p)
        else:
            call()
    finally:
        p.close()
    if p.exc is not None:
        raise p.exc
    st = result["status"]
    if st != N.OK and not (damaged_is_result and st == N.ERR_DAMAGED):
        raise result["error"]
    return st, result.get("error")
