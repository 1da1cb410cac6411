"""Calibration: what INT8 quantization needs to know of a float32 model's
tensors, from runs over calibration batches.

- :class:`Collector` runs the model (one executor, without MXNet's graph
  fusion, whose intermediate tensors share memory as in inference: each
  wanted tensor is copied as its operator writes it, through the executor's
  monitor callback, and numpy reduces the copy while MXNet computes the next
  operator; never all at once) and records each tensor's minimum and
  maximum and, in 'entropy' mode, a histogram over ``[-R, R]``. The histogram has a
  fixed, odd number of bins (a bin centred on zero) that is a multiple of 3:
  ``R`` starts at the first batch's largest magnitude and, when a later batch
  goes beyond it, triples (as often as needed), every three bins merging into
  one. The merge is exact, so there is one pass over the batches and no batch
  is kept; the price is resolution: the values seen span at least a third of
  the bins (2667 of the default 8001: over five bins per INT8 level).
  Where asked (``means``), it also averages each channel of a tensor: the
  channel means of the data of the layers whose biases the backend corrects
  for their weights' rounding (the backend's finishing pass,
  src/operator/onednn/s8_weights.h).
- :func:`naive_threshold` and :func:`entropy_threshold` turn that into the
  clipping threshold T (INT8 scale T/127, or T/255 for u8); :class:`TensorStats`
  holds the result per tensor. Weights' per-channel scales are the backend's
  (after BatchNorm folding, src/operator/onednn/s8_values.h).
"""
import collections
import ctypes
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import mxnet as mx
import numpy as np
from mxnet.base import NDArrayHandle

from ..dtypes import as_numpy, memory_view
from ..errors import OptionError, OptionTypeError, is_out_of_memory, memory_for, mxnet_message
from ..graph import CAST_OPS, Graph, internal_name, internal_outputs
from ..verify import no_graph_fusion
from . import data

log = logging.getLogger(__name__)

MODES = ("naive", "entropy")
NUM_BINS = 8001  # MXNet's count; odd and a multiple of 3, as the Collector needs
# MXNet's smoothing: empty bins get EPS, taken off the others, so KL stays finite.
EPS = 1e-4
# Candidates x bins evaluated at once by entropy_threshold (512 kB arrays: cache-sized).
_CHUNK = 1 << 16
_SHOWN = 20  # allowed names listed in an error
_TIE = 1e-12  # divergences closer than this are equal
_BLOCK = 1 << 16  # values binned at once
# (x - e) log(x - e) summed by its series in e where e <= _SERIES x: _TERMS terms.
_SERIES, _TERMS = 0.05, 10
# Examples one calibration forward runs: MXNet 1.9's executor keeps a plain
# copy of every tensor an MKL-DNN operator hands to a plain one (MobileNet v2's
# clip after BatchNorm: 850 MB at batch 32), so its memory grows with the batch.
ROWS = 8


@dataclass(frozen=True)
class TensorStats:
    """What calibration found for one tensor: its range over the calibration
    examples and its clipping threshold. ``signed`` (``min < 0``) picks s8
    over u8. A tensor that was all zeros gets threshold 1.0: any scale
    represents it exactly, and a threshold of 0 would mean "no range".
    ``mean``: the mean of each channel (float64), where it was asked for."""
    name: str
    min: float
    max: float
    threshold: float
    signed: bool
    mean: object = field(default=None, compare=False, repr=False)


def naive_threshold(low, high):
    """The symmetric threshold covering [low, high]: max(|low|, |high|)
    (scalars or arrays, elementwise)."""
    return np.maximum(np.abs(low), np.abs(high))


