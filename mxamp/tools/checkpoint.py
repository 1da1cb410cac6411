"""Checkpoint files: loading and saving ``PREFIX-symbol.json`` /
``PREFIX-NNNN.params`` with clear errors, and checking them against the
data shapes; publishing a written pair whole, and the signals that
would interrupt it."""
import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError
from mxamp_cli import MESSAGES  # the entry point reads it before mxamp imports

from .. import backends
from ..backends import onednn
from ..dtypes import dtype_name, to_code
from ..errors import mxnet_message
from ..graph import check_param_shapes, load_symbol_json

log = logging.getLogger(__name__)


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
    recover((sym_file, params_file))
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
    safe_point()
    return sym, params["arg"], params["aux"]


def check_inputs(sym, arg_params, aux_params, data_shapes, params_file="the params file",
                 shapes_from="--shape"):
    """Checks that the parameters and the data shapes ({name: shape}, from
    `shapes_from`) cover the symbol's inputs with shapes that fit it."""
    params = {**arg_params, **aux_params}
    check_param_shapes(sym, params, data_shapes, params_file, shapes_from)
    missing = [n for n in sym.list_inputs() if n not in params and n not in data_shapes]
    if missing:
        raise ValueError(f"no parameter in {params_file} and no --shape for the inputs "
                         f"{missing}: give each data input's shape as --shape NAME:DIMS")


def save_checkpoint(prefix, sym, arg_params, aux_params, epoch=0):
    """Writes the pair ``mx.model.load_checkpoint`` reads, keeping amp_cast
    nodes (MXNet's default save drops them); returns the two paths."""
    paths = checkpoint_files(prefix, epoch)
    sym.save(paths[0], remove_amp_cast=False)
    safe_point()
    mx.nd.save(paths[1], {**{f"arg:{k}": v for k, v in arg_params.items()},
                          **{f"aux:{k}": v for k, v in aux_params.items()}})
    return paths


def _manifest(outputs):
    """The manifest a publishing of the pair `outputs` leaves beside it
    until both files are in place."""
    directory, name = os.path.split(os.path.abspath(outputs[1]))
    return os.path.join(directory, f".{name}.mxamp-publish")


def publish(written, outputs):
    """Moves a written pair (:func:`save_checkpoint`'s paths, complete) onto
    `outputs`: the params first and the symbol last (a reader of the symbol
    finds its params), with the signals held back between the two renames.
    A manifest naming both moves is written first and removed last, so that
    after a SIGKILL or a power cut between the renames :func:`recover` (which
    loading and the next run on the output call) completes the new pair."""
    manifest = _manifest(outputs)
    temporary = os.path.join(os.path.dirname(written[0]), "manifest")  # cleaned with it
    with open(temporary, "w") as f:
        json.dump({"moves": [[os.path.abspath(src), os.path.abspath(dst)]
                             for src, dst in reversed(list(zip(written, outputs)))]}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temporary, manifest)
    with signals_held():
        for src, dst in reversed(list(zip(written, outputs))):
            os.replace(src, dst)
    os.remove(manifest)


def recover(outputs):
    """Completes a publishing of the pair `outputs` that a killed run left
    half done (its manifest is still there): the staged files not yet moved
    are moved on, so the output is the whole new pair. True if it did."""
    manifest = _manifest(outputs)
    try:
        with open(manifest) as f:
            moves = json.load(f)["moves"]
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError):  # written whole (renamed into place): not ours
        log.warning("ignoring %s: not a manifest mxamp wrote", manifest)
        return False
    for src, dst in moves:
        with contextlib.suppress(FileNotFoundError):  # moved already
            os.replace(src, dst)
    with contextlib.suppress(FileNotFoundError):  # another reader finished first
        os.remove(manifest)
    log.warning("completed %s: a run killed while publishing it had moved only part of "
                "the pair", " and ".join(outputs))
    return True


STAGING_MARK = ".mxamp-"


def staging_dir(parent, name):
    """A new hidden directory in `parent` for the output `name`, named after
    it and this process. Those a killed run left for the same output (their
    process is gone) are removed first, with a log line; a directory set
    aside to be replaced (``.old``) whose output is missing is put back."""
    prefix = f".{name}{STAGING_MARK}"
    for entry in sorted(os.listdir(parent)):
        if not entry.startswith(prefix) or _alive(entry[len(prefix):].split("-", 1)[0]):
            continue
        path = os.path.join(parent, entry)
        target = os.path.join(parent, name)
        if entry.endswith(".old") and not os.path.lexists(target):
            os.rename(path, target)
            log.warning("restored %s, which a killed run had set aside", target)
        elif entry.endswith(".old") or os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
            log.warning("removed %s, left by a killed run", path)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent)


def _alive(pid):
    """Whether the process `pid` (text) runs: staging directories carry their
    run's process id."""
    if not pid.isdigit():
        return True  # not named by this scheme: leave it
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


HELD_SIGNALS = tuple(MESSAGES)


@contextlib.contextmanager
def signals_held():
    """SIGINT, SIGTERM and SIGHUP wait until the block ends, then take
    effect. Python runs signal handlers in the main thread between
    bytecodes, so a handler that only notes the signal cannot split the
    block (main thread only)."""
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
    """SIGINT, SIGTERM or SIGHUP, raised at a command's safe point so that
    ``finally`` blocks (staging directories) run before the exit. Not a
    KeyboardInterrupt, which click answers with a blank line of its own."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_pending = []  # signals noted by signals_deferred's handler, first one first


def safe_point():
    """Raises :class:`Interrupted` if a signal arrived since the command
    began: commands call it between their stages, batches and files."""
    if _pending:
        raise Interrupted(_pending[0])


@contextlib.contextmanager
def signals_deferred():
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
    previous = {s: signal.signal(s, note) for s in HELD_SIGNALS}
    try:
        yield
        safe_point()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _pending.clear()


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
    return sum(param_bytes_by_dtype(*param_dicts).values())


def param_bytes_by_dtype(*param_dicts):
    """{dtype name: bytes} of the parameters (an INT8 model: int8 weights,
    float32 scales and biases)."""
    sizes = {}
    for array in (a for d in param_dicts for a in d.values()):
        name = dtype_name(to_code(array.dtype))
        sizes[name] = sizes.get(name, 0) + array.size * np.dtype(array.dtype).itemsize
    return sizes
