"""MXNet 1.9.1's own INT8 graph format: ``quantized_*`` operators,
``_contrib_quantize_v2`` / ``_contrib_requantize`` nodes whose calibrated
ranges are the attributes ``min_calib_range`` / ``max_calib_range``, and
weights stored as int8 with ``*_quantize_min`` / ``*_quantize_max`` inputs.

The graph is built by the quantization pass MXNet registers in C++
(``MXQuantizeSymbol``, ``MXSetCalibTableToQuantizedSymbol``) and runs on
MXNet's own INT8 operators. mxamp uses it where its oneDNN 3 backend cannot
take the model (ranges computed at run time, graphs MXNet has already fused),
and to serve the reference's lower-level functions; the thresholds come from
mxamp's calibration (``calibrate.py``).

A threshold table (``th_dict``) maps a calibrated tensor's name (an internal
output such as 'conv0_output', or a data input) to its ``(min, max)`` range.
"""
import collections
import ctypes
import logging

import mxnet as mx
import numpy as np
from mxnet.base import SymbolHandle, _LIB, c_array, c_str, c_str_array, check_call, mx_uint

from ..dtypes import FLOAT32, as_numpy, dtype_name
from ..errors import OptionError, OptionTypeError, mxnet_message
from ..graph import Graph, infer_entry_types
from . import calibrate

log = logging.getLogger(__name__)

FUSED_PREFIX = "_sg_mkldnn_"  # operators of MXNet's own oneDNN fusion passes
FUSION = "MKLDNN_QUANTIZE"  # MXNet's oneDNN fusion pass before and after its quantization
_QUANTIZED_PARAMS = ("weight_quantize", "bias_quantize")
# MXNet's unfused INT8 convolution (oneDNN) takes only uint8 data; its fused
# one (_sg_mkldnn_conv) takes int8 too.
_UNFUSED_CONV = "_contrib_quantized_conv"


def is_fused(sym):
    """Whether `sym` (a symbol or a :class:`mxamp.graph.Graph`) holds nodes
    MXNet's oneDNN fusion passes made."""
    return any(node["op"].startswith(FUSED_PREFIX) for node in Graph.of(sym).nodes)


def _names(value, what):
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise OptionTypeError(f"{what} must be a list of str, got {value!r}")
    return value


def quantize_symbol(sym, ctx, excluded_symbols=None, excluded_operators=None,
                    offline_params=None, quantized_dtype="int8", quantize_mode="smart",
                    quantize_granularity="tensor-wise"):
    """MXNet's quantization pass over `sym`: returns the uncalibrated
    quantized symbol and the names of the tensors it wants calibrated.
    `offline_params` are parameters quantized ahead (see quantize_params)."""
    excluded_symbols = _names(excluded_symbols, "excluded_symbols")
    excluded_operators = _names(excluded_operators, "excluded_operators")
    offline = _names(list(offline_params or []), "offline_params")
    out, size = SymbolHandle(), mx_uint()
    calib = ctypes.POINTER(ctypes.c_char_p)()
    try:
        check_call(_LIB.MXQuantizeSymbol(
            sym.handle, ctypes.byref(out), ctypes.byref(ctypes.c_int(ctx.device_typeid)),
            mx_uint(len(excluded_symbols)), c_str_array(excluded_symbols),
            mx_uint(len(excluded_operators)), c_str_array(excluded_operators),
            mx_uint(len(offline)), c_array(ctypes.c_char_p, [c_str(n) for n in offline]),
            c_str(quantized_dtype), ctypes.c_bool(True), c_str(quantize_mode),
            c_str(quantize_granularity), ctypes.byref(size), ctypes.byref(calib)))
    except mx.MXNetError as err:
        raise OptionError(f"MXNet's quantization pass refused the model: "
                          f"{mxnet_message(err)}") from None
    return mx.sym.Symbol(out), [calib[i].decode() for i in range(size.value)]


def set_thresholds(qsym, th_dict):
    """A copy of `qsym` whose quantize / requantize nodes carry the ranges of
    `th_dict` as min_calib_range / max_calib_range."""
    if not th_dict:
        return qsym
    names = list(th_dict)
    out = SymbolHandle()
    check_call(_LIB.MXSetCalibTableToQuantizedSymbol(
        qsym.handle, mx_uint(len(names)), c_str_array(names),
        c_array(ctypes.c_float, [float(th_dict[n][0]) for n in names]),
        c_array(ctypes.c_float, [float(th_dict[n][1]) for n in names]),
        ctypes.byref(out)))
    return mx.sym.Symbol(out)