def entropy_threshold(hist, edges, num_quantized_bins=255):
    """The clipping threshold whose quantization loses the least information,
    by MXNet's method (``_get_optimal_threshold``, after TensorRT). `hist`
    counts values over ``[-R, R]`` in an odd number of bins, `edges` being its
    bin edges (as ``np.histogram`` gives them). Each candidate is a slice of
    bins grown from the zero bin both ways, scored by KL(P || Q): P is the
    slice with the mass outside it added to its end bins, Q the slice merged
    into `num_quantized_bins` groups, each group's mass spread evenly over its
    bins where P is non-zero. A histogram with nothing below its zero bin (a
    non-negative tensor, e.g. after ReLU, quantized to u8) is scored with
    ``2 * num_quantized_bins + 1`` groups: `num_quantized_bins` over [0, T],
    the empty negative half costing nothing. Returns the best slice's right
    edge T, or R when the histogram is empty or narrower than the groups.

    MXNet 1.9.1 computes this in C++ (``calibrate_entropy``), where the
    slice's first bin is left out of Q's groups and a group's bins are
    counted where the slice (not P) is non-zero; this follows its Python
    original, so thresholds may differ where those bins matter."""
    return entropy_search(hist, edges, num_quantized_bins)[0]


def entropy_search(hist, edges, num_quantized_bins=255):
    """:func:`entropy_threshold` and the divergence at that threshold (0.0
    when no candidate was scored)."""
    hist = np.asarray(hist, dtype=np.float64)
    edges = np.asarray(edges, dtype=np.float64)
    _check_histogram(hist, edges, num_quantized_bins)
    zero = len(hist) // 2
    levels = num_quantized_bins if hist[:zero].any() else 2 * num_quantized_bins + 1
    half = np.arange(levels // 2, zero + 1)
    if not hist.any() or not len(half):
        return float(edges[-1]), 0.0
    divergence = _divergences(hist, half, levels)
    # Ties (up to rounding: sums are taken in another order than MXNet's) go
    # to the smallest threshold, as in MXNet.
    best = np.flatnonzero(divergence <= divergence.min() + _TIE)[0]
    return float(edges[zero + half[best] + 1]), float(divergence[best])


def _check_histogram(hist, edges, levels):
    if hist.ndim != 1 or len(hist) % 2 == 0 or edges.shape != (len(hist) + 1,):
        raise OptionError(f"entropy_threshold needs a histogram with an odd number of bins and "
                          f"its edges (one more), got shapes {hist.shape} and {edges.shape}")
    if isinstance(levels, bool) or not isinstance(levels, (int, np.integer)) or levels < 2:
        raise OptionError(f"num_quantized_bins must be an int >= 2, got {levels!r}")


def _divergences(hist, half, levels):
    """KL(P || Q) of each candidate slice ``hist[zero - h : zero + h + 1]``
    (h in `half`), as MXNet's Python loop computes it, but per group of bins
    from prefix sums: Q is constant over a group's bins where P is non-zero,
    and EPS-smoothed P and Q are equal (no cost) where P is zero. Only
    sum(p log p) needs every bin."""
    zero = len(hist) // 2
    starts, stops = zero - half, zero + half + 1
    mass = np.concatenate([[0.0], np.cumsum(hist)])
    filled = np.concatenate([[0], np.cumsum(hist != 0)])
    left, right = mass[starts], mass[-1] - mass[stops]
    rows = max(1, _CHUNK // (levels + 1))  # candidates at once: (rows, levels) arrays in cache
    p_eps, q_eps, cross = (np.concatenate(parts) for parts in zip(*(
        _group_terms(hist, mass, filled, starts[a:a + rows], stops[a:a + rows], levels)
        for a in range(0, len(half), rows))))
    with np.errstate(divide="ignore", invalid="ignore"):
        first, last = hist[starts] + left, hist[stops - 1] + right
        p_log_p = (_inner_x_log_x(hist, half, p_eps)
                   + _x_log_x(first - p_eps, first != 0) + _x_log_x(last - p_eps, last != 0))
        total, kept = mass[-1], mass[stops] - mass[starts]
        # P and Q sum to the totals of their unsmoothed counts: normalize here.
        divergence = (p_log_p - cross) / total + np.log(kept / total)
    # Q empty, or smoothing that would turn a bin negative: no candidate (as MXNet).
    bad = ~np.isfinite(divergence) | (p_eps >= 1) | (q_eps >= 1)
    return np.where(bad, np.inf, divergence)


def _group_terms(hist, mass, filled, starts, stops, levels):
    """For the candidate slices ``hist[starts:stops]``: the smoothing shifts
    of P and Q, and sum(P log Q) over the bins where P is non-zero."""
    size = stops - starts
    left, right = mass[starts], mass[-1] - mass[stops]
    # `levels` groups of size // levels bins, the last also taking the remainder.
    bounds = starts[:, None] + (size // levels)[:, None] * np.arange(levels + 1)
    bounds[:, -1] = stops
    q_mass = np.diff(mass[bounds])  # Q's groups hold the slice only
    p_mass = q_mass.copy()
    p_mass[:, 0] += left
    p_mass[:, -1] += right
    # Bins where P is non-zero; P's end bins also hold the outside mass.
    count = np.diff(filled[bounds])
    count[:, 0] += (hist[starts] == 0) & (left > 0)
    count[:, -1] += (hist[stops - 1] == 0) & (right > 0)
    p_zeros = size - count.sum(axis=1)
    q_zeros = p_zeros + np.where(q_mass == 0, count, 0).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_eps = EPS * p_zeros / (size - p_zeros)
        q_eps = EPS * q_zeros / (size - q_zeros)
        q_value = np.where(q_mass > 0, q_mass / np.maximum(count, 1) - q_eps[:, None], EPS)
        cross = ((p_mass - count * p_eps[:, None]) * np.log(q_value)).sum(axis=1)
    return p_eps, q_eps, cross


def _x_log_x(x, where):
    return np.where(where, x * np.log(x), 0.0)


def _inner_x_log_x(hist, half, shift):
    """Per candidate, the sum of (h - shift) log(h - shift) over the non-zero
    bins h strictly inside its slice (less than `half` bins from the zero
    bin). With the non-zero bins ordered by that distance, a candidate's are
    a prefix: prefix sums give them all, through the series in the shift
    where it is small against every bin, else one cumulative sum per chunk
    of candidates."""
    index = np.flatnonzero(hist)
    distance = np.abs(index - len(hist) // 2)
    order = np.argsort(distance, kind="stable")
    values = hist[index[order]]
    prefix = np.searchsorted(distance[order], half)  # bins with distance < half
    result = np.zeros(len(half))
    if not len(values):
        return result
    small = shift <= _SERIES * values.min()  # False for NaN (no candidate anyway)
    result[small] = _shifted_series(values, prefix[small], shift[small])
    result[~small] = _shifted_exact(values, prefix[~small], shift[~small])
    return result


def _shifted_series(values, prefix, shift):
    """Sums of (x - e) log(x - e) over the first `prefix` `values`, each for
    its shift e, by the series x log x - e (log x + 1) + sum over n >= 2 of
    e^n / (n (n - 1) x^(n - 1)): _TERMS terms, for e <= _SERIES x, leave an
    error under 1e-16 x."""
    def sums(terms):
        return np.concatenate([[0.0], np.cumsum(terms)])[prefix]
    logs = np.log(values)
    total = sums(values * logs) - shift * (sums(logs) + prefix)
    inverse = 1.0 / values
    power = inverse.copy()  # x^-(n-1)
    for n in range(2, _TERMS + 1):
        total += shift ** n / (n * (n - 1)) * sums(power)
        power *= inverse
    return total


def _shifted_exact(values, prefix, shift):
    """:func:`_shifted_series` term by term, a chunk of candidates at a time."""
    result = np.zeros(len(prefix))
    if not len(prefix):
        return result
    rows = max(1, _CHUNK // max(1, int(prefix.max())))
    for a in range(0, len(prefix), rows):
        n, e = prefix[a:a + rows], shift[a:a + rows, None]
        x = values[:n.max()] - e
        terms = np.log(x)
        terms *= x
        sums = np.zeros((len(n), x.shape[1] + 1))  # column j: the sum of the first j
        np.cumsum(terms, axis=1, out=sums[:, 1:])
        result[a:a + rows] = sums[np.arange(len(n)), n]
    return result


def tensor_names(sym, data_names):
    """{internal output name: node name} of what INT8 quantization calibrates
    in `sym` (a symbol or a :class:`mxamp.graph.Graph`): the data inputs and
    the first output of every operator node, casts aside."""
    graph = Graph.of(sym)
    outputs = graph.outputs()
    names = {name: name for name in data_names}
    for node in graph.nodes:
        if node["op"] == "null" or node["op"] in CAST_OPS:
            continue
        first = internal_name(outputs, node["name"])
        if first is not None:
            names[first] = node["name"]
    return names


def collect(sym, arg_params, aux_params, names, batches, data_names=("data",),
            calib_mode="naive", num_calib_examples=None, means=None):
    """Runs a :class:`Collector` over `batches` and returns its
    :meth:`Collector.stats`. `names` is a list of tensor names, or a mapping
    {tensor name: key} to key the result otherwise (e.g. by node name);
    `means` is the Collector's."""
    keys = names if isinstance(names, Mapping) else {name: name for name in names}
    collector = Collector(sym, arg_params, aux_params, list(keys), data_names, calib_mode,
                          means=means)
    collector.run(batches, num_calib_examples)
    return {keys[name]: found for name, found in collector.stats().items()}


class Collector:
    """Runs a float32 model over calibration batches and records, per wanted
    tensor, its range and (mode 'entropy') its histogram.

    `sym` (a symbol or a :class:`mxamp.graph.Graph`), `arg_params`,
    `aux_params` and `data_names` are a model (as
    :func:`mxamp.gluon.model_of` returns it); `names` are tensors of
    ``sym.get_internals().list_outputs()`` ('conv0_output', or a data input).
    One executor serves every batch (bound again only when a batch has other
    shapes). Its outputs are only the wanted tensors no other wanted tensor
    depends on; the others are intermediates, whose memory MXNet reuses as
    in inference, and each is copied when its operator has written it (the
    monitor callback) and reduced while the next operator runs, so
    calibration holds about as much memory as running the model; a batch
    runs at most `rows` examples at a time (the statistics of its slices
    add up to the batch's). Inputs that are neither
    data nor parameters must be labels (named '...label'): they are left
    unset, as a loss layer's output does not depend on them in inference.
    `num_bins` is the histograms' (see the module's documentation).
    `means` ({tensor name: axis}, of `names`) asks for the mean of each
    channel along that axis of a tensor (None: of each value of an
    example)."""

    def __init__(self, sym, arg_params, aux_params, names, data_names=("data",),
                 calib_mode="naive", num_bins=NUM_BINS, rows=ROWS, means=None):
        if calib_mode not in MODES:
            raise OptionError(f"calib_mode must be one of {', '.join(map(repr, MODES))}, "
                              f"got {calib_mode!r}")
        if not isinstance(num_bins, int) or num_bins % 6 != 3:
            raise OptionError(f"num_bins must be an odd multiple of 3, got {num_bins!r}")
        self.names, self.data_names = list(names), list(data_names)
        self.calib_mode = calib_mode
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise OptionError(f"rows must be an int >= 1, got {rows!r}")
        self.rows = rows
        graph = Graph.of(sym)
        self._group = _group_of(graph, self.names)
        self._arguments = set(self._group.list_arguments())
        _check_inputs(graph.symbol, self._group, arg_params, aux_params, self.data_names)
        self._arg_params, self._aux_params = arg_params, aux_params
        self._index = {name: k for k, name in enumerate(self.names)}
        # Wanted inputs (data) are read from the executor's own arrays.
        inputs = set(self._group.list_inputs())
        self._inputs = [name for name in self.names if name in inputs]
        self._exe, self._shapes, self._seen, self._error = None, None, set(), None
        self._copies = _Copies()
        self.num_examples = self.num_batches = 0
        self.min = np.full(len(self.names), np.inf)
        self.max = np.full(len(self.names), -np.inf)
        self._range = np.zeros(len(self.names))  # R of each histogram (0: only zeros so far)
        self._hist = np.zeros((len(self.names), num_bins)) if calib_mode == "entropy" else None
        self._mean_axis = {self._index[n]: axis for n, axis in (means or {}).items()
                           if n in self._index}
        self._sums = {}  # tensor index -> (sum of each channel, values per channel)

    def run(self, batches, num_calib_examples=None):
        """Adds the statistics of `batches` (a DataLoader, DataIter, or
        iterable of NDArrays / lists of NDArrays / DataBatches; data first,
        in the order of data_names) over at most `num_calib_examples` of
        their examples: the batch reaching it is cut, and no further batch
        is read. Returns the number of examples seen so far (all runs)."""
        limit = _check_limit(num_calib_examples)
        batches = data.batches_of(batches)
        if batches is None:
            raise OptionError("no calibration data: pass calib_data (calibration batches)")
        seen = 0
        for arrays in batches:
            arrays = self._inputs_of(arrays)
            if limit is not None and seen + arrays[0].shape[0] > limit:
                arrays = [a[:limit - seen] for a in arrays]
            for part in _slices(arrays[0].shape[0], self.rows):
                with memory_for(f"calibrating: running the float32 model on examples "
                                f"{seen + part.start}-{seen + part.stop - 1} of the "
                                f"calibration data"):
                    self._forward([a[part] for a in arrays])
            seen += arrays[0].shape[0]
            self.num_examples += arrays[0].shape[0]
            self.num_batches += 1
            log.info("calibration (%s): batch %d, %d examples", self.calib_mode,
                     self.num_batches, self.num_examples)
            if seen == limit:
                break
        if not seen:
            raise OptionError("the calibration data gave no batches")
        return self.num_examples

    def histogram(self, name):
        """(counts, edges) of tensor `name` (mode 'entropy'), as np.histogram."""
        if self._hist is None:
            raise OptionError("histograms are collected in mode 'entropy' only")
        k = self.names.index(name)
        bound = self._range[k]
        return self._hist[k].copy(), np.linspace(-bound, bound, self._hist.shape[1] + 1)

    def stats(self):
        """{tensor name: TensorStats}; the threshold is naive_threshold's or
        (mode 'entropy') entropy_threshold's, never above the largest
        magnitude seen (the histogram's range may be up to 3 times wider)."""
        if not self.num_examples:
            raise OptionError("no calibration batch has run yet")
        result = {}
        for k, name in enumerate(self.names):
            low, high = float(self.min[k]), float(self.max[k])
            threshold = float(naive_threshold(low, high))
            if self.calib_mode == "entropy":
                threshold = min(threshold, entropy_threshold(*self.histogram(name)))
            total = self._sums.get(k)
            mean = None if total is None else total[0] / total[1]
            result[name] = TensorStats(name, low, high, threshold or 1.0, low < 0, mean)
            log.debug("calibrated %s: min %g max %g threshold %g", name, low, high, threshold)
        return result

    def _inputs_of(self, arrays):
        if len(arrays) < len(self.data_names):
            raise OptionError(f"a calibration batch holds {len(arrays)} arrays, the model "
                              f"takes {len(self.data_names)} inputs {self.data_names}")
        return arrays[:len(self.data_names)]

    def _forward(self, arrays):
        """Runs one batch; the monitor callback (:meth:`_watch`) takes each
        wanted tensor as its operator writes it."""
        feeds = {n: a for n, a in zip(self.data_names, arrays) if n in self._arguments}
        shapes = {n: a.shape for n, a in feeds.items()}
        if shapes != self._shapes:
            self._exe = self._shapes = None  # frees the last executor's memory first
            self._exe, self._shapes = self._bind(shapes), shapes
            self._exe.set_monitor_callback(self._watch)
        for name, array in feeds.items():
            array.copyto(self._exe.arg_dict[name])
        self._seen.clear()
        for name in self._inputs:
            self._watched(name, self._exe.arg_dict.get(name, self._exe.aux_dict.get(name)))
        try:
            for output in self._exe.forward(is_train=False):
                output.wait_to_read()
            if self._error is None:  # else the first error is raised
                self._read(keep=0)
        finally:
            self._copies.pending.clear()  # left by an error
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        missing = sorted(set(self.names) - self._seen)
        if missing:  # never seen; a clear error rather than thresholds left out
            raise RuntimeError(f"MXNet's executor reported no values of the tensors "
                               f"{missing[:_SHOWN]} while calibrating")

    def _watch(self, name, handle):
        """The executor's monitor callback: an operator has written output
        `name` (bytes). Every handle is wrapped, so that it is freed; an
        error is kept for :meth:`_forward` (ctypes would drop it)."""
        array = mx.nd.NDArray(ctypes.cast(handle, NDArrayHandle), writable=False)
        if self._error is None:
            try:
                self._watched(name.decode(), array)
            except Exception as err:  # noqa: BLE001 (re-raised by _forward)
                self._error = err

    def _watched(self, name, array):
        """Tensor `name` has been written (or will be, by an operator MXNet
        has been given): its copy is queued, and the one before it read, so
        that MXNet computes the next operator while numpy reduces."""
        k = self._index.get(name)
        if k is None or name in self._seen:
            return
        self._seen.add(name)
        if array.dtype != np.float32:
            self._reduce(k, as_numpy(array))  # e.g. bfloat16, which numpy cannot reduce
            return
        self._copies.add(k, array)
        self._read(keep=1)

    def _read(self, keep):
        """Reduces the queued copies but the last `keep`."""
        while len(self._copies.pending) > keep:
            self._reduce(*self._copies.take())

    def _reduce(self, k, values):
        """Adds a tensor's values to the statistics of tensor `k`."""
        low, high = values.min(), values.max()
        if not (np.isfinite(low) and np.isfinite(high)):
            raise OptionError(f"tensor {self.names[k]!r} holds NaN or infinite values in "
                              f"calibration batch {self.num_batches + 1}")
        self.min[k], self.max[k] = min(self.min[k], low), max(self.max[k], high)
        if self._hist is not None:
            self._add_histogram(k, values, float(naive_threshold(low, high)))
        if k in self._mean_axis:
            self._add_sums(k, values)

    def _bind(self, shapes):
        # The parameters' shapes too, so that one not fitting the model is named.
        # A data input that arg_params also holds takes the batch's shape.
        known = {n: a.shape for n, a in self._arg_params.items()
                 if n in self._arguments and n not in shapes}
        try:
            with no_graph_fusion():  # fused kernels would not give every inner output
                exe = self._group.simple_bind(mx.cpu(), grad_req="null", **known, **shapes)
        except RuntimeError as err:  # simple_bind re-raises MXNetError as RuntimeError
            if is_out_of_memory(err):
                raise
            raise OptionError(f"the model cannot run on calibration batches of shapes "
                              f"{shapes}: {mxnet_message(err)}") from None
        params = {n: a for n, a in self._arg_params.items() if n not in shapes}
        exe.copy_params_from(params, self._aux_params, allow_extra_params=True)
        return exe

    def _add_sums(self, k, values):
        """Adds a tensor's sums per channel; a tensor whose channels change
        from batch to batch, or that has none, gets no mean."""
        axis = self._mean_axis[k]
        total, count = self._sums.get(k, (0.0, 0))
        if values.ndim >= 2:
            if axis is None:
                sums = values.sum(axis=0, dtype=np.float64).ravel()
            else:  # summed in place: no transposed copy
                keep = axis % values.ndim
                sums = values.sum(axis=tuple(i for i in range(values.ndim) if i != keep),
                                  dtype=np.float64)
            if not count or len(total) == len(sums):
                self._sums[k] = (total + sums, count + values.size // len(sums))
                return
        del self._mean_axis[k]
        self._sums.pop(k, None)

    def _add_histogram(self, k, values, bound):
        if self._range[k] == 0:
            self._range[k] = bound  # so far only zeros, all in the zero bin: any range holds them
        while self._range[k] < bound:
            self._hist[k] = _tripled(self._hist[k])
            self._range[k] *= 3
        if self._range[k] == 0:
            self._hist[k, self._hist.shape[1] // 2] += values.size
        else:
            self._hist[k] += _histogram(values, self._range[k], self._hist.shape[1])


class _Copies:
    """Copies of float32 tensors on MXNet's engine, to be read by numpy in
    the order queued: one buffer per copy in flight (two: one being read,
    one being made), each reused for every tensor (fresh arrays would cost
    more in page faults than the copies). A copy, not a view of the
    executor's own array, which would reorder it out of a oneDNN layout in
    place and so change what later operators compute from it."""

    def __init__(self):
        self.buffers = [mx.nd.empty((1,)), mx.nd.empty((1,))]
        self.views = {}  # (buffer index, shape) -> a view of the buffer in that shape
        self.pending = collections.deque()  # (tensor index, copy), oldest first
        self.turn = 0

    def add(self, k, array):
        """Queues the copy of `array`, tensor `k`'s value."""
        j, self.turn = self.turn, 1 - self.turn
        shape = array.shape
        view = self.views.get((j, shape))
        if view is None:
            size = int(np.prod(shape))
            if self.buffers[j].size < size:  # a copy still queued keeps the old one
                self.buffers[j] = mx.nd.empty((size,))
                self.views = {key: v for key, v in self.views.items() if key[0] != j}
            view = self.views[(j, shape)] = self.buffers[j][:size].reshape(shape)
        array.copyto(view)
        self.pending.append((k, view))

    def take(self):
        """(tensor index, values) of the oldest copy, once MXNet has made it."""
        k, view = self.pending.popleft()
        return k, memory_view(view)


def _slices(count, most):
    """`count` examples in slices of at most `most`, of one size where
    `count` allows (one executor then serves them all)."""
    size = -(-count // -(-count // most))
    return [slice(start, min(start + size, count)) for start in range(0, count, size)]


def _histogram(values, bound, bins):
    """``np.histogram(values, bins, (-bound, bound))[0]`` up to rounding at the
    bin edges, twice as fast: a float32 multiply-add and a bincount per value,
    block by block so that the temporaries stay in cache."""
    counts = np.zeros(bins, dtype=np.int64)
    offset, scale = np.float32(bound), np.float32(bins / (2 * bound))
    flat = values.reshape(-1)
    for start in range(0, flat.size, _BLOCK):
        index = ((flat[start:start + _BLOCK] + offset) * scale).astype(np.intp)
        np.minimum(index, bins - 1, out=index)  # the largest value sits on the last edge
        counts += np.bincount(index, minlength=bins)
    return counts


def _tripled(hist):
    """`hist` over [-R, R] re-binned over [-3R, 3R]: old bins 3j..3j+2 make one
    new bin, and the new bins beyond [-R, R] are empty."""
    merged = hist.reshape(-1, 3).sum(axis=1)
    side = (len(hist) - len(merged)) // 2
    return np.pad(merged, side)


def _check_limit(num_calib_examples):
    if num_calib_examples is None:
        return None
    if isinstance(num_calib_examples, bool) or not isinstance(num_calib_examples, int):
        raise OptionTypeError(f"num_calib_examples must be an int or None, "
                              f"got {type(num_calib_examples).__name__}")
    if num_calib_examples < 1:
        raise OptionError(f"num_calib_examples must be at least 1, got {num_calib_examples}")
    return num_calib_examples


def _group_of(graph, names):
    """One symbol computing the tensors `names` of `graph`: the group of
    those no other of them depends on (the others are computed on the way)."""
    if not names:
        raise OptionError("no tensors to calibrate: names is empty")
    outputs = graph.outputs()
    unknown = sorted(set(names) - set(outputs))
    if unknown:
        allowed = sorted(outputs)
        more = f" ... ({len(allowed) - _SHOWN} more)" if len(allowed) > _SHOWN else ""
        raise OptionError(f"{unknown} are not tensors of the model; its tensors (internal "
                          f"outputs) are {allowed[:_SHOWN]}{more}")
    wanted = {outputs[name] for name in names}
    read = [False] * len(graph.nodes)  # a wanted node depends on this one
    for nid in reversed(range(len(graph.nodes))):  # readers come after their inputs
        if read[nid] or nid in wanted:
            for entry in graph.nodes[nid]["inputs"]:
                read[entry[0]] = True
    return mx.sym.Group(internal_outputs(graph.symbol,
                                         [name for name in names if not read[outputs[name]]]))


def _check_inputs(sym, group, arg_params, aux_params, data_names):
    """The data inputs exist, and every other input of the wanted tensors is
    a parameter or a label."""
    inputs = sym.list_inputs()
    unknown = sorted(set(data_names) - set(inputs))
    if unknown:
        raise OptionError(f"data_names {unknown} are not inputs of the model; its inputs are "
                          f"{sorted(inputs)[:_SHOWN]}")
    known = set(data_names) | set(arg_params) | set(aux_params)
    aux = set(group.list_auxiliary_states())
    missing = sorted(n for n in group.list_inputs()
                     if n not in known and (n in aux or not n.endswith("label")))
    if missing:
        raise OptionError(f"arg_params / aux_params lack {missing[:_SHOWN]}, which the "
                          f"calibrated tensors depend on")
