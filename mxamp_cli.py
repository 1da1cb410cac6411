"""The ``mxamp`` command's entry point. It lives outside the mxamp package
on purpose: importing mxamp (and MXNet with it) takes a second or two, and a
Ctrl-C or SIGTERM meanwhile should end the run as it does later
(mxamp.tools.cli: one line, status 130 or 143), not with a KeyboardInterrupt
traceback, nor be swallowed by a library's bare ``except:`` during import."""
import signal
import sys

MESSAGES = {signal.SIGINT: "Aborted.", signal.SIGTERM: "Terminated."}


def main():
    held = []  # the signals are noted during the import and acted on after it
    previous = {s: signal.signal(s, lambda signum, _frame: held.append(signum))
                for s in MESSAGES}
    try:
        from mxamp.tools.cli import main as cli_main
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if held:
        sys.stderr.write(MESSAGES[held[0]] + "\n")
        sys.exit(128 + held[0])
    cli_main(prog_name="mxamp")
