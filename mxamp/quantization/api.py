"""INT8 post-training quantization, a drop-in for ``mxnet.contrib.quantization``
(MXNet 1.9.1) that runs on mxamp's oneDNN 3 backend.

The same three layers as conversion: options resolve into per-node decisions
(which layers stay float32), calibration gives every tensor a threshold
(``calibrate.py``), and the rewrite is the backend's partitioner, which turns
regions into INT8 oneDNN chains: activations quantized at region entry and
requantized between layers, weights quantized per output channel, float32 only
at region exits and around excluded layers.

What that backend cannot take (calib_mode 'none', a graph MXNet's own fusion
already made, quantize_model_mkldnn's MKL-DNN flow) is quantized into MXNet's
INT8 graph format instead (``mxnet_format.py``), with a WARNING saying why.
"""
import fnmatch
import itertools
import logging
from collections import Counter

import mxnet as mx
from mxnet.gluon import HybridBlock

from .. import backends, cpu, gluon
from ..backends.onednn import REST_DTYPES
# the node attributes the backend reads; which tensors calibration averages
from ..backends.onednn import mean_axes
from ..backends.onednn_int8 import AMAX, FLOAT, MIN
from ..convert.marker import check_float32_graph
from ..dtypes import normalize_dtype
from ..errors import OptionError, OptionTypeError, memory_for, mxnet_logs_to_logging
from ..graph import CAST_OPS, Graph, check_params, to_symbol
from ..policy.resolve import str_list
from ..registry import check_op_names
from . import calibrate, data, mxnet_format

log = logging.getLogger(__name__)

QUANTIZED_DTYPES = ("auto", "int8", "uint8")
QUANTIZE_MODES = ("full", "smart")
GRANULARITIES = ("tensor-wise", "channel-wise")
CALIB_MODES = ("none", "naive", "entropy")  # 'none': MXNet's graph format (run-time ranges)


def _check_choice(name, value, allowed):
    if value not in allowed:
        raise OptionError(f"{name} must be one of {', '.join(map(repr, allowed))}, "
                          f"got {value!r}")


def rest_dtype_unavailable(option="rest_dtype"):
    """The one line saying that bfloat16 for the layers outside INT8 is not
    available on this CPU (the API logs it, the command line prints it)."""
    return (f"{option} bfloat16 is not available on this CPU: oneDNN uses "
            f"{cpu.features('onednn')}, bfloat16 needs AVX512-BF16 or AMX; the layers outside "
            f"INT8 run in float32")


def rest_dtype_of(rest_dtype, logger=None):
    """The dtype the layers outside INT8 compute in, 'float32' or 'bfloat16'
    (a name or numpy dtype; OptionError otherwise). bfloat16 where oneDNN
    has no bfloat16 instructions is float32, with one WARNING saying so."""
    name = normalize_dtype(rest_dtype, REST_DTYPES, "rest_dtype")
    if name == "bfloat16" and not cpu.features("onednn").bf16:
        (logger or log).warning("INT8: %s", rest_dtype_unavailable())
        return "float32"
    return name


def excluded_nodes(sym, exclude_layers=None, exclude_layers_match=None, exclude_operators=None):
    """Names of the operator nodes of `sym` (a symbol or a
    :class:`mxamp.graph.Graph`) that stay float32: listed by name (each must
    exist), matching a pattern (a substring, as in the reference, or a shell
    wildcard), or running a listed operator."""
    nodes = [n for n in Graph.of(sym).nodes if n["op"] != "null"]
    names = {n["name"] for n in nodes}
    layers = str_list(exclude_layers or [], "exclude_layers")
    unknown = sorted(set(layers) - names)
    if unknown:
        raise OptionError(f"exclude_layers names {unknown}, which are not operator nodes of the "
                          f"model; its nodes are {sorted(names)[:20]}"
                          + (" ..." if len(names) > 20 else ""))
    patterns = str_list(exclude_layers_match or [], "exclude_layers_match")
    operators = set(check_op_names(str_list(exclude_operators or [], "exclude_operators"),
                                   "exclude_operators"))
    return {n["name"] for n in nodes
            if n["name"] in layers or n["op"] in operators
            or any(p in n["name"] or fnmatch.fnmatchcase(n["name"], p) for p in patterns)}


