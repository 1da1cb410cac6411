"""Checkpoint files: loading and saving ``PREFIX-symbol.json`` /
``PREFIX-NNNN.params`` with clear errors (a pair read whole from one
published version, :func:`publish.pinned`), and checking them against the
data shapes."""
import contextlib
import json
import os

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError

from .. import backends
from ..backends import onednn
from ..dtypes import dtype_name, to_code
from ..graph import check_param_shapes, load_symbol_json
from . import publish, signals

EXPORTERS = "HybridBlock.export or mx.model.save_checkpoint"  # what writes a pair


def checkpoint_files(prefix, epoch):
    return f"{prefix}-symbol.json", f"{prefix}-{epoch:04d}.params"


def _check_readable(path, shown):
    """A ValueError naming the file (as `shown`) if `path` is missing or
    cannot be read."""
    if not os.path.exists(path):
        raise ValueError(f"file not found: {shown}")
    try:
        with open(path, "rb"):
            pass
    except OSError as err:  # a directory, no permission, an I/O error
        raise ValueError(f"cannot read {shown}: {err.strerror or err}") from None


def load_checkpoint(prefix, epoch=0):
    """(symbol, arg_params, aux_params) as ``mx.model.load_checkpoint`` gives
    them, both files from one published version, with a ValueError naming the
    file for anything missing or malformed."""
    files = checkpoint_files(prefix, epoch)
    with publish.pinned(files) as real:  # the version stays while both are read
        for path, shown in zip(real, files):
            _check_readable(path, shown)
        with open(real[0], "rb") as f:
            text = _symbol_text(f.read(), files[0])
        if f'"{onednn.REGION_OP}"' in text:  # MXNet reads its region nodes once it is loaded
            backends.get("onednn")
        sym = load_symbol_json(text, where=files[0])
        params = _params(real[1], files[1])
    signals.safe_point()
    return sym, params["arg"], params["aux"]


def _symbol_text(data, sym_file):
    """A symbol file's bytes as JSON text, with an error naming the file for
    anything that is not."""
    try:
        json.loads(data.decode(), strict=False)  # node names may hold control characters
    except (UnicodeDecodeError, ValueError) as err:
        what = "not JSON text (UTF-8)" if isinstance(err, UnicodeDecodeError) else \
            f"not JSON ({err})" if data.strip() else "empty"
        raise ValueError(f"{sym_file} is not a symbol file: it is {what}; give the "
                         f"PREFIX-symbol.json that {EXPORTERS} writes") from None
    return data.decode()


def _params(path, params_file):
    """{"arg": {...}, "aux": {...}} of the params file at `path` (`params_file`)."""
    saved = None
    if os.path.getsize(path):  # a params file holding no array still has a header
        with contextlib.suppress(MXNetError):
            saved = mx.nd.load(path)
    if saved is None:
        raise ValueError(f"{params_file} is not an MXNet params file (truncated or "
                         f"corrupt?): give one that {EXPORTERS} writes")
    saved = saved or {}  # a file of no arrays loads as an empty list
    if isinstance(saved, list) or any(":" not in k for k in saved):
        raise ValueError(f"{params_file} has parameter names without 'arg:'/'aux:' prefixes; "
                         f"save models with {EXPORTERS}")
    params = {"arg": {}, "aux": {}}
    for key, array in saved.items():
        kind, name = key.split(":", 1)
        if kind not in params:
            raise ValueError(f"{params_file} holds {key!r}: parameter names must start "
                             "with 'arg:' or 'aux:'")
        params[kind][name] = array
    return params


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
    signals.safe_point()
    mx.nd.save(paths[1], {**{f"arg:{k}": v for k, v in arg_params.items()},
                          **{f"aux:{k}": v for k, v in aux_params.items()}})
    return paths


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


@contextlib.contextmanager
def publishing(prefix, epoch, overwrite, beside=(), gone=()):
    """A prefix in a staging directory: the pair written there, and the
    files `beside` it (paths beside `prefix`, e.g. its report), replace
    `prefix`'s together when the block ends without an error, and the files
    at `gone` an earlier run published there go (:func:`publish.output`)."""
    name = os.path.basename(prefix)
    with publish.output([*checkpoint_files(prefix, epoch), *beside], overwrite, key=name,
                        gone=gone) as staging:
        yield os.path.join(staging, name)
