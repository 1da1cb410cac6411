"""The conversion API, a drop-in for ``mxnet.contrib.amp.convert_symbol`` /
``convert_model`` / ``convert_bucketing_module``."""
import collections
import dataclasses
import logging
import math
import warnings

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError

from .. import cpu
from ..dtypes import DTYPE_CODES, FLOAT32, as_numpy, as_numpy_all, to_code, to_numpy
from ..errors import OptionError, OptionTypeError, mxnet_logs_to_logging, mxnet_message
from ..graph import (body_summaries, check_graph, check_param_shapes, check_params,
                     graph_json, infer_entry_types, input_symbols, summarize)
from ..policy import Category, list_lp16_fp32_ops
from . import probe
from .decide import decide
from .marker import MARKER, check_float32_graph
from .options import ConversionOptions
from .wire import KEEP, LOW, run_pass

log = logging.getLogger(__name__)


def _check_symbol(sym):
    if not isinstance(sym, mx.sym.Symbol):
        raise OptionTypeError(f"sym must be an mxnet.symbol.Symbol, got {type(sym).__name__}")
    try:
        graph = graph_json(sym)
    except MXNetError as err:  # MXNet's serializer fails on a cyclic graph
        raise ValueError(f"the symbol's graph cannot be read (is it cyclic, e.g. in a "
                         f"control-flow subgraph?): {mxnet_message(err)}") from None
    check_graph(graph)
    check_float32_graph(graph, "convert")  # before MXNet is asked anything about its nodes
    if all(n["op"] == "null" for n in graph["nodes"]):
        raise ValueError(f"the symbol has no operators, only the inputs "
                         f"{sym.list_inputs()}: there is nothing to convert")
    return graph


def _default_data_names(sym):
    """Inputs without a ``__dtype__`` attribute, as ``mxnet.contrib.amp`` assumes."""
    attrs = sym.attr_dict()
    return [n for n in sym.list_inputs() if "__dtype__" not in attrs.get(n, {})]


def _convert(sym, graph, policy, options, param_dtypes, backend_nodes=frozenset()):
    """Runs the decision pass and the C++ pass; returns the converted symbol and
    {input name: dtype code} of its inputs as far as MXNet can infer them.
    `options` has its data_names and ctx filled in for this model; `policy`
    is its policy as the model's parameters refine it."""
    data_names, ctx = list(options.data_names), options.ctx
    inputs = sym.list_inputs()
    unknown = sorted(set(data_names) - set(inputs))
    if unknown:
        raise OptionError(f"data_names {unknown} are not inputs of the symbol; its inputs are "
                         f"{sorted(inputs)}")
    missing = sorted(policy.excluded - {n["name"] for n in graph["nodes"]})
    if missing:
        warnings.warn(f"excluded_sym_names not found in the graph: {missing}", stacklevel=3)
    declared = {n["name"] for n in graph["nodes"]
                if n["op"] == "null" and "__dtype__" in n.get("attrs", {})}
    data_types = {n: FLOAT32 for n in data_names if n not in declared}
    entry_types = infer_entry_types(sym, {**param_dtypes, **data_types})
    target = DTYPE_CODES[policy.target_dtype]
    if not policy.keep_io_types:
        data_types = {n: target for n in data_types}
    decisions = decide(graph, policy, entry_types, data_names, options.cast_optional_params,
                       ctx, options.measure_kernels, backend_nodes)
    _store_pulled_params_low(graph, decisions, data_names)

    out = run_pass(sym, graph, decisions, policy.target_dtype)

    # Every parameter gets its dtype as __dtype__, as in the reference: a
    # float32 weight read only through an amp_cast has no other way to tell
    # Module.bind / simple_bind its dtype.
    params = {n["name"]: max(entry_types.get((nid, 0), -1), FLOAT32)  # unknown: float32
              for nid, n in enumerate(graph["nodes"])
              if n["op"] == "null" and n["name"] not in data_types}
    params.update((n, target) for n in decisions.low_params)
    input_types = {**params, **data_types}
    _mark_inputs(out, policy.target_dtype, {
        n: str(t) for n, t in input_types.items() if n in params or t == target})
    _log_summary(out, graph, policy, decisions, ctx)
    return out, input_types