def annotate(sym, stats, excluded, quantized_dtype="auto"):
    """A copy of `sym` (a symbol or a :class:`mxamp.graph.Graph`), as a
    Graph, whose nodes carry what the backend reads: each calibrated
    tensor's threshold and minimum (by node, output 0; variables for data),
    and the float32 mark on `excluded` nodes. ``quantized_dtype`` 'int8'
    makes every activation signed, 'uint8' unsigned (negative values clip
    to 0, as in the reference), 'auto' follows the data."""
    graph = Graph.of(sym)
    marks = {}
    for nid, node in enumerate(graph.nodes):
        attrs = {FLOAT: "1"} if node["name"] in excluded else {}
        found = stats.get(node["name"])
        if found is not None:
            low = {"auto": found.min, "int8": -found.threshold,
                   "uint8": max(found.min, 0.0)}[quantized_dtype]
            attrs.update({AMAX: repr(float(found.threshold)), MIN: repr(float(low))})
        if attrs:
            marks[nid] = attrs
    return graph.marked(marks)


@mxnet_logs_to_logging()
def quantize_model(sym, arg_params, aux_params, data_names=("data",),
                   label_names=("softmax_label",), ctx=mx.cpu(), excluded_sym_names=None,
                   excluded_op_names=None, calib_mode="entropy", calib_data=None,
                   num_calib_examples=None, quantized_dtype="int8", quantize_mode="smart",
                   quantize_granularity="tensor-wise", logger=None, progress=False,
                   rest_dtype="float32"):
    """Quantize a float32 model, given as a symbol and parameter dicts, to INT8.

    The arguments are ``mxnet.contrib.quantization.quantize_model``'s. The
    supported parts run in regions of mxamp's oneDNN 3 backend: weights int8
    with one scale per output channel, each INT8 layer's bias corrected for
    the mean shift of its weights' rounding (see :doc:`/quantization`). With
    ``calib_mode="none"`` the result is MXNet's own INT8 graph format instead,
    with a WARNING saying why.

    Parameters
    ----------
    sym : mxnet.symbol.Symbol
        The float32 model (not modified, nor its dicts).
    arg_params, aux_params : dict of str to mxnet.nd.NDArray
        Its parameters.
    data_names, label_names : tuple of str
        The data inputs, and the label inputs (left out of calibration).
    ctx : mxnet.Context
        Must be the CPU.
    excluded_sym_names, excluded_op_names : list of str, optional
        Node names, and operators, kept out of INT8 (in `rest_dtype`). Names
        the model lacks are ignored with a WARNING, as the reference ignores
        them.
    calib_mode : str
        ``"entropy"`` (MXNet's KL-divergence threshold, from mxamp's histogram
        search), ``"naive"`` (the largest magnitude seen) or ``"none"``
        (ranges at run time: MXNet's own INT8 graph format).
    calib_data : mxnet.io.DataIter or list, optional
        The calibration batches (a DataIter, a DataLoader or a list of
        batches).
    num_calib_examples : int, optional
        The most examples calibration reads.
    quantized_dtype : str
        ``"auto"`` (u8 or s8 per tensor, from calibration), ``"int8"`` (every
        activation signed) or ``"uint8"`` (every one unsigned: negative values
        clip to 0).
    quantize_mode : str
        ``"smart"`` or ``"full"``: either keeps an operator other than
        Convolution / FullyConnected in INT8 only where its inputs are.
    quantize_granularity : str
        Accepted either way: weights always get one scale per output channel,
        never less accurate than one per tensor.
    logger : logging.Logger, optional
        Where the calls' INFO lines go (default: the module's logger).
    progress : bool
        (mxamp) A progress bar of the calibration batches on stderr.
    rest_dtype : str
        (mxamp) What the layers outside INT8 (excluded ones, the non-linear
        operators) compute in inside the regions: ``"float32"`` or
        ``"bfloat16"`` (on a CPU without bfloat16 instructions: float32, with
        a WARNING).

    Returns
    -------
    tuple
        ``(sym, arg_params, aux_params)``. Loading it in another process needs
        the backend's library: :func:`mxamp.load` loads it.

    Raises
    ------
    mxamp.OptionError
        For an invalid option, a model that is not float32, or (with
        ``calib_mode="none"``) INT8 convolutions that would read int8, which
        MXNet's graph cannot run.
    """
    return _quantize(sym, arg_params, aux_params, data_names, ctx, excluded_sym_names,
                     excluded_op_names, calib_mode, calib_data, num_calib_examples,
                     quantized_dtype, quantize_mode, quantize_granularity, logger,
                     progress=progress, rest_dtype=rest_dtype)


