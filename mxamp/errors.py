"""The errors mxamp raises for bad options, and MXNet's error text made short."""
import contextlib
import functools
import io
import logging
import os
import re
import sys
import threading
import warnings

import mxnet

from . import address_space
from .process_wide import ProcessWide

# Lines MXNet wraps around a message: Python-style traceback headers and
# frames of C++ source files, and C++ stack traces.
_FRAME_PREFIXES = ("Traceback (most recent call last):", 'File "', "[bt]", "Stack trace")
_TAG = "MXNetError: "
# The time and C++ source location MXNet's checks put inside a message
# ("Error in operator fc: [21:57:16] ../src/operator/nn/fully_connected.cc:151: ...")
_CHECK_ORIGIN = re.compile(r"\[\d\d:\d\d:\d\d\] \S+\.(?:cc|h):\d+: ")


# An extension library's own message follows this header, as
# "[0] /path/file.cc[123]: message"; what MXNet says before it is generic.
_EXTENSION = "Extension Traceback:"
_EXTENSION_FRAME = re.compile(r"^\[\d+\] \S+\[\d+\]: ")


def mxnet_message(err):
    """The line of an MXNetError that says what went wrong: MXNet wraps its
    messages in traceback headers, source frames and stack traces, and
    repeats the ``MXNetError:`` tag when a message is raised again. For an
    error raised by an extension library (mxamp's backend), its own message."""
    text = str(err)
    if _EXTENSION in text:
        frames = [_EXTENSION_FRAME.sub("", line.strip())
                  for line in text.split(_EXTENSION, 1)[1].splitlines()
                  if _EXTENSION_FRAME.match(line.strip())]
        if frames:
            return frames[-1]  # MXNet keeps earlier calls' messages before it
    lines = [line.strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith(_FRAME_PREFIXES)]
    tagged = [line for line in lines if line.startswith(_TAG)]
    line = tagged[-1] if tagged else lines[0] if lines else type(err).__name__
    while line.startswith(_TAG):
        line = line[len(_TAG):]
    return _CHECK_ORIGIN.sub("", line)


class OptionError(ValueError, AssertionError):
    """An invalid option value.

    A ``ValueError``, and also an ``AssertionError``: ``mxnet.contrib.amp``
    checks its options with ``assert``, and code written for it catches that.
    """


class OptionTypeError(TypeError, AssertionError):
    """An option of the wrong type.

    A ``TypeError``, and also an ``AssertionError``, as :class:`OptionError`.
    """


class BackendError(RuntimeError):
    """A failure inside an execution backend's native library, with its
    message cut to one line (see :func:`mxnet_message`)."""


class OutOfMemory(MemoryError):
    """Memory (or a thread's stack) could not be had, as under a container's
    address-space limit; the message says what mxamp was doing."""


# How MXNet, the backend's regions and Python say that memory ran out (MXNet's
# pools and aligned allocations check errno 12; the dynamic loader cannot map
# a library), or that a thread could not start.
_NO_MEMORY = ("Failed to allocate CPU Memory", "std::bad_alloc", "out of memory",
              "can't start new thread", "Allocation failed", "AlignedMallocPitch failed",
              "Cannot allocate memory", "failed to map segment")
# MXNet's word for a std::thread it could not start (EAGAIN, which a lock
# taken without waiting also raises outside MXNet).
_NO_THREAD = "Resource temporarily unavailable"


def is_out_of_memory(err):
    """Whether the exception `err` says that memory ran out."""
    return isinstance(err, MemoryError) or any(s in str(err) for s in _NO_MEMORY) or \
        (isinstance(err, mxnet.base.MXNetError) and _NO_THREAD in str(err))


@functools.lru_cache(maxsize=None)
def no_gpus():
    """Whether MXNet sees no GPU: where it sees one, a CUDA context reserves
    far more address space than it holds memory, so the address space stands
    for no cgroup limit there (address_space.cgroup_limited)."""
    return mxnet.context.num_gpus() == 0


@contextlib.contextmanager
def memory_for(what):
    """Within it, an error saying that memory ran out raises
    :class:`OutOfMemory` naming `what` ("calibrating ...") and the failing
    library's own line. Under a cgroup memory limit, the address space is
    limited to what the cgroup leaves meanwhile (address_space.cgroup_limited):
    memory running out is then that error, not the kernel's SIGKILL."""
    with address_space.cgroup_limited() if no_gpus() else contextlib.nullcontext():
        try:
            yield
        except OutOfMemory:
            raise
        except Exception as err:  # noqa: BLE001 (only memory failures are replaced)
            if not is_out_of_memory(err):
                raise
            line = mxnet_message(err) if isinstance(err, mxnet.base.MXNetError) else \
                str(err) or type(err).__name__
            raise OutOfMemory(f"out of memory while {what}{address_space.note()}: {line}") \
                from None


