"""How a command meets the terminal: every error as one line on stderr and
a non-zero exit status, Python's warnings as ``Warning:`` lines, the
converter's advice in the command's own options, progress bars, JSON on
stdout."""
import contextlib
import functools
import json
import logging
import os
import sys
import warnings

import click
from mxnet.base import MXNetError

from .. import address_space
from ..errors import (OutOfMemory, is_out_of_memory, mxnet_logs_to_logging, mxnet_message,
                      no_gpus)
from . import signals, streams
from .options import quiet


class Cli(click.Group):
    """Every error ends as one line on stderr and a non-zero exit status."""

    def main(self, args=None, prog_name=None, **extra):
        streams.guard()  # closed or quitting standard streams fail no command
        warnings.showwarning = _show_warning  # MXNet's own go to the logger below
        with mxnet_logs_to_logging():  # shown with -v
            self._main(args, prog_name, **extra)

    def _main(self, args, prog_name, **extra):
        try:
            with signals.deferred():  # stops at a safe point, staging removed
                status = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.UsageError as err:
            where = f" (see '{err.ctx.command_path} --help')" if err.ctx else ""
            click.echo(f"Error: {' '.join(err.format_message().split())}{where}", err=True)
            sys.exit(err.exit_code)
        except NoMemory as err:
            click.echo(f"Error: {err.format_message()}", err=True)
            # MXNet may hold work for a thread it could not start, and its
            # shutdown then waits for it forever (a run hung at exit).
            streams.flush()
            os._exit(err.exit_code)
        except click.ClickException as err:
            click.echo(f"Error: {' '.join(err.format_message().split())}", err=True)
            sys.exit(err.exit_code)
        except click.exceptions.Abort:
            click.echo("Aborted.", err=True)
            sys.exit(130)
        except signals.Interrupted as err:
            click.echo(err.message, err=True)
            sys.exit(128 + err.signum)
        sys.exit(status or 0)


class NoMemory(click.ClickException):
    """A command that ran out of memory (or could not start a thread)."""


def one_line_errors(command):
    """Turns the errors of bad input into a ClickException with the first
    line of their message (MXNet's carry C++ stack frames); one saying that
    memory ran out names the command and the address-space limit (or the
    cgroup's memory limit, which sets one)."""
    @functools.wraps(command)
    def run(*args, **kwargs):
        if no_gpus():
            address_space.limit_to_cgroup()  # the kernel's SIGKILL becomes an error
        short = address_space.shortfall(command.__name__)
        if short:  # MXNet would die starting its threads, with a signal
            raise NoMemory(short)
        try:
            return command(*args, **kwargs)
        except (MXNetError, ValueError, TypeError, RuntimeError, OSError, MemoryError) as err:
            lines = (mxnet_message(err) if isinstance(err, MXNetError) else
                     str(err)).strip().splitlines()
            line = lines[0] if lines else type(err).__name__
            if isinstance(err, OutOfMemory):
                raise NoMemory(line) from None
            if is_out_of_memory(err):
                raise NoMemory(f"out of memory in 'mxamp {command.__name__}'"
                               f"{address_space.note()}: {line}") from None
            raise click.ClickException(line) from None
    return run


def _show_warning(message, *_args, **_kwargs):
    click.echo(f"Warning: {message}", err=True)


def advise_in_command_terms(command):
    """Until the command ends, the converter's WARNING about operators kept
    in float32 speaks of the command's options (`command`, a click command
    or None)."""
    has_ctx = command is not None and any(p.name == "ctx" for p in command.params)
    terms = _KeptFloat32InCommandTerms(
        "; --ctx any keeps them in {dtype} (for a device that has the kernels)" if has_ctx
        else "")
    converter_log = logging.getLogger("mxamp.convert.api")
    converter_log.addFilter(terms)
    click.get_current_context().call_on_close(lambda: converter_log.removeFilter(terms))


class _KeptFloat32InCommandTerms(logging.Filter):
    """The converter's WARNING about operators kept in float32 for want of
    kernels, once per dtype and reason, with advice in the command's own
    options (`advice`) instead of the Python API's ctx / target_device."""

    def __init__(self, advice):
        super().__init__()
        self.advice, self.seen = advice, set()

    def filter(self, record):
        kept = getattr(record, "kept_float32", None)
        if kept is None:
            return True
        dtype, reason, counted = kept
        if (dtype, reason) in self.seen:
            return False
        self.seen.add((dtype, reason))
        record.msg = "%s: kept in float32 (%s): %s%s"
        record.args = (dtype, reason, counted, self.advice.format(dtype=dtype))
        return True


@contextlib.contextmanager
def progress():
    """Whether the library's progress bars show (on a terminal, not with -q);
    log lines meanwhile print above the bars."""
    from tqdm.contrib.logging import logging_redirect_tqdm
    shown = not quiet() and sys.stderr.isatty()
    with logging_redirect_tqdm() if shown else contextlib.nullcontext():
        yield shown


def echo_json(data):
    click.echo(json.dumps(data, indent=2, default=str))