def _quantize(sym, arg_params, aux_params, data_names, ctx, excluded_sym_names,
              excluded_op_names, calib_mode, calib_data, num_calib_examples, quantized_dtype,
              quantize_mode, quantize_granularity, logger, reason=None, fuse=False,
              progress=False, rest_dtype="float32"):
    """quantize_model on mxamp's backend, its layers outside INT8 in
    `rest_dtype`, or for `reason` (or a reason of _needs_mxnet_format) in
    MXNet's INT8 graph format, then `fuse`d by MXNet's MKL-DNN pass before
    and after quantization. `sym` is a symbol or a
    :class:`mxamp.graph.Graph`: the graph is read once, and every stage
    (exclusion, calibration, annotation, partitioning, the report) reads it."""
    graph = Graph(sym) if isinstance(sym, mx.sym.Symbol) else sym
    data_names = _check_model(graph, arg_params, aux_params, data_names, ctx, calib_mode,
                              quantized_dtype, quantize_mode, quantize_granularity)
    excluded_op_names = check_op_names(_names(excluded_op_names, "excluded_op_names"),
                                       "excluded_op_names")
    logger = logger or log
    rest_dtype = normalize_dtype(rest_dtype, REST_DTYPES, "rest_dtype")
    reason = reason or _needs_mxnet_format(graph, calib_mode)
    if reason and rest_dtype != "float32":
        raise OptionError(f"rest_dtype={rest_dtype!r} is what mxamp's oneDNN regions compute "
                          f"in outside INT8, and this call makes none: {reason}")
    if reason:
        logger.warning("INT8: %s, so the model is quantized into MXNet's own INT8 graph "
                       "format and runs on MXNet's INT8 operators, not mxamp's oneDNN 3 "
                       "regions", reason)
        graph, excluded = _named_apart(graph, _present(graph, excluded_sym_names, logger),
                                       logger)
        return mxnet_format.quantize(
            graph.symbol, arg_params, aux_params, data_names, data.batches_of(calib_data),
            calib_mode, num_calib_examples, sorted(excluded),
            _names(excluded_op_names, "excluded_op_names"), quantized_dtype, quantize_mode,
            quantize_granularity, fuse)
    # Refused before calibration, not when partitioning after it.
    graph.check_extension("the oneDNN backend's partitioner")
    graph, excluded = _named_apart(graph, excluded_nodes(
        graph, _present(graph, excluded_sym_names, logger), None, excluded_op_names), logger)
    rest_dtype = rest_dtype_of(rest_dtype, logger)
    # Batches hold data first, then labels (label_names), which calibration drops.
    stats = calibrated(graph, arg_params, aux_params, data_names,
                       data.with_progress(data.batches_of(calib_data), progress,
                                          "calibration", "batch"),
                       calib_mode, num_calib_examples)
    logger.info("INT8: %d tensors calibrated (%s), %d layers kept out of INT8 (in %s)",
                len(stats), calib_mode, len(excluded), rest_dtype)
    marked = annotate(graph, stats, excluded, quantized_dtype)
    backend = backends.get("onednn")
    out, arg_params, aux_params = backend.partition(marked, arg_params, aux_params,
                                                    compute="int8", rest_dtype=rest_dtype,
                                                    data_means=data_means(stats))
    _report_float32(backend.left_outside(marked), excluded, logger)
    return out.symbol, arg_params, aux_params


def calibrated(sym, arg_params, aux_params, data_names, batches, calib_mode,
               num_calib_examples):
    """{node name: TensorStats} of the tensors INT8 quantization calibrates
    in `sym` (a symbol or a Graph), those that layers with weights read as
    data with their channel means (:func:`data_means`)."""
    graph = Graph.of(sym)
    names = calibrate.tensor_names(graph, data_names)
    axes = mean_axes(graph)
    return calibrate.collect(graph, arg_params, aux_params, names, batches, data_names,
                             calib_mode, num_calib_examples,
                             {t: axes[n] for t, n in names.items() if n in axes})