def wait_for(arrays):
    """Waits until MXNet's engine has written `arrays`. An operation that
    fails there (memory running out) is reported only when its output is
    read: so it raises in the call that made them, not at the caller's
    first use or at exit."""
    for array in arrays:
        array.wait_to_read()


# --- MXNet's own log lines and warnings during mxamp's work ------------------

# "[05:40:37] ../src/executor/graph_executor.cc:2072: Subgraph backend MKLDNN is activated."
_MXNET_LOG_LINE = re.compile(rb"\[\d\d:\d\d:\d\d\] (?=\S+:\d+: )")
_MXNET_DIR = os.path.dirname(os.path.abspath(mxnet.__file__))
_mxnet_log = logging.getLogger("mxnet")


def _start_quiet():
    """Routes MXNet's output to the logger; returns the function that stops it."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if os.path.abspath(filename).startswith(_MXNET_DIR + os.sep):
            _mxnet_log.info("%s: %s", category.__name__, message)
        else:
            shown(message, category, filename, lineno, file, line)
    warnings.showwarning = show
    stop_fd = _fd2_to_logging()

    def stop():
        stop_fd()
        if warnings.showwarning is show:
            warnings.showwarning = shown
    return stop


# While mxamp works (binding graphs to probe kernels, calibrate, verify...),
# MXNet's C++ log lines ("Subgraph backend MKLDNN is activated.", one per
# bind) and the Python warnings MXNet's own modules raise about mxamp's
# internal graphs go to the logger "mxnet" at INFO instead of the terminal;
# anything else written to stderr passes through. A context manager factory
# and decorator: blocks nest, in any thread, and the outermost sets up and
# ends the redirection (file descriptor 2 belongs to the whole process).
mxnet_logs_to_logging = ProcessWide(_start_quiet)


class _Forgiving(io.FileIO):
    """A file on a standard stream's descriptor whose writes after its reader
    has quit (``| head -1``) go to /dev/null, as a closed stream's do,
    instead of raising BrokenPipeError."""

    def write(self, data):
        return _write(self.fileno(), data)


def _write(fd, data):
    try:
        return os.write(fd, data)
    except BrokenPipeError:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
        return len(data)


def forgiving_stream(fd, like):
    """A text stream writing to descriptor `fd` (which it closes) through
    :class:`_Forgiving`, with `like`'s encoding and buffering."""
    return io.TextIOWrapper(io.BufferedWriter(_Forgiving(fd, "w")),
                            encoding=getattr(like, "encoding", None) or "utf-8",
                            errors="backslashreplace", line_buffering=True,
                            write_through=getattr(like, "write_through", False))


def _descriptor(stream):
    """The descriptor `stream` writes to, or None (no stream, or one of
    Python's own, as a test runner's)."""
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _fd2_to_logging():
    """MXNet's C++ library writes its log to file descriptor 2: a pipe read
    by a thread that logs MXNet's lines and passes anything else on.
    Python's own sys.stderr, when it is that descriptor, writes straight to
    the terminal meanwhile, so that a progress bar stays live."""
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
        terminal = os.dup(2)
    except (OSError, ValueError):  # no descriptor 2 (a daemon): nothing to redirect
        return lambda: None
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    saved_stderr = sys.stderr
    if _descriptor(sys.stderr) == 2:
        sys.stderr = forgiving_stream(os.dup(terminal), saved_stderr)

    def pump():
        with open(read_end, "rb") as pipe:
            try:
                for raw in pipe:
                    found = _MXNET_LOG_LINE.match(raw)
                    if found:  # logged without its time: a handler writing to fd 2 cannot loop
                        _mxnet_log.info(raw[found.end():].decode(errors="replace").rstrip())
                    else:
                        _write(terminal, raw)
            except MemoryError:  # MXNet's lines go straight to the terminal from now on
                os.dup2(terminal, 2)
    thread = threading.Thread(target=pump, name="mxnet-log", daemon=True)

    def stop():
        if sys.stderr is not None:
            sys.stderr.flush()
        os.dup2(terminal, 2)  # closes the pipe's last writer: the pump ends
        thread.join(timeout=5)
        if sys.stderr is not saved_stderr:
            sys.stderr.close()
            sys.stderr = saved_stderr
        os.close(terminal)
    try:
        thread.start()
    except RuntimeError:  # no memory for its stack: MXNet's lines stay on the terminal
        os.dup2(terminal, 2)
        os.close(read_end)
        if sys.stderr is not saved_stderr:
            sys.stderr.close()
            sys.stderr = saved_stderr
        os.close(terminal)
        return lambda: None
    return stop