def _mark_inputs(sym, target_dtype, dtypes):
    """Gives every input of `sym`, a symbol the pass made (no node of it is
    the caller's), the marker attribute and, per `dtypes` ({name: dtype
    code as str}), its __dtype__: set in place, not by a round trip through
    the graph's JSON form, which costs more than the pass's own."""
    for variable in input_symbols(sym):
        attrs = {MARKER: target_dtype}
        if variable.name in dtypes:
            attrs["__dtype__"] = dtypes[variable.name]
        variable._set_attr(**attrs)


def _store_pulled_params_low(graph, decisions, data_names):
    """Parameters that only dtype-neutral operators read, each pulling it to
    the target dtype (a neutral FullyConnected after a low Convolution), are
    stored low and read without a cast: the reference gives them no cast and
    its type inference makes them low, so its convert_model returns them low
    whatever cast_optional_params (MXNet's test_module_backward_compatibility
    asserts so). A control-flow node is not such a reader: what its bodies
    read low is cast once before it, as the body walk decided."""
    uses = collections.defaultdict(list)
    for nid, node in enumerate(graph["nodes"]):
        for slot, e in enumerate(node["inputs"]):
            uses[e[0]].append((nid, slot))
    heads = {h[0] for h in graph["heads"]}
    for vid, reads in sorted(uses.items()):
        node = graph["nodes"][vid]
        if node["op"] != "null" or node["name"] in data_names or vid in heads or \
                node["name"] in decisions.low_params:
            continue
        if all(decisions.categories.get(nid) is Category.NEUTRAL
               and "subgraphs" not in graph["nodes"][nid]
               and decisions.nodes.get(nid, "")[slot:slot + 1] == LOW for nid, slot in reads):
            for nid, slot in reads:
                codes = decisions.nodes.pop(nid)
                codes = codes[:slot] + KEEP + codes[slot + 1:]
                if codes.strip(KEEP):  # as decide records them: only nodes with a cast
                    decisions.nodes[nid] = codes
            decisions.low_params.append(node["name"])


def _log_summary(out, graph, policy, decisions, ctx):
    """One INFO line of what the conversion (`out`) did; then, once per
    operator with counts, the operators kept in float32 against the lists
    (at WARNING where the device lacks kernels: the user asked for a
    low-precision model and gets less of one) and those in none of the lists
    (TVM reports these too)."""
    if log.isEnabledFor(logging.INFO):  # only these lines read the converted graph
        _log_casts(graph_json(out), policy, decisions)
    for reason, ops in decisions.fallback_report(graph).items():
        counted = _counted(ops)
        if reason == probe.corruption_reason(policy.target_dtype):
            # Kept float32 on every device: no option gives these in the target dtype.
            log.warning("mxamp %s: kept in float32 (%s): %s", policy.target_dtype, reason,
                        counted)
        elif reason.startswith("no ") or "slower than float32" in reason:
            # `kept_float32` lets a caller with options of its own (the
            # command line) give this advice in its terms.
            log.warning("mxamp %s for %s: kept in float32 (%s): %s. For the full %s graph "
                        "(to run on a device that has fast kernels), convert without ctx "
                        "(convert_symbol / convert_model) or with target_device='any' "
                        "(convert_hybrid_block)", policy.target_dtype, ctx, reason, counted,
                        policy.target_dtype,
                        extra={"kept_float32": (policy.target_dtype, reason, counted)})
        else:
            log.info("kept in float32 (%s): %s", reason, counted)
    listed = policy.low | policy.fp32 | policy.widest | policy.follow | \
        policy.conditions.keys() | set(list_lp16_fp32_ops(policy.target_dtype))
    unlisted = collections.Counter(graph["nodes"][nid]["op"] for nid in decisions.categories
                                   if graph["nodes"][nid]["op"] not in listed)
    if unlisted:
        log.info("operators in none of the %s lists, run in their input's dtype: %s",
                 policy.target_dtype, _counted(unlisted))


