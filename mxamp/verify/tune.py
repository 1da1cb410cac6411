"""Accuracy-driven conversion: the largest low-precision conversion whose
outputs on calibration data stay within a tolerance of float32.

A layer on top of the deterministic converter: it only chooses
``excluded_sym_names``. The candidates are the operator nodes that run in low
precision in the full conversion, in topological order. Segments of them are
kept in float32 by bisection until the remaining low-precision set passes;
then each excluded node is tried in low precision again, one at a time.
"""
import logging
from dataclasses import dataclass

import mxnet as mx
import numpy as np
from mxnet.gluon import HybridBlock

from ..convert.api import convert_model_with
from ..convert.options import ConversionOptions
from ..dtypes import DTYPE_CODES, as_numpy, normalize_dtype, to_code
from ..gluon import convert_hybrid_block
from ..errors import OptionError, OptionTypeError, mxnet_logs_to_logging
from ..graph import CAST_OPS, check_params, graph_json, infer_entry_types
from ..policy.resolve import str_list

log = logging.getLogger(__name__)



@dataclass
class TuneResult:
    """What :func:`mxamp.tune` found.

    Attributes
    ----------
    model : object
        The converted block, or ``(sym, arg_params, aux_params)``.
    excluded : list of str
        The node names kept in float32, the caller's own
        ``excluded_sym_names`` first.
    error : float
        The worst ``|out - ref| / (atol + rtol * |ref|)`` over all calibration
        outputs (at most 1: within tolerance).
    metric_drop : float or None
        The float32 metric minus the converted one (None without
        ``metric_fn``).
    low_nodes : list of str
        The operator nodes that run in low precision.
    evaluations : int
        The conversions measured.
    """
    model: object
    excluded: list
    error: float
    metric_drop: float
    low_nodes: list
    evaluations: int


def _as_tuple(batch):
    if isinstance(batch, mx.nd.NDArray):
        return (batch,)
    if isinstance(batch, (list, tuple)) and batch and \
            all(isinstance(a, mx.nd.NDArray) for a in batch):
        return tuple(batch)
    raise OptionTypeError("each calibration batch must be an NDArray, a tuple of NDArrays or "
                          "(for a symbol model) a dict of input name to NDArray, got "
                          f"{type(batch).__name__}")


def _with_shapes(kwargs, feeds):
    """Converter options; rules get the calibration data's shapes (only then:
    shape inference is not needed otherwise)."""
    if kwargs.get("rules"):
        return {"input_shapes": {n: a.shape for n, a in feeds.items()}, **kwargs}
    return kwargs


def _numpy(outputs):
    outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return [as_numpy(o).astype(np.float32) for o in outputs]


class _Block:
    """A hybridized Gluon block and its calibration batches."""

    def __init__(self, block, batches):
        if not block._active:
            raise RuntimeError(f"block {block.name!r} is not hybridized: call block.hybridize() "
                               "before tuning it")
        self.block = block
        self.batches = [_as_tuple(b) for b in batches]
        self.reference = [_numpy(block(*b)) for b in self.batches]
        inputs, self.sym = block._cached_graph
        self.data_names = [i.name for i in inputs]

    def convert(self, target_dtype, excluded, kwargs):
        return convert_hybrid_block(self.block, target_dtype, excluded_sym_names=excluded,
                                    **_with_shapes(kwargs, self.feeds()))

    def run(self, model):
        return [_numpy(model(*b)) for b in self.batches], model._cached_graph[1]

    def feeds(self):
        return dict(zip(self.data_names, self.batches[0]))


