"""INT8 post-training quantization, a drop-in for ``mxnet.contrib.quantization``
(MXNet 1.9.1) that runs on mxamp's oneDNN 3 backend.

The same three layers as conversion: options resolve into per-node decisions
(which layers stay float32), calibration gives every tensor a threshold
(``calibrate.py``), and the rewrite is the backend's partitioner, which turns
regions into INT8 oneDNN chains: activations quantized at region entry and
requantized between layers, weights quantized per output channel, float32 only
at region exits and around excluded layers.
"""
import fnmatch
import itertools
import logging

import mxnet as mx
from mxnet.gluon import HybridBlock

from .. import backends, gluon
from ..errors import OptionError, OptionTypeError
from ..graph import check_params, graph_json, to_symbol
from ..policy.resolve import str_list
from . import calibrate, data

log = logging.getLogger(__name__)

QUANTIZED_DTYPES = ("auto", "int8", "uint8")
QUANTIZE_MODES = ("full", "smart")
GRANULARITIES = ("tensor-wise", "channel-wise")
CALIB_MODES = ("naive", "entropy")  # 'none' (run-time ranges) is refused, see _check_choice
# Node attributes the backend reads (src/operator/onednn_backend.cc).
AMAX, MIN, FLOAT = "__mxamp_amax__", "__mxamp_min__", "__mxamp_float__"


def _check_choice(name, value, allowed):
    if value == "none" and name == "calib_mode":
        raise OptionError("calib_mode='none' (ranges computed at run time) is not supported by "
                          "mxamp's INT8 backend: pass calib_data with calib_mode='naive' or "
                          "'entropy'")
    if value not in allowed:
        raise OptionError(f"{name} must be one of {', '.join(map(repr, allowed))}, "
                          f"got {value!r}")


def excluded_nodes(sym, exclude_layers=None, exclude_layers_match=None, exclude_operators=None):
    """Names of the operator nodes that stay float32: listed by name (each must
    exist), matching a pattern (a substring, as in the reference, or a shell
    wildcard), or running a listed operator."""
    nodes = [n for n in graph_json(sym)["nodes"] if n["op"] != "null"]
    names = {n["name"] for n in nodes}
    layers = str_list(exclude_layers or [], "exclude_layers")
    unknown = sorted(set(layers) - names)
    if unknown:
        raise OptionError(f"exclude_layers names {unknown}, which are not operator nodes of the "
                          f"model; its nodes are {sorted(names)[:20]}"
                          + (" ..." if len(names) > 20 else ""))
    patterns = str_list(exclude_layers_match or [], "exclude_layers_match")
    operators = set(str_list(exclude_operators or [], "exclude_operators"))
    return {n["name"] for n in nodes
            if n["name"] in layers or n["op"] in operators
            or any(p in n["name"] or fnmatch.fnmatchcase(n["name"], p) for p in patterns)}


def annotate(sym, stats, excluded, quantized_dtype="auto"):
    """A copy of `sym` whose nodes carry what the backend reads: each
    calibrated tensor's threshold and minimum (by node, output 0; variables
    for data), and the float32 mark on `excluded` nodes. ``quantized_dtype``
    'int8' makes every activation signed, 'uint8' unsigned (negative values
    clip to 0, as in the reference), 'auto' follows the data."""
    graph = graph_json(sym)
    for node in graph["nodes"]:
        attrs = node.setdefault("attrs", {})
        if node["name"] in excluded:
            attrs[FLOAT] = "1"
        found = stats.get(node["name"])
        if found is None:
            continue
        low = {"auto": found.min, "int8": -found.threshold,
               "uint8": max(found.min, 0.0)}[quantized_dtype]
        attrs[AMAX], attrs[MIN] = repr(float(found.threshold)), repr(float(low))
    return to_symbol(graph)


