"""The ``mxamp`` command's entry point. It lives outside the mxamp package
on purpose: importing mxamp (and MXNet with it) takes a second or two, and a
Ctrl-C or SIGTERM meanwhile should end the run as it does during a command
(mxamp.tools.cli: one line, status 130 or 143), not with a KeyboardInterrupt
traceback, nor be swallowed by a library's bare ``except:`` during import."""
import os
import signal
import sys

MESSAGES = {signal.SIGINT: "Aborted.", signal.SIGTERM: "Terminated."}


def _end(signum, _frame):
    """A signal outside a command (before it starts, or once it has ended and
    Python shuts down, joining threads and worker processes): nothing is
    being written then, so the process ends at once, with the one line."""
    sys.stdout.flush()
    sys.stderr.write(MESSAGES[signum] + "\n")
    sys.stderr.flush()
    os._exit(128 + signum)


def main():
    held = []  # signals during the import are noted, and acted on after it
    for s in MESSAGES:
        signal.signal(s, lambda signum, _frame: held.append(signum))
    from mxamp.tools.cli import main as cli_main
    for s in MESSAGES:  # the command replaces them while it runs
        signal.signal(s, _end)
    if held:
        _end(held[0], None)
    cli_main(prog_name="mxamp")