def quantize_params(qsym, params, th_dict):
    """The parameters `qsym` takes: each ``*_quantize`` weight or bias as int8
    over its own range (with its ``_min`` / ``_max``), the others as given,
    and a calibrated range input from `th_dict`."""
    result = {}
    for name in qsym.list_arguments():
        if name.endswith(_QUANTIZED_PARAMS):
            value = params[name[:-len("_quantize")]]
            result[name], result[name + "_min"], result[name + "_max"] = mx.nd.contrib.quantize(
                value, mx.nd.min(value), mx.nd.max(value), out_type="int8")
        elif name in params:
            result[name] = params[name]
        else:
            for end, k in (("_min", 0), ("_max", 1)):
                if name.endswith(end) and name[:-len(end)] in th_dict:
                    result[name] = mx.nd.array([th_dict[name[:-len(end)]][k]])
    return result


def combine_histogram(old_hist, arr, new_min, new_max, new_th):
    """Add an array to a histogram record, as the reference's helper does.

    Where `new_th` reaches beyond the record's threshold, the range grows by
    whole old-sized bins on each side, so that the old counts keep their bins.

    Parameters
    ----------
    old_hist : tuple
        ``(counts, edges, min, max, threshold)`` over [-threshold, threshold].
    arr : numpy.ndarray
        The values to add.
    new_min, new_max, new_th : float
        `arr`'s minimum, maximum and largest magnitude.

    Returns
    -------
    tuple
        The new record.
    """
    counts, edges, low, high, bound = old_hist
    low, high = min(low, new_min), max(high, new_max)
    if new_th <= bound:
        return counts + np.histogram(arr, bins=len(counts), range=(-bound, bound))[0], \
            edges, low, high, bound
    width = 2 * bound / len(counts)
    extra = int((new_th - bound) // width + 1)
    bound += extra * width
    grown, edges = np.histogram(arr, bins=len(counts) + 2 * extra, range=(-bound, bound))
    grown[extra:extra + len(counts)] += counts
    return grown, edges, low, high, bound


def smooth_distribution(p, eps=calibrate.EPS):
    """`p` with each zero entry raised to `eps` and the total taken evenly off
    the non-zero entries; ValueError if every entry is zero."""
    p = np.asarray(p)
    zeros = p == 0
    if zeros.all():
        raise ValueError("the distribution is all zeros: nothing to smooth")
    taken = eps * zeros.sum() / (~zeros).sum()
    if taken >= p[~zeros].min():
        raise ValueError(f"eps={eps} is too large for this distribution: a non-zero "
                         f"entry would drop to zero or below")
    return np.where(zeros, eps, p - taken).astype(np.float32)


def optimal_threshold(hist_data, quantized_dtype, num_quantized_bins=255):
    """``(min, max, threshold, divergence)`` of a histogram record, by
    calibrate.entropy_search. A tensor with no negative value to be
    quantized unsigned ('auto', 'uint8') uses twice the levels."""
    counts, edges, low, high, _ = hist_data
    if low >= 0 and quantized_dtype in ("auto", "uint8"):
        num_quantized_bins = 2 * num_quantized_bins + 1
    threshold, divergence = calibrate.entropy_search(counts, edges, num_quantized_bins)
    return low, high, threshold, divergence


def range_of(low, threshold, quantized_dtype):
    """The calibrated range of a tensor whose minimum is `low`: [0, T] when
    it is quantized unsigned and never negative, else [-T, T]."""
    if low >= 0 and quantized_dtype in ("auto", "uint8"):
        return 0.0, threshold
    return -threshold, threshold


def optimal_thresholds(hist_dict, quantized_dtype, num_quantized_bins=255):
    """{name: (min, max)} range of each histogram record of `hist_dict`."""
    if not isinstance(hist_dict, dict):
        raise OptionTypeError(f"hist_dict must be a dict, got {type(hist_dict).__name__}")
    result = {}
    for name, record in hist_dict.items():
        low, _, threshold, _ = optimal_threshold(record, quantized_dtype, num_quantized_bins)
        result[name] = range_of(low, threshold, quantized_dtype)
    return result


class MonitorCollector:
    """Records the tensors `names` an executor's monitor callback shows
    (``exe.set_monitor_callback(collector.collect, monitor_all=True)``):
    each one's (min, max) in ``min_max_dict`` and, for 'entropy', its
    histogram record in ``hist_dict``."""

    def __init__(self, names, calib_mode="entropy", num_bins=calibrate.NUM_BINS):
        self.names, self.calib_mode, self.num_bins = set(names), calib_mode, num_bins
        self.min_max_dict, self.hist_dict = {}, {}

    def collect(self, name, arr):
        """The monitor callback: `name` (bytes or str) and an NDArray handle."""
        name = name.decode() if isinstance(name, bytes) else name
        if name not in self.names:
            return
        values = as_numpy(mx.nd.NDArray(ctypes.cast(arr, mx.base.NDArrayHandle),
                                        writable=False))
        low, high = float(values.min()), float(values.max())
        old = self.min_max_dict.get(name, (low, high))
        self.min_max_dict[name] = (min(old[0], low), max(old[1], high))
        if self.calib_mode != "entropy":
            return
        bound = max(abs(low), abs(high))
        if name in self.hist_dict:
            self.hist_dict[name] = combine_histogram(self.hist_dict[name], values, low, high,
                                                     bound)
        else:
            counts, edges = np.histogram(values, bins=self.num_bins, range=(-bound, bound))
            self.hist_dict[name] = (counts, edges, low, high, bound)


def thresholds(stats, calib_mode, quantized_dtype):
    """A threshold table from calibrate.collect's {name: TensorStats}: the
    range seen ('naive'), or the entropy threshold's range ('entropy')."""
    if calib_mode == "naive":
        return {n: (s.min, s.max) for n, s in stats.items()}
    return {n: range_of(s.min, s.threshold, quantized_dtype) for n, s in stats.items()}


def quantize(sym, arg_params, aux_params, data_names, batches, calib_mode="entropy",
             num_calib_examples=None, excluded_sym_names=None, excluded_op_names=None,
             quantized_dtype="int8", quantize_mode="smart", quantize_granularity="tensor-wise",
             fuse=False):
    """``(qsym, qarg_params, aux_params)`` in MXNet's format: MXNet's pass,
    then (unless `calib_mode` is 'none') mxamp's calibration over `batches`
    written into the graph, then the parameters quantized. `fuse` runs
    MXNet's MKL-DNN fusion (FUSION) on the model first and on the result."""
    if fuse:
        sym = sym.get_backend_symbol(FUSION)
    qsym, wanted = quantize_symbol(sym, mx.cpu(), excluded_sym_names, excluded_op_names,
                                   list(arg_params), quantized_dtype, quantize_mode,
                                   quantize_granularity)
    th_dict = {}
    if calib_mode != "none" and wanted:
        stats = calibrate.collect(sym, arg_params, aux_params, wanted, batches, data_names,
                                  calib_mode, num_calib_examples)
        th_dict = thresholds(stats, calib_mode, quantized_dtype)
        qsym = set_thresholds(qsym, th_dict)
    log.info("INT8 (MXNet's graph format): %d tensors calibrated (%s)", len(th_dict), calib_mode)
    if fuse:
        qsym = qsym.get_backend_symbol(FUSION)
    elif calib_mode == "none":
        _check_conv_inputs(qsym, data_names)
    return qsym, quantize_params(qsym, arg_params, th_dict), aux_params


def _check_conv_inputs(qsym, data_names):
    """Refuses, before anything runs, an uncalibrated graph whose INT8
    convolutions read int8, which MXNet's unfused INT8 convolution cannot run
    ("mkldnn_quantized_conv op only supports uint8 as input type" at the first
    forward pass), and warns where they read uint8, which it runs far from
    float32 (test_dropin_quantization measures it, on AVX-512 and AVX2 CPUs
    alike). Without calibrated ranges, a convolution
    reads int8 where its data is quantized as int8 ('int8', or 'auto', which
    knows no range) and after any requantized layer (MXNet requantizes to int8)."""
    graph = Graph(qsym)
    types = infer_entry_types(qsym, {name: FLOAT32 for name in data_names})
    reads = collections.defaultdict(list)  # input dtype -> convolutions
    for node in graph.nodes:
        if node["op"] == _UNFUSED_CONV:
            dtype = dtype_name(types.get(tuple(node["inputs"][0][:2]), -1))
            reads[dtype].append(node["name"][len("quantized_"):])
    if reads["int8"]:
        raise OptionError(
            f"calib_mode='none' cannot run this model in MXNet's INT8 graph format: MXNet's "
            f"unfused INT8 convolution takes only uint8 input, and without calibrated ranges "
            f"{len(reads['int8'])} convolution(s) would read int8 ({_listed(reads['int8'])}). "
            f"Calibrate instead (calib_mode='naive' or 'entropy' with calib_data: mxamp's "
            f"oneDNN INT8 regions), or use quantize_model_mkldnn with calib_mode='none' "
            f"(MXNet's fused INT8 graph, which takes int8), or keep those layers float32 "
            f"(excluded_sym_names)")
    if reads["uint8"]:
        log.warning("INT8: calib_mode='none': MXNet's unfused INT8 convolution is far from "
                    "float32 on uint8 input (measured on a 1x1 convolution: relative error "
                    "0.74 with bias, 1.0 without), and convolution(s) %s read uint8; "
                    "calibrate (calib_mode='naive' or 'entropy') for mxamp's oneDNN INT8 "
                    "regions", _listed(reads["uint8"]))


def _listed(names, most=5):
    return ", ".join(names[:most]) + (" ..." if len(names) > most else "")