def _log_casts(converted, policy, decisions):
    """_log_summary's lines of the casts the pass inserted in `converted`."""
    by_category = collections.Counter(c.value for c in [*decisions.categories.values(),
                                                        *decisions.body_categories.values()])
    log.info("mxamp %s: %s; casts inserted %s; params stored in %s: %d",
             policy.target_dtype, dict(sorted(by_category.items())), summarize(converted),
             policy.target_dtype, len(decisions.low_params))
    for body, counts in body_summaries(converted).items():
        log.info("casts inserted inside %s: %s", body, counts)


def _counted(ops):
    return ", ".join(f"{op} x{n}" for op, n in sorted(ops.items()))


@mxnet_logs_to_logging()
def convert_symbol(sym, target_dtype="float16", target_dtype_ops=None, fp32_ops=None,
                   conditional_fp32_ops=None, excluded_sym_names=None, data_names=None,
                   cast_optional_params=False, widest_dtype_ops=None, ctx=None,
                   keep_io_types=True, follow_ops=None, rules=None, input_shapes=None,
                   measure_kernels=False):
    """Convert a float32 symbol to mixed precision.

    Returns a copy of `sym` with ``amp_cast`` / ``amp_multicast`` nodes
    inserted so that the listed operators run in `target_dtype`. The
    arguments are those of ``mxnet.contrib.amp.convert_symbol``; the ones
    marked (mxamp) are extensions.

    Parameters
    ----------
    sym : mxnet.symbol.Symbol
        The float32 model. It is not modified.
    target_dtype : str
        ``"float16"`` or ``"bfloat16"`` (or a short name: ``"fp16"``, ``"bf16"``).
    target_dtype_ops, fp32_ops, conditional_fp32_ops : list, optional
        Operators that run in `target_dtype`, operators that stay float32, and
        ``(op, attribute, [values])`` records that send an operator to float32.
        Each list given replaces the default list of its kind
        (:func:`mxamp.list_lp16_ops` and its siblings).
    excluded_sym_names : list of str, optional
        Node names kept in float32.
    data_names : list of str, optional
        The inputs fed in float32 (default: the inputs without a
        ``__dtype__`` attribute).
    cast_optional_params : bool
        Store a parameter in low precision when every reader wants it so,
        which removes its cast at run time.
    widest_dtype_ops : list, optional
        (mxamp) Replaces the default list of operators that run in the
        widest float dtype among their inputs.
    ctx : mxnet.Context, optional
        (mxamp) The device the graph is for. Operators without a
        `target_dtype` kernel there stay float32 (found by running each
        once), and so do operators that would run low only because their
        inputs arrive low where that kernel is more than 4x slower than
        float32 (on the CPU: from the speed data shipped per CPU class). By
        default the graph is for any device.
    keep_io_types : bool
        (mxamp) False makes the data inputs and the outputs low precision
        instead of float32.
    follow_ops : list of str, optional
        (mxamp) Operators that run low only when every float input already is
        (category FOLLOW, see :doc:`/policies`).
    rules : list of mxamp.Rule, optional
        (mxamp) Per-node rules (see :class:`mxamp.Rule`).
    input_shapes : dict, optional
        (mxamp) ``{input name: shape}``, the shapes rules see.
    measure_kernels : bool
        (mxamp) With `ctx`, time the kernels on this machine instead of
        reading the shipped speed data.

    Returns
    -------
    mxnet.symbol.Symbol
        The converted symbol. MXNet's ``Symbol.tojson()`` and ``save()`` drop
        its ``amp_cast`` nodes unless called with ``remove_amp_cast=False``.

    Raises
    ------
    mxamp.OptionError, mxamp.OptionTypeError
        For an invalid option, naming it and what is allowed.
    """
    options = ConversionOptions(
        target_dtype=target_dtype, target_dtype_ops=target_dtype_ops, fp32_ops=fp32_ops,
        conditional_fp32_ops=conditional_fp32_ops, excluded_sym_names=excluded_sym_names,
        data_names=data_names, cast_optional_params=cast_optional_params,
        widest_dtype_ops=widest_dtype_ops, ctx=ctx, keep_io_types=keep_io_types,
        follow_ops=follow_ops, rules=rules, input_shapes=input_shapes,
        measure_kernels=measure_kernels)
    return convert_symbol_with(sym, options)


