"""SIGINT, SIGTERM and SIGHUP in a command: noted, and acted on at the
command's safe points, so that a run stops between its stages and never
halfway through publishing its output."""
import contextlib
import os
import signal

# The signals that end a run, and the run's last line for each (status 128 + signal).
MESSAGES = {signal.SIGINT: "Aborted.", signal.SIGTERM: "Terminated.", signal.SIGHUP: "Hangup."}


@contextlib.contextmanager
def held():
    """SIGINT, SIGTERM and SIGHUP wait until the block ends, then take
    effect. Python runs signal handlers in the main thread between
    bytecodes, so a handler that only notes the signal cannot split the
    block (main thread only)."""
    noted = []
    previous = {s: signal.signal(s, lambda signum, _frame: noted.append(signum))
                for s in MESSAGES}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if noted:
            signal.raise_signal(noted[0])


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP, raised at a command's safe point so that
    ``finally`` blocks (staging directories) run before the exit. Not a
    KeyboardInterrupt, which click answers with a blank line of its own."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def message(self):
        return MESSAGES[self.signum]


_pending = []  # signals noted by deferred()'s handler, first one first


def safe_point():
    """Raises :class:`Interrupted` if a signal arrived since the command
    began: commands call it between their stages, batches and files."""
    if _pending:
        raise Interrupted(_pending[0])


@contextlib.contextmanager
def deferred():
    """While the block runs, SIGINT, SIGTERM and SIGHUP (Ctrl-C, kill, docker
    stop, a closed terminal) are only noted; :func:`safe_point` and the end
    of the block raise :class:`Interrupted` for them. The handler never
    raises itself: Python runs it wherever the main thread is, and an
    exception raised inside a finalizer (MXNet's ``NDArray.__del__``) is
    printed and lost, and the run went on to the end. A forked worker
    process that inherits the handler dies of the signal as it would
    without it."""
    owner = os.getpid()

    def note(signum, _frame):
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        _pending.append(signum)
    previous = {s: signal.signal(s, note) for s in MESSAGES}
    try:
        yield
        safe_point()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _pending.clear()
