"""Standard streams that never fail a command once its work is done: closed
ones (``>&-``, ``2>&-``, as under some daemons and cron) and pipes whose
reader has quit (``| head -1``)."""
import contextlib
import os
import sys

from ..errors import forgiving_stream


def guard():
    """Opens /dev/null on a standard descriptor that is closed: a file the
    command opens would otherwise take the descriptor, and MXNet's C++ log,
    writing to descriptor 2, would write into it. Then sys.stdout and
    sys.stderr, unless something else replaced them (a test's runner),
    drop what they write once their reader has quit
    (:func:`mxamp.errors.forgiving_stream`)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)  # the lowest free descriptor: fd
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = getattr(sys, name)
        if stream is not getattr(sys, f"__{name}__"):  # replaced already, here or elsewhere
            continue
        if stream is not None:
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        setattr(sys, name, forgiving_stream(os.dup(fd), stream))


def flush():
    """Flushes sys.stdout and sys.stderr where they can be, before the
    process ends without Python's own shutdown."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # closed, or none
            stream.flush()