def convert_symbol_with(sym, options):
    """:func:`convert_symbol` of `sym` with its options built
    (:class:`~mxamp.convert.options.ConversionOptions`)."""
    graph = _check_symbol(sym)
    if options.data_names is None:
        options = dataclasses.replace(options, data_names=_default_data_names(sym))
    return _convert(sym, graph, options.policy, options, {})[0]


def _plain(array):
    """A copy of `array` in MXNet's default layout. MXNet's oneDNN kernels
    keep a weight they have run on in a blocked layout (grouped and depthwise
    convolutions' weights, for one), which amp_cast cannot reorder into
    bfloat16 ("could not create a primitive descriptor for a reorder
    primitive"); a copy reorders to the default layout. The caller's array
    is left as it is."""
    return array.copy()


def _cast_params(params, input_types):
    """A new dict with each array in the dtype the converted graph wants."""
    result = {}
    for name, array in params.items():
        code = input_types.get(name, -1)
        if code < 0 or to_code(array.dtype) == code:
            result[name] = array
        elif code in DTYPE_CODES.values() and to_code(array.dtype) in DTYPE_CODES.values():
            result[name] = mx.nd.amp_cast(_plain(array), dtype=to_numpy(code))
        else:
            result[name] = _plain(array).astype(to_numpy(code))
    return result


def _check_model_params(sym, arg_params, aux_params):
    """Parameters given as dicts of arrays, each in the dict of its kind, in
    float32, and a value for every auxiliary state: MXNet takes anything
    until it binds, and then says little."""
    check_params(arg_params, "arg_params")
    check_params(aux_params, "aux_params")
    in_aux = sorted(set(arg_params) & set(sym.list_auxiliary_states()))
    in_arg = sorted(set(aux_params) & set(sym.list_arguments()))
    misplaced = ([f"arg_params holds the auxiliary states {in_aux}"] if in_aux else []) + \
        ([f"aux_params holds the arguments {in_arg}"] if in_arg else [])
    if misplaced:
        raise OptionError(f"{' and '.join(misplaced)} of the symbol: give each parameter in "
                          "the dict of its kind (sym.list_arguments() / "
                          "list_auxiliary_states())")
    inputs = set(sym.list_inputs())
    wide = sorted(n for n, a in {**arg_params, **aux_params}.items()
                  if n in inputs and a.dtype == np.float64)
    if wide:
        raise OptionTypeError(f"the parameters {_listed(wide)} are float64; mxamp converts "
                              "float32 models (float32 and integer parameters): cast the model "
                              "to float32 first (Gluon: block.cast('float32'))")
    missing_aux = sorted(set(sym.list_auxiliary_states()) - aux_params.keys())
    if missing_aux:
        raise OptionError(f"aux_params has no value for the auxiliary states {missing_aux}")


def _listed(names, limit=5):
    shown = ", ".join(names[:limit])
    return f"[{shown}{f' and {len(names) - limit} more' if len(names) > limit else ''}]"


# How far a float32 parameter's copy in a low dtype may be off (relative L2).
UNFIT_ERROR = 0.01
# Per low dtype: its largest finite value, its least normal value, and one
# step of its significand against a value in its normal range (2^-bits).
_RANGES = {"float16": ((2 - 2.0 ** -10) * 2.0 ** 15, 2.0 ** -14, 2.0 ** -10),
           "bfloat16": ((2 - 2.0 ** -7) * 2.0 ** 127, 2.0 ** -126, 2.0 ** -7)}


def _unfit_params(params, dtype):
    """Names of the float32 parameters that `dtype` cannot hold: a finite
    value turns infinite, or the copy is more than 1% off (relative L2; values
    below the dtype's normal range lose their digits or become 0). Rounding
    alone is at most 0.05% in float16 and 0.4% in bfloat16. Most parameters
    are settled by their sums of squares, which MXNet computes in place; the
    rest are read."""
    floats = [(n, a) for n, a in sorted(params.items()) if to_code(a.dtype) == FLOAT32]
    sums = _sums_of_squares([a for _, a in floats])
    unsure = [(n, a) for (n, a), s in zip(floats, sums)
              if s is None or not _fits_by_sum_of_squares(s, a.size, dtype)]
    values = as_numpy_all([a for _, a in unsure])
    return [name for (name, array), x in zip(unsure, values)
            if not _fits_surely(x.reshape(-1), dtype) and not _fits_when_cast(array, x, dtype)]


