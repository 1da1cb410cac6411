"""The ``mxamp`` command's entry point. It lives outside the mxamp package
on purpose: importing mxamp (and MXNet with it) takes a second or two, and a
Ctrl-C, SIGTERM or SIGHUP meanwhile should end the run as it does during a
command (mxamp.tools.cli: one line, status 130, 143 or 129), not with a
KeyboardInterrupt traceback, nor be swallowed by a library's bare
``except:`` during import."""
import atexit
import contextlib
import faulthandler
import os
import signal
import sys
import threading

# The signals held while mxamp imports: those that end a run
# (mxamp.tools.signals.MESSAGES, read once mxamp is imported).
IMPORT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _keep_fatal_signals_from_mxnet():
    """MXNet sets its own handler for SIGSEGV, SIGFPE and SIGBUS where none
    is set; it calls exit() inside the handler, and under an address-space
    limit that waited forever on glibc's heap lock (a run hung until
    SIGKILL). Python's faulthandler, set first, writes a traceback with
    signal-safe calls and lets the signal end the process."""
    try:
        faulthandler.enable()
    except RuntimeError:  # no stderr: the traceback goes nowhere
        faulthandler.enable(open(os.devnull, "w"))  # noqa: SIM115 (kept open for the handler)


_keep_fatal_signals_from_mxnet()


def _flush():
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # closed, or none
            stream.flush()


def _say(line):
    """`line` on stderr, if there is one to write to."""
    _flush()
    with contextlib.suppress(OSError):
        os.write(2, f"{line}\n".encode())


def _ender(messages):
    def end(signum, _frame):
        """A signal outside a command (before it starts, or once it has ended
        and the process winds down, joining threads and worker processes):
        nothing is being written then, so the process ends at once, with the
        one line."""
        _say(messages[signum])
        os._exit(128 + signum)
    return end


def _status(code):
    """The exit status Python gives ``sys.exit(code)``."""
    if code is None or isinstance(code, int):
        return code or 0
    _say(code)
    return 1


def _cannot_start(err):
    """Ends a run whose import of mxamp and MXNet failed, as under a tight
    address-space limit (a traceback from inside MXNet's import, and MXNet's
    own shutdown raising after it), with one line."""
    # mxamp's first module, imported before MXNet, stays loaded.
    limit = sys.modules.get("mxamp.address_space")
    note = limit.note() if limit else ""
    lines = str(err).strip().splitlines() or [""]
    _say(f"Error: mxamp and MXNet could not be loaded{note}: {type(err).__name__}: {lines[0]}")
    os._exit(1)


def main():
    held = []  # signals during the import are noted, and acted on after it
    for s in IMPORT_SIGNALS:
        signal.signal(s, lambda signum, _frame: held.append(signum))
    try:
        from mxamp.tools.cli import main as cli_main
        from mxamp.tools.signals import MESSAGES
    except Exception as err:  # noqa: BLE001 (MXNet that cannot start, a broken install: one line)
        _cannot_start(err)
    end = _ender(MESSAGES)
    for s in MESSAGES:  # the command replaces them while it runs
        signal.signal(s, end)
    if held:
        end(held[0], None)
    try:
        cli_main(prog_name="mxamp")
    except SystemExit as done:
        status = _status(done.code)
    # The process winds down here, with `end` in place: other threads joined,
    # exit handlers run (worker processes, logging), then it ends without
    # the interpreter's finalization and MXNet's C++ teardown, where a
    # signal found Python's handlers already gone and killed the process
    # without its line.
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    _flush()
    os._exit(status)
