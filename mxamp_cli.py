"""The ``mxamp`` command's entry point. It lives outside the mxamp package
on purpose: importing mxamp (and MXNet with it) takes a second or two, and a
Ctrl-C, SIGTERM or SIGHUP meanwhile should end the run as it does during a
command (mxamp.tools.cli: one line, status 130, 143 or 129), not with a
KeyboardInterrupt traceback, nor be swallowed by a library's bare
``except:`` during import."""
import atexit
import os
import signal
import sys
import threading

# The signals that end a run, and the run's last line for each (status 128 + signal).
MESSAGES = {signal.SIGINT: "Aborted.", signal.SIGTERM: "Terminated.", signal.SIGHUP: "Hangup."}


def _end(signum, _frame):
    """A signal outside a command (before it starts, or once it has ended and
    the process winds down, joining threads and worker processes): nothing
    is being written then, so the process ends at once, with the one line."""
    sys.stdout.flush()
    sys.stderr.write(MESSAGES[signum] + "\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def _status(code):
    """The exit status Python gives ``sys.exit(code)``."""
    if code is None or isinstance(code, int):
        return code or 0
    sys.stderr.write(f"{code}\n")
    return 1


def main():
    held = []  # signals during the import are noted, and acted on after it
    for s in MESSAGES:
        signal.signal(s, lambda signum, _frame: held.append(signum))
    from mxamp.tools.cli import main as cli_main
    for s in MESSAGES:  # the command replaces them while it runs
        signal.signal(s, _end)
    if held:
        _end(held[0], None)
    try:
        cli_main(prog_name="mxamp")
    except SystemExit as done:
        status = _status(done.code)
    # The process winds down here, with _end in place: other threads joined,
    # exit handlers run (worker processes, logging), then it ends without
    # the interpreter's finalization and MXNet's C++ teardown, where a
    # signal found Python's handlers already gone and killed the process
    # without its line.
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