def data_means(stats):
    """{node name: channel means} of :func:`calibrated`'s `stats`: what the
    backend corrects INT8 layers' biases with."""
    return {name: found.mean for name, found in stats.items() if found.mean is not None}


def int8_layers():
    """The operators whose layers start INT8 in the backend, read from its
    operator table: those that quantize their calibrated data inputs
    (Convolution, FullyConnected, batch_dot); the others follow their
    inputs, so excluding one changes nothing."""
    table = backends.get("onednn").operator_table()
    return frozenset(op for op, row in table.items() if row.int8 == "quantizes")


def _report_float32(outside, excluded, logger):
    """One WARNING naming, with counts, the operators the backend left
    outside its INT8 regions (`outside`: (name, op) each) that the caller
    did not exclude."""
    left = Counter(op for name, op in outside if op not in CAST_OPS and name not in excluded)
    if left:
        starts = " / ".join(sorted(int8_layers()))
        logger.warning("INT8: %d operators stay float32 outside the oneDNN regions (%s): "
                       "INT8 starts at %s layers with a calibrated input, and other operators "
                       "run INT8 only inside a region where their inputs are INT8",
                       sum(left.values()),
                       ", ".join(f"{op} x{k}" for op, k in sorted(left.items())), starts)


def _check_model(graph, arg_params, aux_params, data_names, ctx, calib_mode, quantized_dtype,
                 quantize_mode, quantize_granularity):
    """Checks quantize_model's arguments; returns data_names as a list."""
    if not isinstance(graph, Graph):
        raise OptionTypeError(f"sym must be an mxnet.symbol.Symbol, got {type(graph).__name__}")
    sym = graph.symbol
    check_params(arg_params, "arg_params")
    check_params(aux_params, "aux_params")
    check_float32_graph(graph.json, "quantize", {**arg_params, **aux_params})
    for name, value, allowed in (("calib_mode", calib_mode, CALIB_MODES),
                                 ("quantized_dtype", quantized_dtype, QUANTIZED_DTYPES),
                                 ("quantize_mode", quantize_mode, QUANTIZE_MODES),
                                 ("quantize_granularity", quantize_granularity, GRANULARITIES)):
        _check_choice(name, value, allowed)
    if ctx != mx.cpu():
        raise OptionError(f"ctx must be mx.cpu(): INT8 runs on the CPU here, got {ctx}")
    data_names = str_list(list(data_names), "data_names")
    missing = sorted(set(data_names) - set(sym.list_inputs()))
    if missing:
        raise OptionError(f"data_names {missing} are not inputs of the symbol; its inputs are "
                          f"{sorted(sym.list_inputs())}")
    return data_names


def _needs_mxnet_format(graph, calib_mode):
    """Why `graph` cannot go to mxamp's INT8 backend (None if it can)."""
    if calib_mode == "none":
        return "calib_mode='none' asks for ranges computed at run time, which mxamp's " \
               "backend does not do (it needs calibrated thresholds)"
    if mxnet_format.is_fused(graph):
        return f"the graph holds nodes MXNet's oneDNN fusion made " \
               f"({mxnet_format.FUSED_PREFIX}*), which mxamp's backend does not read"
    return None


def _present(graph, excluded_sym_names, logger):
    """The names of `excluded_sym_names` that are nodes of `graph`; as in the
    reference, others are ignored (with a WARNING naming them)."""
    names = _names(excluded_sym_names, "excluded_sym_names")
    nodes = {n["name"] for n in graph.nodes}
    unknown = sorted(set(names) - nodes)
    if unknown:
        logger.warning("INT8: excluded_sym_names %s are not nodes of the model: ignored",
                       unknown)
    return [n for n in names if n in nodes]


