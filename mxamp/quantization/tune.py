"""Accuracy-guided INT8: the fewest layers kept out of INT8 for which a
caller's metric drops by at most a budget, as :func:`mxamp.tune` does for
float16 / bfloat16 (the same search, :func:`mxamp.verify.tune.find_exclusions`).

Calibration runs once: every candidate exclusion set reuses the same
thresholds and only re-marks the float32 layers and re-partitions (calibrated
ranges do not depend on which layers run in INT8).
"""
import itertools
import logging
import numbers
from dataclasses import dataclass

import mxnet as mx
from mxnet.gluon import HybridBlock

from .. import backends, gluon
from ..convert.marker import check_float32_graph
from ..errors import OptionError, OptionTypeError, mxnet_logs_to_logging
from ..graph import check_params, graph_json
from ..policy.resolve import str_list
from ..verify.tune import find_exclusions
from . import calibrate, data
from .api import (QUANTIZED_DTYPES, _check_choice, annotate, calibrated, data_means,
                  excluded_nodes, int8_layers, rest_dtype_of)

log = logging.getLogger(__name__)


@dataclass
class Int8TuneResult:
    """What :func:`tune_int8` found.

    Attributes
    ----------
    model : object
        The INT8 model: a ``SymbolBlock`` for a block, else
        ``(sym, arg_params, aux_params)``.
    excluded : list of str
        The layers kept out of INT8, the caller's `exclude_layers` included.
    metric_drop : float
        The float32 metric minus the INT8 one.
    int8_layers : list of str
        The candidate layers left in INT8.
    evaluations : int
        The INT8 models evaluated.
    """
    model: object
    excluded: list
    metric_drop: float
    int8_layers: list
    evaluations: int


def eval_metric(eval_fn, model):
    """``eval_fn(model)`` as a float; OptionTypeError for anything but a number."""
    value = eval_fn(model)
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        shown = "None" if value is None else type(value).__name__
        hint = ": return array.asscalar()" if hasattr(value, "asscalar") else ""
        raise OptionTypeError(f"eval_fn must return a number (higher is better), got "
                              f"{shown}{hint}")
    return float(value)


