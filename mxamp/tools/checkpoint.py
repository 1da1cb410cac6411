"""Checkpoint files: loading and saving ``PREFIX-symbol.json`` /
``PREFIX-NNNN.params`` with clear errors, and checking them against the
data shapes; publishing a written pair whole, and the signals that
would interrupt it."""
import contextlib
import os
import signal

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError

from .. import backends
from ..backends import onednn
from ..errors import mxnet_message
from ..graph import check_param_shapes, load_symbol_json


def checkpoint_files(prefix, epoch):
    return f"{prefix}-symbol.json", f"{prefix}-{epoch:04d}.params"


def _read(path, mode):
    if not os.path.exists(path):
        raise ValueError(f"file not found: {path}")
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError as err:  # a directory, no permission, an I/O error
        raise ValueError(f"cannot read {path}: {err.strerror or err}") from None


def load_checkpoint(prefix, epoch=0):
    """(symbol, arg_params, aux_params) as ``mx.model.load_checkpoint`` gives
    them, with a ValueError naming the file for anything missing or malformed."""
    sym_file, params_file = checkpoint_files(prefix, epoch)
    text = _read(sym_file, "r")
    if f'"{onednn.REGION_OP}"' in text:  # MXNet reads its region nodes once it is loaded
        backends.get("onednn")
    sym = load_symbol_json(text, where=sym_file)
    _read(params_file, "rb")  # existence and readability, with the errors above
    try:
        saved = mx.nd.load(params_file)
    except MXNetError as err:
        raise ValueError(f"{params_file} is not an MXNet params file (truncated or "
                         f"corrupt?): {mxnet_message(err)}") from None
    saved = saved or {}  # MXNet loads an empty file as an empty list
    if isinstance(saved, list) or any(":" not in k for k in saved):
        raise ValueError(f"{params_file} has parameter names without 'arg:'/'aux:' prefixes; "
                         "save models with HybridBlock.export or mx.model.save_checkpoint")
    params = {"arg": {}, "aux": {}}
    for key, array in saved.items():
        kind, name = key.split(":", 1)
        if kind not in params:
            raise ValueError(f"{params_file} holds {key!r}: parameter names must start "
                             "with 'arg:' or 'aux:'")
        params[kind][name] = array
    return sym, params["arg"], params["aux"]


def check_inputs(sym, arg_params, aux_params, data_shapes, params_file="the params file"):
    """Checks that the parameters and the data shapes ({name: shape}) cover
    the symbol's inputs with shapes that fit it."""
    params = {**arg_params, **aux_params}
    check_param_shapes(sym, params, data_shapes, params_file, "--shape")
    missing = [n for n in sym.list_inputs() if n not in params and n not in data_shapes]
    if missing:
        raise ValueError(f"no parameter in {params_file} and no --shape for the inputs "
                         f"{missing}: give each data input's shape as --shape NAME:DIMS")


def save_checkpoint(prefix, sym, arg_params, aux_params, epoch=0):
    """Writes the pair ``mx.model.load_checkpoint`` reads, keeping amp_cast
    nodes (MXNet's default save drops them); returns the two paths."""
    paths = checkpoint_files(prefix, epoch)
    sym.save(paths[0], remove_amp_cast=False)
    mx.nd.save(paths[1], {**{f"arg:{k}": v for k, v in arg_params.items()},
                          **{f"aux:{k}": v for k, v in aux_params.items()}})
    return paths


def publish(written, outputs):
    """Moves a written pair (:func:`save_checkpoint`'s paths) onto `outputs`:
    the params first and the symbol last (a reader of the symbol finds its
    params), with SIGINT and SIGTERM held back between the two renames, so an
    interrupted run leaves the previous pair or the new one, never a mix."""
    with signals_held():
        for src, dst in reversed(list(zip(written, outputs))):
            os.replace(src, dst)


HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_held():
    """SIGINT and SIGTERM wait until the block ends, then take effect. Python
    runs signal handlers in the main thread between bytecodes, so a handler
    that only notes the signal cannot split the block (main thread only)."""
    held = []
    previous = {s: signal.signal(s, lambda signum, _frame: held.append(signum))
                for s in HELD_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if held:
            signal.raise_signal(held[0])


class Interrupted(BaseException):
    """SIGINT or SIGTERM, raised in the main thread so that ``finally``
    blocks (staging directories) run before the exit. Not a
    KeyboardInterrupt, which click answers with a blank line of its own."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def signals_raise():
    """SIGINT and SIGTERM (timeout, kill, docker stop, CI runners) raise
    :class:`Interrupted` in this process while the block runs; a forked
    worker process that inherits the handler dies of the signal as it would
    without it."""
    owner = os.getpid()

    def interrupt(signum, _frame):
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise Interrupted(signum)
    previous = {s: signal.signal(s, interrupt) for s in HELD_SIGNALS}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def output_prefix(out, default):
    """The prefix to write to for ``--out`` `out`: `default`'s file name
    inside `out` when that is a directory (or ends with a separator, which
    would otherwise name files '-symbol.json'); `default` without `out`."""
    if not out:
        return default
    if out.endswith(os.sep) or os.path.isdir(out):
        return os.path.join(out, os.path.basename(default))
    return out


def param_bytes(*param_dicts):
    return sum(a.size * np.dtype(a.dtype).itemsize for d in param_dicts for a in d.values())