def named_apart(sym):
    """`sym` (a symbol or a :class:`mxamp.graph.Graph`) as a Graph in which no
    operator is named as an input or an earlier node, and {node index: new
    name} of the operators renamed ``<name>_<k>``: MXNet reads a tensor by
    its node's name (internal outputs), so calibration cannot tell such
    nodes apart. The Graph is `sym`'s own where nothing is renamed."""
    graph = Graph.of(sym)
    nodes = graph.nodes
    taken = {n["name"] for n in nodes}
    seen = {n["name"] for n in nodes if n["op"] == "null"}
    renamed = {}
    for nid, node in enumerate(nodes):
        if node["op"] != "null" and node["name"] in seen:
            k = 1
            while f"{node['name']}_{k}" in taken:
                k += 1
            renamed[nid] = f"{node['name']}_{k}"
            taken.add(renamed[nid])
        seen.add(node["name"])
    if not renamed:
        return graph, renamed
    json = {**graph.json, "nodes": [{**n, "name": renamed[nid]} if nid in renamed else n
                                    for nid, n in enumerate(nodes)]}
    return Graph(to_symbol(json), json), renamed


def _named_apart(graph, names, logger):
    """:func:`named_apart`'s Graph, and `names` (of nodes of `graph`: every
    node of such a name) as it names them; one WARNING names what changed."""
    apart, renamed = named_apart(graph)
    if renamed:
        logger.warning("INT8: node names repeat (MXNet reads tensors by name, so calibration "
                       "needs them apart); in the INT8 model %s",
                       ", ".join(f"{graph.nodes[nid]['name']!r} ({graph.nodes[nid]['op']}, "
                                 f"node {nid}) is {name!r}" for nid, name in renamed.items()))
    names = set(names)
    return apart, {n["name"] for old, n in zip(graph.nodes, apart.nodes) if old["name"] in names}


def _names(value, what):
    return str_list(value or [], what)


@mxnet_logs_to_logging()
def quantize_model_mkldnn(sym, arg_params, aux_params, data_names=("data",),
                          label_names=("softmax_label",), ctx=mx.cpu(), excluded_sym_names=None,
                          excluded_op_names=None, calib_mode="entropy", calib_data=None,
                          num_calib_examples=None, quantized_dtype="int8",
                          quantize_mode="smart", quantize_granularity="tensor-wise",
                          logger=None):
    """The reference's MKL-DNN flow, in MXNet's INT8 graph format.

    :func:`quantize_model` of the graph MXNet's ``MKLDNN_QUANTIZE`` pass
    fused, whose quantized result that pass fuses again; calibrated by mxamp.

    Parameters
    ----------
    sym, arg_params, aux_params, data_names, label_names, ctx : optional
        As for :func:`quantize_model`.
    excluded_sym_names, excluded_op_names, calib_mode, calib_data : optional
        As for :func:`quantize_model`.
    num_calib_examples, quantized_dtype, quantize_mode : optional
        As for :func:`quantize_model`.
    quantize_granularity, logger : optional
        As for :func:`quantize_model`.

    Returns
    -------
    tuple
        ``(sym, arg_params, aux_params)``.
    """
    return _quantize(sym, arg_params, aux_params, data_names, ctx, excluded_sym_names,
                     excluded_op_names, calib_mode, calib_data, num_calib_examples,
                     quantized_dtype, quantize_mode, quantize_granularity, logger,
                     reason="quantize_model_mkldnn asks for MXNet's MKL-DNN INT8 graph "
                            "(mxamp's own: quantize_model)", fuse=True)