def quantize_model(sym, arg_params, aux_params, data_names=("data",),
                   label_names=("softmax_label",), ctx=mx.cpu(), excluded_sym_names=None,
                   excluded_op_names=None, calib_mode="entropy", calib_data=None,
                   num_calib_examples=None, quantized_dtype="int8", quantize_mode="smart",
                   quantize_granularity="tensor-wise", logger=None):
    """Quantizes a float32 model (symbol and parameter dicts) to INT8; returns
    ``(sym, arg_params, aux_params)`` with the supported regions running on
    the oneDNN backend in INT8 (load it elsewhere after
    ``mxamp.backends.get("onednn")``). The arguments are the reference's;
    weights always get per-output-channel scales, whichever
    ``quantize_granularity``, and ``quantize_mode`` 'full' and 'smart' both
    keep an operator other than Convolution / FullyConnected in INT8 only
    where its inputs are. The caller's objects are not modified."""
    if not isinstance(sym, mx.sym.Symbol):
        raise OptionTypeError(f"sym must be an mxnet.symbol.Symbol, got {type(sym).__name__}")
    check_params(arg_params, "arg_params")
    check_params(aux_params, "aux_params")
    for name, value, allowed in (("calib_mode", calib_mode, CALIB_MODES),
                                 ("quantized_dtype", quantized_dtype, QUANTIZED_DTYPES),
                                 ("quantize_mode", quantize_mode, QUANTIZE_MODES),
                                 ("quantize_granularity", quantize_granularity, GRANULARITIES)):
        _check_choice(name, value, allowed)
    if ctx != mx.cpu():
        raise OptionError(f"ctx must be mx.cpu(): the INT8 backend runs on the CPU, got {ctx}")
    logger = logger or log
    data_names = str_list(list(data_names), "data_names")
    missing = sorted(set(data_names) - set(sym.list_inputs()))
    if missing:
        raise OptionError(f"data_names {missing} are not inputs of the symbol; its inputs are "
                          f"{sorted(sym.list_inputs())}")
    excluded = excluded_nodes(sym, excluded_sym_names, None, excluded_op_names)
    # Batches hold data first, then labels (label_names), which calibration drops.
    stats = calibrate.collect(sym, arg_params, aux_params,
                              calibrate.tensor_names(sym, data_names),
                              data.batches_of(calib_data), data_names, calib_mode,
                              num_calib_examples)
    logger.info("INT8: %d tensors calibrated (%s), %d layers kept in float32", len(stats),
                calib_mode, len(excluded))
    marked = annotate(sym, stats, excluded, quantized_dtype)
    return backends.get("onednn").apply_backend(marked, arg_params, aux_params, compute="int8")


# MXNet 1.9.1 names the same function twice (its MKLDNN variant).
quantize_model_mkldnn = quantize_model


def quantize_net_v2(network, quantized_dtype="auto", quantize_mode="full",
                    quantize_granularity="tensor-wise", exclude_layers=None,
                    exclude_layers_match=None, exclude_operators=None, calib_data=None,
                    data_shapes=None, calib_mode="none", num_calib_examples=None, ctx=mx.cpu(),
                    LayerOutputCollector=None, logger=None):
    """Quantizes a Gluon HybridBlock to INT8; returns a new hybridized
    ``SymbolBlock`` whose regions run on the oneDNN backend. Calibration
    batches come from `calib_data` (a DataLoader, DataIter or list of
    batches); `data_shapes` (DataDesc or shapes) are needed only to run a
    block that has not run yet. The block is run as the reference does
    (hybridized, one forward pass), but its hybridization state is restored."""
    if not isinstance(network, HybridBlock):
        raise OptionTypeError(f"network must be a gluon HybridBlock, "
                              f"got {type(network).__name__}")
    if LayerOutputCollector is not None:
        raise OptionError("LayerOutputCollector (a custom calibration collector) is not "
                          "supported; use calib_mode='naive' or 'entropy'")
    _check_choice("calib_mode", calib_mode, CALIB_MODES)
    batches = data.batches_of(calib_data)
    first = None if batches is None else next(batches, None)
    batches = None if first is None else itertools.chain([first], batches)
    with data.traced(network, first, data_shapes):
        sym, arg_params, aux_params, data_names = gluon.model_of(network, "quantizing it")
    excluded = excluded_nodes(sym, exclude_layers, exclude_layers_match, exclude_operators)
    out, arg_params, aux_params = quantize_model(
        sym, arg_params, aux_params, data_names, (), ctx, sorted(excluded), None, calib_mode,
        batches, num_calib_examples, quantized_dtype, quantize_mode, quantize_granularity,
        logger)
    attrs = sym.attr_dict()
    block = gluon.symbol_block(out, [mx.sym.var(n, attr=attrs.get(n)) for n in data_names],
                               arg_params, aux_params, mx.cpu())
    block.hybridize(static_alloc=True, static_shape=True)  # keeps the regions' packed state
    return block


def quantize_net(network, quantized_dtype="auto", quantize_mode="full", exclude_layers=None,
                 exclude_layers_match=None, exclude_operators=None, calib_data=None,
                 data_shapes=None, calib_mode="none", num_calib_examples=None, ctx=mx.cpu(),
                 logger=None):
    """:func:`quantize_net_v2` with tensor-wise granularity, as in the reference."""
    return quantize_net_v2(network, quantized_dtype, quantize_mode, "tensor-wise",
                           exclude_layers, exclude_layers_match, exclude_operators, calib_data,
                           data_shapes, calib_mode, num_calib_examples, ctx, None, logger)