class _Symbol:
    """A (sym, arg_params, aux_params) model and its calibration batches."""

    def __init__(self, model, batches):
        if not (isinstance(model, tuple) and len(model) == 3):
            raise OptionTypeError("model must be a gluon HybridBlock or a (sym, arg_params, "
                                  f"aux_params) tuple, got {type(model).__name__}")
        self.sym, self.args, self.aux = model
        if not isinstance(self.sym, mx.sym.Symbol):
            raise OptionTypeError(f"model[0] must be an mxnet Symbol, "
                                  f"got {type(self.sym).__name__}")
        check_params(self.args, "arg_params")
        check_params(self.aux, "aux_params")
        params = {**self.args, **self.aux}
        self.data_names = [n for n in self.sym.list_inputs() if n not in params]
        self.batches = [self.feed(b) for b in batches]
        self.context = next(iter(self.batches[0].values())).context
        self.reference = [self.execute(self.sym, self.args, self.aux, b) for b in self.batches]

    def feed(self, batch):
        names = sorted(batch) if isinstance(batch, dict) else len(_as_tuple(batch))
        if names not in (sorted(self.data_names), len(self.data_names)):
            raise OptionError(f"calibration batch {names!r} does not match the model's data "
                              f"inputs {self.data_names}")
        return dict(batch) if isinstance(batch, dict) else \
            dict(zip(self.data_names, _as_tuple(batch)))

    @staticmethod
    def execute(sym, args, aux, batch):
        ctx = next(iter(batch.values())).context
        exe = sym.bind(ctx, {**args, **batch}, aux_states=dict(aux), grad_req="null")
        return _numpy(exe.forward(is_train=False))

    def convert(self, target_dtype, excluded, kwargs):
        # Converted for the calibration data's context, where it is run: ops
        # without a low-precision kernel there stay float32 (as for a block).
        kwargs = {"data_names": self.data_names, "ctx": self.context,
                  **_with_shapes(kwargs, self.feeds())}
        options = ConversionOptions(target_dtype, excluded_sym_names=excluded, **kwargs)
        return convert_model_with(self.sym, self.args, self.aux, options)

    def run(self, model):
        sym, args, aux = model
        return [self.execute(sym, args, aux, b) for b in self.batches], sym

    def feeds(self):
        return self.batches[0]


def _error(outputs, reference, rtol, atol):
    worst = 0.0
    for outs, refs in zip(outputs, reference):
        for out, ref in zip(outs, refs):
            if not np.isfinite(out).all():
                return float("inf")
            bound = atol + rtol * np.abs(ref)
            worst = max(worst, float(np.max(np.abs(out - ref) / bound, initial=0.0)))
    return worst


class _Search:
    """Measures conversions, each exclusion set once."""

    def __init__(self, model, target_dtype, rtol, atol, metric_fn, max_metric_drop, seed,
                 kwargs):
        self.model = model
        self.target_dtype = target_dtype
        self.rtol, self.atol = rtol, atol
        self.metric_fn, self.max_metric_drop = metric_fn, max_metric_drop
        self.seed = seed
        self.kwargs = kwargs
        self.base = str_list(kwargs.pop("excluded_sym_names", None) or [], "excluded_sym_names")
        self.base_metric = None if metric_fn is None else float(metric_fn(model.reference))
        self.measured = {}

    def convert(self, excluded):
        return self.model.convert(self.target_dtype, self.base + sorted(excluded),
                                  dict(self.kwargs))

    def measure(self, excluded):
        """(passes, error, metric drop, converted symbol); the converted models
        themselves are not kept (they hold parameters)."""
        key = frozenset(excluded)
        if key not in self.measured:
            mx.random.seed(self.seed)  # random ops see the same stream in every run
            outputs, sym = self.model.run(self.convert(key))
            error = _error(outputs, self.model.reference, self.rtol, self.atol)
            drop = None
            if self.metric_fn is not None:
                drop = self.base_metric - float(self.metric_fn(outputs))
                passes = drop <= self.max_metric_drop
            else:
                passes = error <= 1.0
            log.info("tune: %d nodes in float32 -> error %.3g%s: %s", len(key), error,
                     "" if drop is None else f", metric drop {drop:.4g}",
                     "pass" if passes else "fail")
            self.measured[key] = (passes, error, drop, sym)
        return self.measured[key]

    def passes(self, excluded):
        return self.measure(excluded)[0]