@mxnet_logs_to_logging()
def quantize_net_v2(network, quantized_dtype="auto", quantize_mode="full",
                    quantize_granularity="tensor-wise", exclude_layers=None,
                    exclude_layers_match=None, exclude_operators=None, calib_data=None,
                    data_shapes=None, calib_mode="none", num_calib_examples=None, ctx=mx.cpu(),
                    LayerOutputCollector=None, logger=None, progress=False,
                    rest_dtype="float32"):
    """Quantize a Gluon block to INT8.

    The arguments are ``mxnet.contrib.quantization.quantize_net_v2``'s. A
    block that has not run is traced as the reference does (hybridized, one
    forward pass), and its hybridization state is put back.

    Parameters
    ----------
    network : mxnet.gluon.HybridBlock
        The float32 block; it is not modified.
    quantized_dtype, quantize_mode, quantize_granularity : str
        As for :func:`quantize_model`.
    exclude_layers : list of str, optional
        Layer (node) names kept out of INT8; each must be in the model.
    exclude_layers_match : list of str, optional
        Substrings (as in the reference) or shell wildcards of layer names
        kept out of INT8.
    exclude_operators : list of str, optional
        Operators kept out of INT8.
    calib_data : mxnet.gluon.data.DataLoader or mxnet.io.DataIter or list
        The calibration batches.
    data_shapes : list, optional
        ``DataDesc`` or shapes: only to run a block that has not run yet.
    calib_mode : str
        As for :func:`quantize_model`; ``"none"`` (the reference's default)
        gives MXNet's own fused INT8 graph.
    num_calib_examples : int, optional
        The most examples calibration reads.
    ctx : mxnet.Context
        Must be the CPU.
    LayerOutputCollector : object, optional
        A custom collector: refused (:class:`mxamp.OptionError`).
    logger, progress, rest_dtype : optional
        As for :func:`quantize_model`.

    Returns
    -------
    mxnet.gluon.SymbolBlock
        A hybridized block whose regions run on the oneDNN backend (static
        allocation: their packed weights live across calls).
    """
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
    with memory_for("running the block once to read its graph"), \
            data.traced(network, first, data_shapes):
        sym, arg_params, aux_params, data_names = gluon.model_of(network, "quantizing it")
    graph = Graph(sym)
    excluded = excluded_nodes(graph, exclude_layers, exclude_layers_match, exclude_operators)
    # On MXNet's format (calib_mode 'none'), MXNet's MKL-DNN fusion, as the reference.
    out, arg_params, aux_params = _quantize(
        graph, arg_params, aux_params, data_names, ctx, sorted(excluded), None, calib_mode,
        batches, num_calib_examples, quantized_dtype, quantize_mode, quantize_granularity,
        logger, fuse=True, progress=progress, rest_dtype=rest_dtype)
    attrs = sym.attr_dict()
    with memory_for("loading the INT8 model into a block"):
        block = gluon.symbol_block(out, [mx.sym.var(n, attr=attrs.get(n)) for n in data_names],
                                   arg_params, aux_params, mx.cpu())
    block.hybridize(static_alloc=True, static_shape=True)  # keeps the regions' packed state
    return block


def quantize_net(network, quantized_dtype="auto", quantize_mode="full", exclude_layers=None,
                 exclude_layers_match=None, exclude_operators=None, calib_data=None,
                 data_shapes=None, calib_mode="none", num_calib_examples=None, ctx=mx.cpu(),
                 logger=None, rest_dtype="float32"):
    """:func:`quantize_net_v2` with tensor-wise granularity, as in the reference.

    Parameters
    ----------
    network, quantized_dtype, quantize_mode : optional
        As for :func:`quantize_net_v2`.
    exclude_layers, exclude_layers_match, exclude_operators : optional
        As for :func:`quantize_net_v2`.
    calib_data, data_shapes, calib_mode, num_calib_examples : optional
        As for :func:`quantize_net_v2`.
    ctx, logger, rest_dtype : optional
        As for :func:`quantize_net_v2`.

    Returns
    -------
    mxnet.gluon.SymbolBlock
    """
    return quantize_net_v2(network, quantized_dtype, quantize_mode, "tensor-wise",
                           exclude_layers, exclude_layers_match, exclude_operators, calib_data,
                           data_shapes, calib_mode, num_calib_examples, ctx, None, logger,
                           rest_dtype=rest_dtype)


# The reference's lower-level functions, in MXNet's INT8 graph format.
def _quantize_symbol(sym, ctx, excluded_symbols=None, excluded_operators=None,
                     offline_params=None, quantized_dtype="int8", quantize_mode="smart",
                     quantize_granularity="tensor-wise"):
    """MXNet's quantization pass: ``(quantized symbol, tensors to calibrate)``."""
    return mxnet_format.quantize_symbol(sym, ctx, excluded_symbols, excluded_operators,
                                        offline_params, quantized_dtype, quantize_mode,
                                        quantize_granularity)


def _quantize_params(qsym, params, th_dict):
    """The parameters of `qsym`: weights and biases quantized to int8."""
    return mxnet_format.quantize_params(qsym, params, th_dict)


def _calibrate_quantized_sym(qsym, th_dict):
    """`qsym` with the ranges {tensor: (min, max)} as calibration attributes."""
    return mxnet_format.set_thresholds(qsym, th_dict)


def _smooth_distribution(p, eps=0.0001):
    """`p` with its zeros raised to `eps`, taken off the other entries."""
    return mxnet_format.smooth_distribution(p, eps)