def _sums_of_squares(arrays):
    """Each array's sum of squares as MXNet's multi_sum_sq adds it up in
    float32, one call per context, without copying the arrays to numpy
    (MXNet still copies a weight in a oneDNN layout into the plain one to
    read it); None for an array that is not a dense NDArray."""
    groups = collections.defaultdict(list)
    for i, array in enumerate(arrays):
        if isinstance(array, mx.nd.NDArray) and array.stype == "default" and array.size:
            groups[array.context].append(i)
    sums = [None] * len(arrays)
    for indices in groups.values():
        values = mx.nd.multi_sum_sq(*(arrays[i] for i in indices), num_arrays=len(indices))
        for i, value in zip(indices, as_numpy(values).tolist()):
            sums[i] = value
    return sums


# float32's unit roundoff: a rounded product or sum is within (1 +- U) of the exact one.
_UNIT_ROUNDOFF = 2.0 ** -24


def _fits_by_sum_of_squares(sum_sq, size, dtype):
    """True when a float32 array of `size` values, whose sum of squares
    added up in float32 in any order is `sum_sq`, surely passes
    _unfit_params' test (False: read it and see). The rounded sum of
    nonnegative terms never falls below its largest term, so the largest
    |x|^2 is at most sum_sq / (1 - U); it exceeds the true sum by at most
    (1 + U)^(2 size) < exp(2 size U). With those, _fits_surely's bound holds
    for n = size values below the normal range. NaN and infinite sums, and 0
    (all zeros or all tiny), are read."""
    largest, least, margin = _bounds(dtype)
    if not 0 < sum_sq <= largest ** 2 * (1 - _UNIT_ROUNDOFF):
        return False
    return size * least ** 2 <= margin * sum_sq * math.exp(-2 * size * _UNIT_ROUNDOFF)


def _fits_when_cast(array, x, dtype):
    """_unfit_params' test of `array` (`x`: its values), by casting it."""
    x = x.astype(np.float64)
    y = as_numpy(mx.nd.amp_cast(_plain(array), dtype=to_numpy(DTYPE_CODES[dtype])))
    y = y.astype(np.float64)
    finite = np.isfinite(x)
    norm = np.linalg.norm(x[finite])
    return not np.isinf(y[finite]).any() and \
        np.linalg.norm(y[finite] - x[finite]) <= UNFIT_ERROR * norm


def _bounds(dtype):
    """`dtype`'s largest finite value, its least normal value, and the share
    of |x|^2 that values below its normal range may take (UNFIT_ERROR^2 less
    the rounding of values in it, with 1% against rounding in the sums)."""
    largest, least, step = _RANGES[dtype]
    return largest, least, UNFIT_ERROR ** 2 * 0.99 - step ** 2


def _fits_surely(x, dtype):
    """True when the float32 values `x` pass _unfit_params' test whatever
    the cast's rounding, found without casting (False: cast and see). None
    exceeds the dtype's largest value, so none turns infinite; each value in
    its normal range moves by at most one step of its own size, and each
    below (n of them) by at most the least normal value, so the error is
    within UNFIT_ERROR when step^2 |x|^2 + n least^2 is. |x|^2 is at least
    max|x|^2, which settles bfloat16 (whose normal range is float32's) at
    once; float16 counts its n and sums |x|^2. Zeros stay zero."""
    largest, least, margin = _bounds(dtype)
    top = max(float(x.max(initial=0)), -float(x.min(initial=0)))
    if not top <= largest:  # NaN and infinite values too: the test decides
        return False
    if x.size * least ** 2 <= margin * top ** 2 or top == 0:
        return True
    magnitude = np.abs(x)
    below = np.count_nonzero(magnitude[magnitude < least])  # zeros stay exact
    return below * least ** 2 <= margin * float(np.einsum("i,i->", x, x, dtype=np.float64))


