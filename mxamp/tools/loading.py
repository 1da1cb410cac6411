"""``mxamp.load``: any model mxamp writes, by its prefix.

mxamp writes checkpoints (``PREFIX-symbol.json`` / ``PREFIX-NNNN.params``)
in these formats, told apart by the graph alone:

- ``float32``: no trace of mxamp;
- ``float16`` / ``bfloat16``: a conversion (its inputs carry mxamp's marker);
- ``int8 on the oneDNN backend``, ``int8 + bfloat16 on the oneDNN backend``
  (what is not INT8 in bfloat16: ``rest_dtype='bfloat16'``), ``float32 on
  the oneDNN backend``, ``bfloat16 on the oneDNN backend``: regions of
  mxamp's oneDNN 3 backend (quantize_model, apply_backend), named after
  what they compute; their
  operator is registered by mxamp's library, which must be loaded before
  MXNet can read the graph. INT8 weights are int8 (s8) on disk;
  ``int8 on the oneDNN backend, float32 weights`` is the layout written
  before that (the regions quantize float32 weights when they first run),
  which loads and runs as it did;
- ``int8 in MXNet's format``: MXNet's own quantized operators
  (calib_mode='none', quantize_model_mkldnn).
"""
import logging

import mxnet as mx

from ..backends import onednn
from ..convert import converted_dtype
from ..dtypes import DTYPE_CODES
from ..errors import mxnet_logs_to_logging
from ..gluon import symbol_block
from ..graph import graph_json
from ..quantization.mxnet_format import FUSED_PREFIX
from . import checkpoint

log = logging.getLogger(__name__)

BACKEND = "on the oneDNN backend"
FLOAT32_WEIGHTS = ", float32 weights"  # INT8 layers reading float32 weights
MXNET_INT8 = "int8 in MXNet's format"


def graph_format(graph):
    """The format (above) of a graph in its JSON form, and its INT8 layers
    that read float32 weights ({name: why}; asked of the backend only for
    a graph with INT8 regions)."""
    regions = [n.get("attrs", {}) for n in graph["nodes"] if n["op"] == onednn.REGION_OP]
    computes = sorted({r.get("compute", "bfloat16") for r in regions})
    if computes:
        # An INT8 model's regions hold float parts; its INT8 and their dtype name it.
        mixed = any(r.get("rest_dtype") == "bfloat16" for r in regions)
        compute = ("int8 + bfloat16" if mixed else "int8") if "int8" in computes \
            else "/".join(computes)
        old = onednn.float32_weight_layers(graph) if "int8" in computes else {}
        return f"{compute} {BACKEND}{FLOAT32_WEIGHTS if old else ''}", old
    if any(n["op"].startswith(("_contrib_quantize", "_contrib_quantized_", FUSED_PREFIX))
           for n in graph["nodes"]):
        return MXNET_INT8, {}
    return _computed_dtype(graph), {}


def _computed_dtype(graph):
    """What a graph that is no backend's or MXNet's INT8 computes in: the
    dtype mxamp's marker names where the graph still casts to it or declares
    an input in it, else float32 (a conversion saved by MXNet's Symbol.save,
    whose default drops the amp_cast nodes)."""
    dtype = converted_dtype(graph)
    code = str(DTYPE_CODES.get(dtype))
    if dtype and any(n.get("attrs", {}).get("dtype" if n["op"] == "amp_cast" else "__dtype__")
                     in (dtype, code) for n in graph["nodes"]):
        return dtype
    if dtype:
        log.warning("the graph carries mxamp's %s marker but no cast to %s and no %s input "
                    "(saved with its amp_cast nodes dropped: MXNet's Symbol.save and "
                    "export drop them unless remove_amp_cast=False): it computes in float32",
                    dtype, dtype, dtype)
    return "float32"


def read(prefix, epoch=0):
    """(sym, arg_params, aux_params, format) of a checkpoint mxamp wrote (or
    any float32 one), both files from one published version; the backend
    library is loaded first when the graph holds its regions. ValueError
    naming the file for anything missing or malformed."""
    sym, arg_params, aux_params = checkpoint.load_checkpoint(prefix, epoch)
    graph = graph_json(sym)
    found, old = graph_format(graph)
    for name, why in old.items():
        log.warning("%s: INT8 layer %r reads float32 weights: %s", prefix, name, why)
    return sym, arg_params, aux_params, found


@mxnet_logs_to_logging()  # MXNet warns about the untyped inputs
def load(prefix, epoch=0, ctx=None):
    """Load any model mxamp writes.

    Float16 / bfloat16 conversions, INT8 models, models on the oneDNN
    backend (whose library it loads first) and plain float32 models, told
    apart by the graph. Once it has run, ``mx.model.load_checkpoint`` and
    ``SymbolBlock.imports`` read the same files in this process.

    Parameters
    ----------
    prefix : str
        The files' prefix: ``PREFIX-symbol.json`` and ``PREFIX-NNNN.params``.
    epoch : int
        The ``NNNN`` of the parameters file.
    ctx : mxnet.Context, optional
        Where the parameters go (default: the CPU).

    Returns
    -------
    mxnet.gluon.SymbolBlock
        A hybridized block whose inputs are the symbol's inputs without a
        parameter. Its ``mxamp_format`` attribute names the format found
        (``"bfloat16"``, ``"int8 on the oneDNN backend"``, ...; see
        :doc:`/cli`), which is also logged at INFO.

    Raises
    ------
    ValueError
        Naming the file, for a missing or malformed one.
    """
    sym, arg_params, aux_params, found = read(prefix, epoch)
    params = {**arg_params, **aux_params}
    attrs = sym.attr_dict()
    inputs = [mx.sym.var(n, attr=attrs.get(n)) for n in sym.list_inputs() if n not in params]
    block = symbol_block(sym, inputs, arg_params, aux_params, ctx or mx.cpu())
    # Static allocation keeps the backend regions' state (packed weights) across calls.
    block.hybridize(static_alloc=True, static_shape=True)
    block.mxamp_format = found
    log.info("mxamp.load: %s is %s", prefix, found)
    return block