@mxnet_logs_to_logging()
def tune_int8(model, calib_data, eval_fn, max_drop, calib_mode="naive",
              num_calib_examples=None, exclude_layers=None, quantized_dtype="auto",
              data_names=("data",), progress=False, rest_dtype="float32"):
    """Quantize to INT8, keeping the fewest layers out of INT8 within a metric budget.

    The candidates are the layers INT8 starts at in the backend
    (Convolution, FullyConnected, batch_dot, read from its operator table),
    in graph order: the full INT8 model first; if it misses the budget,
    segments are kept out of INT8 by bisection, then each kept layer is tried
    in INT8 again. Calibration runs once; each step re-partitions and calls
    `eval_fn` once.

    Parameters
    ----------
    model : mxnet.gluon.HybridBlock or tuple
        A block (as :func:`quantize_net_v2` takes it; `eval_fn` then gets
        a ``SymbolBlock``) or ``(sym, arg_params, aux_params)`` with inputs
        `data_names` (`eval_fn` gets such a tuple).
    calib_data : mxnet.gluon.data.DataLoader or mxnet.io.DataIter or list
        The calibration batches.
    eval_fn : callable
        ``eval_fn(model)`` returns a number, higher is better (e.g. accuracy
        on held-out data).
    max_drop : float
        The largest drop of `eval_fn` from the float32 model's allowed.
    calib_mode, num_calib_examples, quantized_dtype : optional
        As for :func:`quantize_model`.
    exclude_layers : list of str, optional
        Layers kept out of INT8 whatever the search finds.
    data_names : tuple of str
        The data inputs of a symbol model.
    progress : bool
        Progress bars of the calibration and of the evaluations on stderr.
    rest_dtype : str
        What the layers kept out of INT8 compute in, as for
        :func:`quantize_model`; the search measures them so.

    Returns
    -------
    Int8TuneResult

    Raises
    ------
    RuntimeError
        When even every candidate layer out of INT8 misses the budget.
    """
    _check_search_options(eval_fn, max_drop, calib_mode, quantized_dtype)
    rest_dtype = rest_dtype_of(rest_dtype)
    batches = list(data.batches_of(calib_data) or [])
    if not batches:
        raise OptionError("calib_data must hold at least one batch: INT8 needs calibrated "
                          "ranges")
    sym, args, aux, data_names = _symbol_model(model, batches[0], data_names)
    check_float32_graph(graph_json(sym), "quantize", {**args, **aux})
    base = excluded_nodes(sym, exclude_layers)
    stats = calibrated(sym, args, aux, data_names,
                       data.with_progress(iter(batches), progress, "calibration", "batch"),
                       calib_mode, num_calib_examples)
    means = data_means(stats)
    attrs = sym.attr_dict()

    def build(excluded):
        marked = annotate(sym, stats, base | excluded, quantized_dtype)
        graph, arg_params, aux_params = backends.get("onednn").partition(
            marked, args, aux, compute="int8", rest_dtype=rest_dtype, data_means=means)
        if not isinstance(model, HybridBlock):
            return graph.symbol, arg_params, aux_params
        block = gluon.symbol_block(graph.symbol, [mx.sym.var(n, attr=attrs.get(n))
                                                  for n in data_names],
                                   arg_params, aux_params, mx.cpu())
        block.hybridize(static_alloc=True, static_shape=True)
        return block

    reference = eval_metric(eval_fn, model)
    drops = {}
    evaluations = iter(data.with_progress(itertools.count(), progress, "tune_int8",
                                          "evaluation"))

    def passes(excluded):
        key = frozenset(excluded)
        if key not in drops:
            next(evaluations)
            drops[key] = reference - eval_metric(eval_fn, build(key))
            log.info("tune_int8: %d layers in %s -> metric drop %.4g", len(key), rest_dtype,
                     drops[key])
        return drops[key] <= max_drop

    candidates = [n["name"] for n in graph_json(sym)["nodes"]
                  if n["op"] in int8_layers() and n["name"] not in base]
    excluded = find_exclusions(candidates, passes)
    if excluded is None:
        raise RuntimeError(f"even with all {len(candidates)} INT8 layers kept in float32 the "
                           f"metric drops by {drops[frozenset(candidates)]:.4g} > max_drop "
                           f"{max_drop}; raise max_drop or check eval_fn")
    names = [n for n in candidates if n in excluded]
    log.info("tune_int8: %d of %d layers kept in %s after %d evaluations: %s",
             len(names), len(candidates), rest_dtype, len(drops), names)
    return Int8TuneResult(build(excluded), sorted(base) + names, drops[frozenset(excluded)],
                          [n for n in candidates if n not in excluded], len(drops))


def _check_search_options(eval_fn, max_drop, calib_mode, quantized_dtype):
    """tune_int8's options other than the model and its data."""
    if not callable(eval_fn):
        raise OptionTypeError(f"eval_fn must be callable, got {eval_fn!r}")
    if not isinstance(max_drop, numbers.Real) or isinstance(max_drop, bool) or \
            not max_drop >= 0:
        raise OptionError(f"max_drop must be a number >= 0, got {max_drop!r}")
    if calib_mode not in calibrate.MODES:
        raise OptionError(f"calib_mode must be one of {', '.join(map(repr, calibrate.MODES))} "
                          f"(the search reuses calibrated ranges), got {calib_mode!r}")
    _check_choice("quantized_dtype", quantized_dtype, QUANTIZED_DTYPES)


def _symbol_model(model, batch, data_names):
    """(sym, arg_params, aux_params, data_names) of a block (traced on
    `batch` if it has not run) or of a model given so."""
    if isinstance(model, HybridBlock):
        with data.traced(model, batch, None):
            return gluon.model_of(model, "tuning it")
    if isinstance(model, tuple) and len(model) == 3 and isinstance(model[0], mx.sym.Symbol):
        sym, args, aux = model
        check_params(args, "arg_params")
        check_params(aux, "aux_params")
        return sym, args, aux, str_list(list(data_names), "data_names")
    raise OptionTypeError("model must be a gluon HybridBlock or a (sym, arg_params, "
                          f"aux_params) tuple, got {type(model).__name__}")