def _keep_unfit_readers(policy, graph, params):
    """`policy` with the parameters `policy.target_dtype` cannot hold, and
    every node reading them, kept in float32 (a float16 copy of a 1e6 weight
    is inf), with a WARNING naming them."""
    unfit = _unfit_params(params, policy.target_dtype)
    if not unfit:
        return policy
    ids = {nid for nid, n in enumerate(graph["nodes"]) if n["op"] == "null" and n["name"] in unfit}
    readers = sorted(n["name"] for n in graph["nodes"] if any(e[0] in ids for e in n["inputs"]))
    log.warning("mxamp %s: the parameters %s do not fit %s (a value out of its range, or mostly "
                "below its normal range): they and their readers %s stay float32",
                policy.target_dtype, _listed(unfit), policy.target_dtype, _listed(readers))
    return dataclasses.replace(policy, excluded=policy.excluded | set(unfit) | set(readers))


@mxnet_logs_to_logging()
def convert_model(sym, arg_params, aux_params, target_dtype="float16", target_dtype_ops=None,
                  fp32_ops=None, conditional_fp32_ops=None, excluded_sym_names=None,
                  cast_optional_params=False, data_names=None, widest_dtype_ops=None,
                  ctx=None, keep_io_types=True, follow_ops=None, rules=None,
                  input_shapes=None, backend=None, measure_kernels=False,
                  backend_compute=None):
    """Convert a float32 model given as a symbol and parameter dicts.

    Parameters
    ----------
    sym : mxnet.symbol.Symbol
        The float32 model.
    arg_params, aux_params : dict of str to mxnet.nd.NDArray
        Its parameters and auxiliary states.
    target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops : optional
        As in :func:`convert_symbol`.
    excluded_sym_names, cast_optional_params, widest_dtype_ops : optional
        As in :func:`convert_symbol`.
    data_names : list of str, optional
        The data inputs; then every other input must have a parameter. By
        default the inputs without a parameter are the data.
    ctx, keep_io_types, follow_ops, rules, input_shapes, measure_kernels : optional
        As in :func:`convert_symbol`; rules also see the parameters' shapes.
    backend : str, optional
        (mxamp) ``"onednn"`` plans the conversion for mxamp's oneDNN 3
        backend and returns the model partitioned into its regions (see
        :doc:`/onednn`): the nodes the backend takes run in the dtype its
        operator table gives, whatever MXNet's own kernels for them cost; the
        caller's own float32 lists, exclusions and rules still hold. The model
        is for this CPU (`ctx` defaults to ``mx.cpu()``). Where oneDNN 3 has no
        bfloat16 on this CPU those nodes stay float32 and the regions compute
        in float32 (a WARNING says so).
    backend_compute : str, optional
        (mxamp) What the regions compute in: None (bfloat16, or float32 where
        this CPU's bfloat16 dot products are slower; see
        :func:`mxamp.backends.onednn.apply_backend`), ``"bfloat16"`` whatever
        they cost, or ``"float32"``.

    Returns
    -------
    tuple
        ``(sym, arg_params, aux_params)``: the converted symbol and new dicts,
        each parameter in the dtype the converted graph reads it in. The
        caller's symbol and dicts are not modified.

    Raises
    ------
    mxamp.OptionError, mxamp.OptionTypeError
        For an invalid option, and for a model that is not float32
        (converted already, INT8, or on a backend).
    """
    options = ConversionOptions(
        target_dtype=target_dtype, target_dtype_ops=target_dtype_ops, fp32_ops=fp32_ops,
        conditional_fp32_ops=conditional_fp32_ops, excluded_sym_names=excluded_sym_names,
        data_names=data_names, cast_optional_params=cast_optional_params,
        widest_dtype_ops=widest_dtype_ops, ctx=ctx, keep_io_types=keep_io_types,
        follow_ops=follow_ops, rules=rules, input_shapes=input_shapes, backend=backend,
        measure_kernels=measure_kernels, backend_compute=backend_compute)
    return convert_model_with(sym, arg_params, aux_params, options)