def _bisect(passes, segment, fixed):
    """The nodes of `segment` to keep out of low precision, given that keeping
    all of `fixed` and `segment` out passes."""
    if passes(fixed):
        return set()
    if len(segment) == 1:
        return set(segment)
    first, second = segment[:len(segment) // 2], segment[len(segment) // 2:]
    found = _bisect(passes, first, fixed | set(second))
    return found | _bisect(passes, second, fixed | found)


def find_exclusions(candidates, passes):
    """The nodes of `candidates` (in graph order) to keep out of low precision
    so that ``passes(set of names)`` holds: none if the full conversion
    passes; else segments found by bisection, then each of them tried in low
    precision again, one at a time. None when even keeping all of them out
    fails. `passes` should remember its answers: sets recur."""
    if passes(set()):
        return set()
    if not passes(set(candidates)):
        return None
    excluded = _bisect(passes, list(candidates), set())
    for name in candidates:
        if name in excluded and passes(excluded - {name}):
            excluded = excluded - {name}
    return excluded


def _nodes(sym):
    return graph_json(sym)["nodes"]


def low_precision_nodes(sym, feeds, target_dtype):
    """Names of the operator nodes of a converted symbol with a low-precision output."""
    target = DTYPE_CODES[target_dtype]
    types = infer_entry_types(sym, {n: to_code(a.dtype) for n, a in feeds.items()})
    nodes = _nodes(sym)
    return sorted({nodes[nid]["name"] for (nid, _), code in types.items()
                   if code == target and nodes[nid]["op"] not in CAST_OPS + ("null",)})


@mxnet_logs_to_logging()
def tune(model, calibration_inputs, target_dtype, rtol=1e-2, atol=1e-3, metric_fn=None,
         max_metric_drop=None, seed=0, **convert_kwargs):
    """Find the largest low-precision conversion within an accuracy budget.

    The operator nodes that run in low precision are searched, by bisection
    in graph order, for the fewest to keep in float32
    (``excluded_sym_names``); then each excluded node is tried in low
    precision again, so that no exclusion remains that the result does not
    need. Progress is logged at INFO on ``mxamp.verify.tune``.

    Parameters
    ----------
    model : mxnet.gluon.HybridBlock or tuple
        A hybridized block (converted with :func:`mxamp.convert_hybrid_block`)
        or ``(sym, arg_params, aux_params)`` (converted with
        :func:`mxamp.convert_model`, for the calibration data's context unless
        ``ctx`` is given).
    calibration_inputs : list
        Batches: an NDArray, a tuple of NDArrays (positional inputs) or, for a
        symbol, a dict of data input name to NDArray.
    target_dtype : str
        ``"float16"`` or ``"bfloat16"``.
    rtol, atol : float
        Without `metric_fn`, a conversion passes when every output element
        obeys ``|out - ref| <= atol + rtol * |ref|`` against float32.
    metric_fn : callable, optional
        ``metric_fn(outputs)`` (per batch, a list of float32 numpy arrays)
        returns a number, higher is better; a conversion passes when it drops
        by at most `max_metric_drop`.
    max_metric_drop : float, optional
        Goes with `metric_fn`.
    seed : int
        Seeds MXNet's random generator before every run, so that models with
        random operators compare like with like.
    **convert_kwargs
        Passed to the converter; ``excluded_sym_names`` given there stay
        excluded.

    Returns
    -------
    TuneResult

    Raises
    ------
    mxamp.OptionError
        For an invalid budget or empty calibration data.
    """
    target_dtype = normalize_dtype(target_dtype)
    for name, value in (("rtol", rtol), ("atol", atol)):
        if not isinstance(value, (int, float)) or value < 0:
            raise OptionError(f"{name} must be a number >= 0, got {value!r}")
    if (metric_fn is None) != (max_metric_drop is None):
        raise OptionError("metric_fn and max_metric_drop go together: give both or neither")
    if metric_fn is None and rtol == 0 and atol == 0:
        raise OptionError("rtol and atol are both 0: no low-precision conversion can pass; "
                          "give a tolerance or a metric_fn")
    if metric_fn is not None and not callable(metric_fn):
        raise OptionTypeError(f"metric_fn must be callable, got {metric_fn!r}")
    if not isinstance(calibration_inputs, (list, tuple)) or not calibration_inputs:
        raise OptionError("calibration_inputs must be a non-empty list of batches")
    mx.random.seed(seed)
    wrapped = (_Block if isinstance(model, HybridBlock) else _Symbol)(model, calibration_inputs)
    search = _Search(wrapped, target_dtype, rtol, atol, metric_fn, max_metric_drop, seed,
                     dict(convert_kwargs))

    position = {n["name"]: i for i, n in enumerate(_nodes(wrapped.sym))}
    candidates = sorted(low_precision_nodes(search.measure(set())[3], wrapped.feeds(),
                                            target_dtype), key=position.get)
    log.info("tune: %d candidate low-precision nodes", len(candidates))
    excluded = find_exclusions(candidates, search.passes)
    if excluded is None:
        error = search.measure(set(candidates))[1]
        raise RuntimeError(f"even with all {len(candidates)} low-precision nodes kept in "
                           f"float32 the outputs miss the tolerance (error {error:.3g}); "
                           "loosen rtol/atol or max_metric_drop")
    _, error, drop, sym = search.measure(excluded)
    names = search.base + sorted(excluded, key=position.get)
    log.info("tune: %d of %d candidate nodes kept in float32 after %d conversions: %s",
             len(excluded), len(candidates), len(search.measured), names)
    return TuneResult(search.convert(excluded), names, error, drop,
                      low_precision_nodes(sym, wrapped.feeds(), target_dtype),
                      len(search.measured))