def _get_optimal_threshold(hist_data, quantized_dtype, num_quantized_bins=255):
    """``(min, max, threshold, divergence)`` of a histogram record."""
    return mxnet_format.optimal_threshold(hist_data, quantized_dtype, num_quantized_bins)


def _get_optimal_thresholds(hist_dict, quantized_dtype, num_quantized_bins=255, logger=None):
    """{tensor: (min, max)} entropy ranges of histogram records."""
    result = mxnet_format.optimal_thresholds(hist_dict, quantized_dtype, num_quantized_bins)
    (logger or log).debug("entropy thresholds: %s", result)
    return result


combine_histogram = mxnet_format.combine_histogram


def quantize_graph(sym, arg_params, aux_params, ctx=mx.cpu(), excluded_sym_names=None,
                   excluded_op_names=None, calib_mode="entropy", quantized_dtype="int8",
                   quantize_mode="full", quantize_granularity="tensor-wise",
                   LayerOutputCollector=None, logger=None):
    """MXNet's quantization pass, without calibration (MXNet's INT8 format).

    Parameters
    ----------
    sym, arg_params, aux_params
        The float32 model.
    ctx : mxnet.Context
        Must be the CPU.
    excluded_sym_names, excluded_op_names : list of str, optional
        Node names, and operators, left in float32.
    calib_mode : str
        ``"entropy"``, ``"naive"``, ``"none"`` or ``"customize"`` (with
        `LayerOutputCollector`).
    quantized_dtype, quantize_mode, quantize_granularity : str
        As for :func:`quantize_model`.
    LayerOutputCollector : object, optional
        The collector for ``calib_mode="customize"``.
    logger : logging.Logger, optional
        Where the INFO line goes.

    Returns
    -------
    tuple
        ``(qsym, qarg_params, aux_params, collector)``: the collector (None for
        ``"none"``) is a monitor callback to run over the float32 model (bound
        without MXNet's graph fusion) before :func:`calib_graph`.
    """
    _check_choice("calib_mode", calib_mode, CALIB_MODES + ("customize",))
    if calib_mode == "customize" and LayerOutputCollector is None:
        raise OptionError("calib_mode='customize' needs a LayerOutputCollector")
    qsym, wanted = _quantize_symbol(sym, ctx, _names(excluded_sym_names, "excluded_sym_names"),
                                    _names(excluded_op_names, "excluded_op_names"),
                                    list(arg_params), quantized_dtype, quantize_mode,
                                    quantize_granularity)
    collector = {"none": None, "customize": LayerOutputCollector}.get(
        calib_mode, mxnet_format.MonitorCollector(wanted, calib_mode))
    (logger or log).info("INT8: %d tensors to calibrate (%s)", len(wanted), calib_mode)
    return qsym, _quantize_params(qsym, arg_params, {}), aux_params, collector


def calib_graph(qsym, arg_params, aux_params, collector, calib_mode="entropy",
                quantized_dtype="int8", logger=logging):
    """Calibrate a graph :func:`quantize_graph` made.

    Parameters
    ----------
    qsym : mxnet.symbol.Symbol
        The quantized graph.
    arg_params, aux_params : dict of str to mxnet.nd.NDArray
        Its parameters.
    collector : object
        The collector :func:`quantize_graph` returned, filled by a run over
        the float32 model.
    calib_mode : str
        ``"entropy"``, ``"naive"`` or ``"customize"``.
    quantized_dtype : str
        As for :func:`quantize_model`.
    logger : logging.Logger, optional
        Where the INFO line goes (None: nowhere).

    Returns
    -------
    tuple
        ``(qsym, qarg_params, aux_params)``.
    """
    _check_choice("calib_mode", calib_mode, ("naive", "entropy", "customize"))
    if calib_mode == "entropy":
        th_dict = _get_optimal_thresholds(collector.hist_dict, quantized_dtype)
    else:
        th_dict = collector.min_max_dict
    if logger:
        logger.info("INT8: %d tensors calibrated (%s)", len(th_dict), calib_mode)
    qsym = _calibrate_quantized_sym(qsym, th_dict)
    return qsym, _quantize_params(qsym, arg_params, th_dict), aux_params