def convert_model_with(sym, arg_params, aux_params, options):
    """:func:`convert_model` of a model with its options built
    (:class:`~mxamp.convert.options.ConversionOptions`)."""
    graph = _check_symbol(sym)
    _check_model_params(sym, arg_params, aux_params)
    params = {**arg_params, **aux_params}
    if options.input_shapes:
        check_param_shapes(sym, params, options.input_shapes, "arg_params / aux_params",
                           "input_shapes")
    options = _model_defaults(sym, params, options)
    policy = _model_policy(sym, graph, params, options)
    backend, backend_nodes, compute = options.backend_module, frozenset(), None
    if backend is not None:
        policy, backend_nodes, compute = _backend_policy(sym, arg_params, aux_params, graph,
                                                         policy, options)
    param_dtypes = {n: to_code(a.dtype) for n, a in params.items()}
    converted, input_types = _convert(sym, graph, policy, options, param_dtypes, backend_nodes)
    result = (converted, _cast_params(arg_params, input_types),
              _cast_params(aux_params, input_types))
    if backend is None:
        return result
    # Planned in bfloat16 and not told otherwise, the backend decides what its
    # regions compute in on this CPU (float32 where bfloat16 is slower).
    decides = options.backend_compute is None and compute == "bfloat16"
    return backend.apply_backend(*result, compute=None if decides else compute)


def _model_defaults(sym, params, options):
    """`options` with this model's defaults filled in: the data names (the
    inputs without a parameter; given, every other input needs one) and, for
    a backend, the CPU as the device."""
    inputs = sym.list_inputs()
    data_names = options.data_names
    if data_names is None:
        data_names = [n for n in inputs if n not in params]
    else:
        missing = sorted(set(inputs) - params.keys() - set(data_names))
        if missing:
            raise OptionError(f"no parameter given for the graph inputs {missing} "
                             f"(data_names: {list(data_names)})")
    ctx = mx.cpu() if options.backend is not None and options.ctx is None else options.ctx
    return dataclasses.replace(options, data_names=list(data_names), ctx=ctx)


def _model_policy(sym, graph, params, options):
    """The options' policy for this model: its rules also see the
    parameters' shapes, and parameters its dtype cannot hold stay float32."""
    policy = options.policy
    inputs = set(sym.list_inputs())
    if options.input_shapes is not None or options.rules:
        shapes = {n: a.shape for n, a in params.items() if n in inputs}
        policy = dataclasses.replace(policy, input_shapes={**shapes,
                                                           **(policy.input_shapes or {})})
    return _keep_unfit_readers(policy, graph, {n: a for n, a in params.items()
                                               if n in inputs and n not in options.data_names})


def _backend_policy(sym, arg_params, aux_params, graph, policy, options):
    """(policy, the nodes to run in bfloat16 for the backend, the dtype its
    regions are planned in). For float32 regions the nodes the backend
    takes stay float32."""
    backend = options.backend_module
    taken, compute = _backend_plan(backend, sym, arg_params, aux_params,
                                   options.backend_compute)
    if compute == "float32":
        return dataclasses.replace(policy, excluded=policy.excluded | taken), frozenset(), compute
    return policy, _backend_low(backend, graph, taken, policy, options), compute


def _backend_low(backend, graph, taken, policy, options):
    """The nodes of `taken` to run in bfloat16 because the backend computes
    them so (its operator table), whatever the default lists say: all but
    those the caller's own float32 lists (fp32_ops, conditional_fp32_ops of
    `options`: given, they replace the defaults) keep in float32, and those
    the table computes in float32 in bfloat16 regions (``f32_in_bf16``:
    LayerNorm). Excluded names and rules are the walk's to honour."""
    table = backend.operator_table()
    user_fp32 = options.fp32_ops is not None
    user_conditions = options.conditional_fp32_ops is not None
    return frozenset(
        n["name"] for n in graph["nodes"] if n["name"] in taken
        and "bfloat16" in table[n["op"]].dtypes and not table[n["op"]].f32_in_bf16
        and not (user_fp32 and n["op"] in policy.fp32)
        and not (user_conditions and policy.matched(n["op"], n.get("attrs", {}))))


def _backend_plan(backend, sym, arg_params, aux_params, backend_compute):
    """(names of the operator nodes `backend` takes from the float32 model,
    the dtype they are planned in): `backend_compute` when given, else
    bfloat16 where oneDNN 3 has it on this CPU, else float32 (with a
    WARNING). The backend is asked by partitioning the float32 model as it
    would run it."""
    compute = backend_compute or ("bfloat16" if cpu.features("onednn").bf16 else "float32")
    part = backend.apply_backend(sym, arg_params, aux_params, compute=compute)[0]
    taken = frozenset(n["name"] for node in graph_json(part)["nodes"]
                      if node["op"] == backend.REGION_OP
                      for n in node["subgraphs"][0]["nodes"] if n["op"] != "null")
    log.info("planned for the backend: it takes %d operator nodes, computing in %s",
             len(taken), compute)
    if compute == "float32" and backend_compute is None:
        log.warning("oneDNN 3 has no bfloat16 instructions on this CPU (%s; AVX512-BF16 or "
                    "AMX needed): the backend's regions compute in float32, and the %d nodes "
                    "they hold stay float32", cpu.describe(), len(taken))
    return taken, compute


def convert_bucketing_module(bucketing_mod, target_dtype="float16", target_dtype_ops=None,
                             fp32_ops=None, conditional_fp32_ops=None,
                             excluded_sym_names=None, cast_optional_params=False):
    """Convert every bucket of an initialized ``BucketingModule``.

    Buckets created later (new bucket keys) are converted with the same
    options too, where ``mxnet.contrib.amp`` would run them in float32.

    Parameters
    ----------
    bucketing_mod : mxnet.module.BucketingModule
        A bound module with initialized parameters. It is not modified.
    target_dtype, target_dtype_ops, fp32_ops, conditional_fp32_ops : optional
        As in :func:`convert_symbol`.
    excluded_sym_names, cast_optional_params : optional
        As in :func:`convert_symbol`.

    Returns
    -------
    mxnet.module.BucketingModule
        A new module whose buckets share one set of converted parameters.
    """
    from mxnet.module import BucketingModule
    if not isinstance(bucketing_mod, BucketingModule):
        raise OptionTypeError(f"bucketing_mod must be an mxnet.module.BucketingModule, "
                              f"got {type(bucketing_mod).__name__}")
    if not bucketing_mod._buckets or not bucketing_mod.params_initialized:
        raise OptionError("bucketing_mod has no bound buckets or uninitialized parameters: "
                          "bind it and call init_params() (or set_params) before converting")
    options = ConversionOptions(
        target_dtype=target_dtype, target_dtype_ops=target_dtype_ops, fp32_ops=fp32_ops,
        conditional_fp32_ops=conditional_fp32_ops, excluded_sym_names=excluded_sym_names,
        cast_optional_params=cast_optional_params)
    arg_params, aux_params = bucketing_mod.get_params()
    symbols, arg_out, aux_out = {}, {}, {}
    for key, module in bucketing_mod._buckets.items():
        names = set(module._symbol.list_inputs())
        with mxnet_logs_to_logging():
            symbols[key], args, aux = convert_model_with(
                module._symbol, {n: a for n, a in arg_params.items() if n in names},
                {n: a for n, a in aux_params.items() if n in names}, options)
        for params, new in ((arg_out, args), (aux_out, aux)):
            clash = sorted(n for n, a in new.items() if n in params and params[n].dtype != a.dtype)
            if clash:
                raise OptionError(f"the buckets need the parameters {clash} in different dtypes "
                                  f"(bucket {key!r} differs); convert with "
                                  "cast_optional_params=False")
            params.update(new)
    sym_gen = bucketing_mod._sym_gen

    def converted_sym_gen(key):
        sym, data_names, label_names = sym_gen(key)
        names = list(data_names) + list(label_names or [])
        with mxnet_logs_to_logging():  # MXNet calls it, outside this function
            converted = convert_symbol_with(sym, dataclasses.replace(options, data_names=names))
        return converted, data_names, label_names

    return BucketingModule.load_dict(
        symbols, sym_gen=converted_sym_gen, arg_params=arg_out, aux_params=aux_out,
        default_bucket_key=bucketing_mod._default_bucket_key, logger=bucketing_mod.logger,
        context=bucketing_mod._context, work_load_list=bucketing_mod._work_load_list,
        fixed_param_names=bucketing_mod._fixed_param_names,
        state_names=bucketing_mod._state_names, group2ctxs=bucketing_mod._group2ctxs,
        compression_params=bucketing_mod._compression_params)
