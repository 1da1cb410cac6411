"""mxamp's oneDNN 3 execution backend.

:func:`apply_backend` partitions a model with the graph pass of mxamp's
extension library: regions of the operators its table holds
(:func:`operator_table`: Convolution with folded BatchNorm, FullyConnected,
activations, residual adds, Pooling, normalisations, batch_dot, views, and
the casts among them) become ``_mxamp_onednn_region``
nodes, each running as one chain of oneDNN primitives (and a few kernels
of mxamp's own) in bfloat16, float32 or INT8. Everything else stays on
MXNet.

The library is built (once, cached) and loaded on first use; a model saved
with region nodes loads only in a process that has loaded it too
(``mxamp.backends.get("onednn")``, or :func:`mxamp.load`).
"""
import ctypes
import dataclasses
import functools
import json
import logging
import os
import threading
from pathlib import Path

import mxnet as mx
import numpy as np

from .. import cpu, native
from ..dtypes import DTYPE_CODES, FLOAT32, in_cpu_memory, is_bfloat16, to_code
from ..errors import BackendError, OptionError, OptionTypeError, memory_for, mxnet_message
from ..graph import Graph, check_params, graph_json, infer_entry_types
from . import onednn_int8

log = logging.getLogger(__name__)

#: The name of the backend's selector and review as MXNet's partitioner
#: (``Symbol.optimize_for``): the library's load check runs it; the pass
#: forms the same regions in time linear in the graph's size.
PARTITIONER = "mxamp_onednn"
#: The operator a region node runs.
REGION_OP = "_mxamp_onednn_region"
#: The library's pass that forms the regions (given the selector's options)
#: and makes the partitioned graph final.
FINISH = "mxamp_onednn_finish"
BFLOAT16 = DTYPE_CODES["bfloat16"]
FLOAT16 = DTYPE_CODES["float16"]


# MXNet 1.9.1 keeps a custom partitioner's options and its selector in one
# process-wide object per partitioner (CustomSubgraphProperty's options_map_,
# opt_keys_ and sel_inst), replaced by each optimize_for call: two calls at
# once would read each other's. Loading runs the partitioner on a probe graph
# and takes this lock; partitioning takes it too, around the library's pass.
# The library keeps nothing between calls (what a partitioning learns and
# reports stays with the calling thread).
_partitioning = threading.RLock()


def load():
    """Build (if needed) and load the backend library.

    Returns
    -------
    pathlib.Path
        The library's path.

    Raises
    ------
    RuntimeError
        Without the oneDNN 3 packages, naming them.
    """
    with _partitioning:
        return native.load(native.ONEDNN)


@functools.lru_cache(maxsize=None)
def _library(path):
    """The loaded backend library's own queries (the same loaded copy MXNet
    uses: dlopen hands out one per path)."""
    lib = ctypes.CDLL(str(path))
    for query in (lib.mxamp_onednn_fallbacks, lib.mxamp_onednn_error,
                  lib.mxamp_onednn_cpu_features, lib.mxamp_onednn_table,
                  lib.mxamp_onednn_int8_layers, lib.mxamp_onednn_widened,
                  lib.mxamp_onednn_float32_weights, lib.mxamp_onednn_outside,
                  lib.mxamp_onednn_regions, lib.mxamp_onednn_float32_weight_layers):
        query.restype = ctypes.c_char_p
    lib.mxamp_onednn_corrected.restype = ctypes.c_int
    lib.mxamp_onednn_int8_layers.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.mxamp_onednn_bf16_slowdown.restype = ctypes.c_double
    lib.mxamp_onednn_bf16_slowdown.argtypes = [ctypes.c_int]
    return lib


#: The environment variables that set the regions' thread count instead of
#: one per core (engine.cc's kThreadVariables; the test of region_threads
#: checks each).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MXNET_OMP_MAX_THREADS", "OMP_PROC_BIND", "OMP_PLACES",
                    "GOMP_CPU_AFFINITY")


def region_threads():
    """How many threads each region runs on.

    One per core this process may run on (the distinct sibling lists sysfs
    gives for the CPUs of its affinity mask). MXNet's own operators take half
    the CPUs on x86, which leaves half the cores idle where each CPU is a core
    (VMs that show one thread per core). Read once, at the first region's run
    or this call.

    Returns
    -------
    int or None
        None where one of :data:`THREAD_VARIABLES` is set (or sysfs does not
        say): regions then keep MXNet's count.
    """
    return _library(load()).mxamp_onednn_region_threads() or None


def _threads_text():
    threads = region_threads()
    if threads:
        return f"{threads} thread{'s' * (threads > 1)}, one per core"
    set_by = [f"{k}={os.environ[k]}" for k in THREAD_VARIABLES if os.environ.get(k)]
    return f"MXNet's OpenMP threads ({', '.join(set_by) or 'no core count in sysfs'})"


def set_verbose(level):
    """Turn oneDNN 3's verbose mode on or off from now on.

    It covers oneDNN's primitives and the calls of the backend's own kernels,
    logged in oneDNN's format under the implementations ``mxamp_dw3x3``,
    ``mxamp_softmax`` and ``mxamp_table``. The environment variable
    ``ONEDNN_VERBOSE`` sets both when the process starts.

    Parameters
    ----------
    level : int
        0 (off), 1 (a line per primitive call) or 2 (calls and creation).

    Raises
    ------
    mxamp.OptionError
        For a level oneDNN refuses.
    """
    status = _library(load()).mxamp_onednn_set_verbose(level)
    if status != 0:
        raise OptionError(f"oneDNN refused verbose level {level!r} (status {status}); "
                          "it takes 0 (off), 1 (calls) or 2 (calls and creation)")


def cpu_features():
    """The CPU features oneDNN 3 uses here, as the backend library finds them.

    Returns
    -------
    list of str
        Names of ``mxamp.cpu.FEATURES`` (its effective ISA, which honours
        ``ONEDNN_MAX_CPU_ISA``): what ``mxamp.cpu.features("onednn")``
        predicts.
    """
    return _library(load()).mxamp_onednn_cpu_features().decode().split()


# How fast bfloat16 dot products are against float32 ones is a fact of the
# CPU, not of its ISA class: with AVX512-BF16 both, an Intel Xeon without AMX
# takes 2-2.4x as long in bfloat16 (its vdpbf16ps issues at half the FMA
# rate) and an AMD Zen 4 about half as long. bf16_speed.json holds the CPUs
# bench/bf16_dot_speed.py measured; others are measured once per process.
SPEEDS = Path(__file__).with_name("bf16_speed.json")
# Regions planned in bfloat16 compute in float32 where bfloat16 dot products
# take more than this many times float32's time. Per region, not per
# operator: the memory-bound layers bfloat16 still wins (depthwise
# convolutions, 91 against 120 ms on that Xeon) are a fifth of MobileNet v2's
# time, and mixing types in a region adds a conversion at each change.
BF16_SLOWER = 1.0
_ROUNDS = 10  # timed calls of each type, interleaved (0.4 s in all on that Xeon)


@dataclasses.dataclass(frozen=True)
class Bf16Speed:
    """How oneDNN 3's bfloat16 dot products compare with float32 ones on this CPU.

    Attributes
    ----------
    slowdown : float
        The time of a bfloat16 inner product over a float32 one's (below 1:
        bfloat16 is faster).
    source : str
        Where the figure comes from, for messages.
    """
    slowdown: float
    source: str

    @property
    def slower(self):
        """Whether regions planned in bfloat16 compute in float32 here."""
        return self.slowdown > BF16_SLOWER


@functools.lru_cache(maxsize=None)
def speed_data():
    """The shipped bfloat16 speed measurements, per CPU.

    Returns
    -------
    dict
        ``bf16_speed.json``, which ``bench/bf16_dot_speed.py`` writes (its
        ``"about"`` says how).
    """
    return json.loads(SPEEDS.read_text())


def _features():
    return " ".join(cpu.features("onednn").names())


@functools.lru_cache(maxsize=None)
def _measured():
    slowdown = _library(load()).mxamp_onednn_bf16_slowdown(_ROUNDS)
    if slowdown < 0:
        raise BackendError("oneDNN failed to time its bfloat16 inner product on this CPU "
                           f"({cpu.describe()}); pass compute='float32' or "
                           "compute='bfloat16' (backend_compute= in convert_model and "
                           "convert_hybrid_block) to choose without timing")
    return Bf16Speed(slowdown, f"measured here, fastest of {_ROUNDS} interleaved calls")


def bf16_speed(measure=False):
    """This CPU's bfloat16 speed against float32.

    From ``bf16_speed.json`` for a CPU it holds (by vendor, family and model,
    with the same oneDNN features: an ISA limit that changes them is
    measured), else measured once per process by the library (a 512 x 512 x
    512 inner product in each type on one thread, about 0.4 s).

    Parameters
    ----------
    measure : bool
        Measure again; later calls use the new figure.

    Returns
    -------
    Bf16Speed or None
        None where oneDNN 3 has no bfloat16 instructions.
    """
    if not cpu.features("onednn").bf16:
        return None
    entry = speed_data()["cpus"].get(cpu.identity() or "")
    if measure:
        _measured.cache_clear()
    elif entry is not None and entry["features"] == _features():
        return Bf16Speed(entry["slowdown"], f"{SPEEDS.name}, {cpu.identity()}")
    return _measured()


def _resolve_compute(compute):
    """The compute type a partitioning asked for `compute` uses: None is
    bfloat16, or float32 where bfloat16 dot products are slower here (one
    WARNING says so); given, it is used as it is."""
    if compute is not None:
        return compute
    speed = bf16_speed()
    if speed is None or not speed.slower:
        return "bfloat16"
    log.warning("oneDNN backend: bfloat16 dot products take %.2fx the time of float32 ones on "
                "this CPU (%s; %s), so regions planned in bfloat16 compute in float32 "
                "(bfloat16 inputs and weights widened where a region reads them); "
                "compute='bfloat16' keeps bfloat16", speed.slowdown, cpu.model(), speed.source)
    return "float32"


@dataclasses.dataclass(frozen=True)
class OperatorRow:
    """What the backend knows about one operator: a row of its table.

    The table lives in the C++ library (``src/operator/onednn/table.cc``);
    :func:`operator_table` reads it.

    Attributes
    ----------
    op : str
        The operator's name.
    dtypes : frozenset of str
        The data types it computes in (``"float32"``, ``"bfloat16"``,
        ``"int8"``).
    int8 : str
        Its part in an INT8 region: ``"quantizes"`` (quantizes its calibrated
        data inputs: INT8 starts there), ``"quantized"`` (reads s8/u8 where its
        inputs are, and may requantize its output), ``"float"`` (computes in
        float: bfloat16 where oneDNN stores it, from AVX-512 up; its output is
        requantized where every reader takes INT8), ``"narrowest"`` (as
        ``"float"``, but reads and writes s8/u8 where oneDNN stores no
        bfloat16: LayerNorm) or ``"none"`` (casts, views, transposes,
        BatchNorm folded into weights: INT8 passes through).
    post_op : bool
        It fuses into the primitive before it (activations as post-ops,
        BatchNorm into the convolution's weights).
    params : tuple of str
        Its inputs the region packs as parameters.
    f32_inside : bool
        From bfloat16 data it computes in float32 inside, so the backend
        takes it even where a conversion kept it float32.
    f32_in_bf16 : bool
        In bfloat16 regions (not INT8) it computes and writes float32, and
        the layers, adds, matmuls and normalisations whose output it reads
        write that in float32: LayerNorm, so that a
        transformer's residual stream stays float32, as MXNet's own bfloat16
        graph keeps it.
    apart : bool
        It keeps images apart (each image of its output reads only that image
        of its data), so a region of such operators may run a batch in chunks.
    aux : tuple of int
        Its inputs MXNet holds as auxiliary states (BatchNorm's moving
        statistics), which a region reads as such.
    """
    op: str
    dtypes: frozenset
    int8: str
    post_op: bool
    params: tuple
    f32_inside: bool = False
    f32_in_bf16: bool = False
    apart: bool = True
    aux: tuple = ()


@functools.lru_cache(maxsize=None)
def operator_table():
    """The backend's operator table, read from its library.

    Returns
    -------
    dict of str to OperatorRow
        Every operator the partitioner may put into a region.
    """
    rows = json.loads(_library(load()).mxamp_onednn_table().decode())
    return {r["op"]: OperatorRow(r["op"], frozenset(r["dtypes"]), r["int8"], r["post_op"],
                                 tuple(r["params"]), r["f32_inside"], r["f32_in_bf16"],
                                 r["apart"], tuple(r["aux"])) for r in rows}


def int8_layers(graph, input_ranges=""):
    """The layers with weights of a graph as the backend's INT8 regions take them.

    The library answers (src/operator/onednn/int8_layers.cc), so Python keeps
    no copy of the rules.

    Parameters
    ----------
    graph : dict or str
        A graph's JSON form (a model, or a region's subgraph), or its JSON
        text as MXNet wrote it (read as it is).
    input_ranges : str
        The region node's ``input_ranges`` (for a region's subgraph).

    Returns
    -------
    list of dict
        Per layer: its ``node`` (index), ``params`` (the node indices of its
        weight and bias inputs), ``data`` (the [node, output] it reads, casts
        aside), ``axis`` (of its data's channels: 1, -1, None for each value,
        "none" for no axis) and ``groups``, whether a region runs it in INT8
        (``int8``), the ``levels`` and ``step`` of its s8 weights, whether
        the graph holds them (``s8_weights``) and if not the finishing pass's
        reason (``float32_weights``, "" where it gave none), and the
        ``batchnorm`` folded into it ({node, params, eps, fix_gamma}), if any.

    Raises
    ------
    RuntimeError
        ``mxamp.errors.BackendError``, where the library cannot read the graph.
    """
    return json.loads(_answer(_library(load()).mxamp_onednn_int8_layers(
        _text(graph), input_ranges.encode())))


def _text(graph):
    """A graph for the library: its JSON text, as given or written."""
    return (graph if isinstance(graph, str) else json.dumps(graph, ensure_ascii=False)).encode()


def _answer(text):
    """A library query's answer (bytes) as text; BackendError where it says
    it failed."""
    text = text.decode()
    if text.startswith("error: "):
        raise BackendError(f"oneDNN backend: {text[len('error: '):]}")
    return text


def mean_axes(graph):
    """What calibration averages for bias correction, per layer.

    Parameters
    ----------
    graph : mxamp.graph.Graph
        The float32 model being quantized.

    Returns
    -------
    dict of str to int
        {node name: axis of its channels} of the tensors its layers with
        weights read as data (``mxamp.backends.onednn_int8.mean_axes``,
        from the library's answers, :func:`int8_layers`).
    """
    return onednn_int8.mean_axes(graph.nodes, int8_layers(graph.text or graph.json))


def float32_weight_layers(graph):
    """The INT8 layers of a model that read float32 weights, and why.

    The library answers for every INT8 region at once
    (src/operator/onednn/int8_layers.cc).

    Parameters
    ----------
    graph : dict
        The model's graph, JSON form.

    Returns
    -------
    dict of str to str
        {layer name: why}: the finishing pass's reason where it left the
        weights float32 (the library's words), ``onednn_int8.SAVED_BEFORE``
        for a model saved before INT8 models stored s8 weights.

    Raises
    ------
    RuntimeError
        ``mxamp.errors.BackendError``, where the library cannot read the graph.
    """
    lines = _answer(_library(load()).mxamp_onednn_float32_weight_layers(_text(graph)))
    return onednn_int8.float32_weight_layers(graph["nodes"], lines)


def left_outside(graph):
    """The operators the last partitioning on this thread left outside its
    regions, as its finishing pass reports them.

    Parameters
    ----------
    graph : mxamp.graph.Graph
        The graph it partitioned.

    Returns
    -------
    list of tuple
        ``(name, op)`` per operator node of the result outside regions; the
        name None for a node the pass added (a cast).
    """
    found = [line.split(" ", 1) for line in
             _library(load()).mxamp_onednn_outside().decode().splitlines()]
    return [(graph.nodes[int(nid)]["name"] if int(nid) >= 0 else None, op)
            for nid, op in found]


def _fallbacks(graph):
    """(name, op, reason) of each node of `graph` (JSON form) the last
    partitioning on this thread left on MXNet because oneDNN cannot run it
    on this CPU (the library reports the node's index: a name may hold any
    character)."""
    text = _library(load()).mxamp_onednn_fallbacks().decode()
    found = [line.split("\t", 1) for line in text.splitlines()]
    return [(graph["nodes"][int(nid)]["name"], graph["nodes"][int(nid)]["op"], reason)
            for nid, reason in found]


#: What a region may compute in.
COMPUTE_TYPES = ("bfloat16", "float32", "int8")
#: What an INT8 region computes in where it is not INT8.
REST_DTYPES = ("float32", "bfloat16")


def apply_backend(sym, arg_params, aux_params, compute=None, rest_dtype="float32"):
    """Offload the supported parts of a model to the oneDNN backend.

    Operator configurations the backend does not run stay on MXNet, and so do
    the nodes oneDNN refuses on this CPU (each named in a WARNING: the
    partitioner creates every chosen node's primitives, so that a region does
    not fail when it runs). With ``compute="bfloat16"`` everything stays on
    MXNet where the CPU lacks bfloat16 instructions (one WARNING). Safe to
    call from several threads.

    Parameters
    ----------
    sym : mxnet.symbol.Symbol
        A model converted to bfloat16 (only the nodes it runs in bfloat16 are
        offloaded) or a float32 model (every supported node is). It may also
        be a ``mxamp.graph.Graph`` (see :func:`partition`).
    arg_params, aux_params : dict of str to mxnet.nd.NDArray
        Its parameters.
    compute : str, optional
        What the regions compute in: None (the default) is ``"bfloat16"``, or
        ``"float32"`` on a CPU whose bfloat16 dot products are slower than its
        float32 ones (:func:`bf16_speed`; one WARNING says so);
        ``"bfloat16"`` whatever they cost; ``"float32"`` (the same oneDNN
        chains at full precision, on any x86 CPU); ``"int8"`` (INT8 where the
        graph carries the calibration :mod:`mxamp.quantization` sets,
        `rest_dtype` elsewhere).
    rest_dtype : str
        With ``compute="int8"``: what the regions compute in where not INT8,
        ``"float32"`` or ``"bfloat16"`` (on a CPU whose oneDNN has bfloat16
        instructions), converted inside the regions.

    Returns
    -------
    tuple
        ``(sym, arg_params, aux_params)``: new objects; the arguments are not
        modified.

    Raises
    ------
    mxamp.OptionError
        For an invalid option, or a model that has regions already.
    RuntimeError
        ``mxamp.errors.BackendError``, for a failure in the backend library,
        with its one-line message.
    """
    if not isinstance(sym, (mx.sym.Symbol, Graph)):
        raise OptionTypeError(f"sym must be an mxnet.symbol.Symbol, got {type(sym).__name__}")
    out, arg_params, aux_params = partition(Graph.of(sym), arg_params, aux_params, compute,
                                            rest_dtype)
    return out.symbol, arg_params, aux_params


def partition(graph, arg_params, aux_params, compute=None, rest_dtype="float32",
              data_means=None):
    """:func:`apply_backend` of a graph mxamp has read already.

    A caller that read its graph once (mxamp's quantization) reads neither its
    input nor its result again.

    Parameters
    ----------
    graph : mxamp.graph.Graph
        The model's graph.
    arg_params, aux_params, compute, rest_dtype : optional
        As for :func:`apply_backend`.
    data_means : dict, optional
        With ``compute="int8"``: ``{node name: channel means}`` from
        calibration, which correct the INT8 layers' biases.

    Returns
    -------
    tuple
        ``(graph, arg_params, aux_params)``, the graph partitioned (its JSON
        read only when asked for: what the pass made, it reports).
    """
    _check_partition_input(graph, arg_params, aux_params, compute, rest_dtype)
    compute = _resolve_compute(compute)
    params = {**arg_params, **aux_params}
    types = _input_entry_types(graph, params)
    options = {**_partitioner_options(graph, types, compute, rest_dtype),
               **_finish_options(graph, types, params, data_means)}
    args = _pass_params(params)
    final = _run_partitioner(graph, options, args)
    if compute == "bfloat16" and not cpu.features("onednn").bf16:
        log.warning("oneDNN 3 has no bfloat16 instructions on this CPU (%s; AVX512-BF16 or "
                    "AMX needed): with compute='bfloat16' the backend takes no node, all stay "
                    "on MXNet; compute='float32' runs them on the backend in float32",
                    cpu.describe())
    widened, arg_params, aux_params = _finish(final, graph, params, arg_params, aux_params, args)

    def widen(d):
        return {k: v.astype("float32") if k in widened else v for k, v in d.items()}
    log.info("oneDNN backend: %d regions holding %d nodes, each run on %s; %d bfloat16 "
             "parameters kept in float32 for the regions", *_region_counts(),
             _threads_text(), len(widened))
    arg_params, aux_params = widen(arg_params), widen(aux_params)
    _warn_float32_weights(graph)
    return Graph(final), arg_params, aux_params


def _check_partition_input(graph, arg_params, aux_params, compute, rest_dtype):
    """The options valid and the model one the partitioner takes (loading
    the backend's library)."""
    if compute is not None and compute not in COMPUTE_TYPES:
        raise OptionError(f"compute must be None or one of {', '.join(COMPUTE_TYPES)}, "
                          f"got {compute!r}")
    _check_rest_dtype(compute, rest_dtype)
    check_params(arg_params, "arg_params")
    check_params(aux_params, "aux_params")
    graph.check_extension("the oneDNN backend's partitioner")
    load()
    if any(n["op"] == REGION_OP for n in graph.nodes):
        raise OptionError("the symbol already has oneDNN backend regions; apply the backend "
                          "to the model without them")


def _input_entry_types(graph, params):
    """{(node, output): dtype code} of `graph` fed `params` and its other
    inputs in their declared dtypes (float32 by default); OptionError for a
    float16 model."""
    sym = graph.symbol
    known = {n: to_code(a.dtype) for n, a in params.items()}
    attrs = sym.attr_dict()
    known.update({n: int(attrs.get(n, {}).get("__dtype__", FLOAT32))
                  for n in sym.list_inputs() if n not in params})
    types = infer_entry_types(sym, known, graph.entries())
    if FLOAT16 in types.values():
        raise OptionError("the oneDNN backend runs bfloat16 models; this one holds float16 "
                          "(convert it with target_dtype='bfloat16')")
    return types


def _partitioner_options(graph, types, compute, rest_dtype):
    """The partitioner's options: what its regions compute in, and the nodes
    that run in bfloat16 and those reading or writing other types."""
    options = {"compute": compute}
    if compute == "int8":
        options["rest_dtype"] = rest_dtype
    if BFLOAT16 in types.values():
        options["bf16_nodes"] = _node_lines(graph.json, [
            nid for nid, n in enumerate(graph.nodes)
            if n["op"] != "null" and types.get((nid, 0)) == BFLOAT16])
    names = _output_name_lines(graph, types)
    if names:
        options["output_names"] = names
    other = _other_type_nodes(graph.json, types)
    if other:
        options["other_types"] = _node_lines(graph.json, other)
    return options


def _run_partitioner(graph, options, args):
    """The symbol of `graph` with its regions formed and made final by the
    library's pass (regions.h, finish.h: casts where a region edge was
    bfloat16, casts that copy their input skipped; with compute="int8", the
    INT8 regions' weights in s8, s8_weights.h; each region's float
    parameters packed, float_params.h), each node oneDNN refuses on
    this CPU named in a WARNING. The pass learns the entry types, data
    inputs and channel means of `graph` by node index; MXNet hands it the
    parameters `args` and adds those it allocates to the args dict passed
    (a copy)."""
    try:
        with _partitioning, memory_for("partitioning the model for the oneDNN backend"):
            final = graph.symbol.optimize_for(FINISH, args=args, aux=dict(args), ctx=mx.cpu(),
                                              skip_infer=True, **options)
    except mx.base.MXNetError as err:
        # the library's own message where selecting or reviewing failed
        message = _library(load()).mxamp_onednn_error().decode() or mxnet_message(err)
        raise BackendError(f"oneDNN backend: {message}") from None
    for name, op, reason in _fallbacks(graph.json):
        log.warning("oneDNN backend: %s (%s) stays on MXNet: %s", name, op, reason)
    return final


def _finish(final, graph, params, arg_params, aux_params, args):
    """The names of the bfloat16 parameters the pass stores in float32
    instead (it reports them by index in `graph`), and the parameter dicts
    of the result `final` (with those the pass allocated in `args`, which
    held `params`)."""
    lib = _library(load())
    widened = {graph.nodes[int(nid)]["name"] for nid in lib.mxamp_onednn_widened().split()}
    corrected = lib.mxamp_onednn_corrected()
    if corrected:
        log.info("INT8: %d layers' biases corrected for the mean shift of their weights' "
                 "rounding", corrected)
    new = {k: v for k, v in args.items() if k not in params}
    if new:  # the parameters the result reads, the new ones last
        used = set(final.list_arguments()) | set(final.list_auxiliary_states())
        arg_params = {**{k: v for k, v in arg_params.items() if k in used}, **new}
        aux_params = {k: v for k, v in aux_params.items() if k in used}
    return widened, arg_params, aux_params


def _finish_options(graph, types, params, data_means):
    """The finishing pass's options: `graph`'s entry types, its data inputs
    (the variables `params` lacks) and calibration's channel means."""
    data = [nid for nid, n in enumerate(graph.nodes) if n["op"] == "null"
            and n["name"] not in params]
    options = {"entry_types": _entry_type_lines(graph.json, types),
               "data_inputs": _node_lines(graph.json, data)}
    if data_means:
        options["data_means"] = _mean_lines(graph.json, data_means)
    return options


#: The dtypes MXNet 1.9.1's extension API hands a pass (its tensor refuses
#: others, bfloat16 among them).
_PASS_DTYPES = frozenset(map(np.dtype, ("float32", "float64", "float16", "uint8", "int32",
                                        "int8", "int64")))


def _pass_params(params):
    """A copy of `params` for the finishing pass: bfloat16 arrays as float32
    copies (exact), sparse or non-CPU ones as dense CPU copies (the
    extension API hands a pass an array's memory as if it were both),
    those of other types the extension API refuses left out. MXNet hands
    the pass each array's memory without waiting for writes to it, so all
    are waited for."""
    def readable(v):
        v = v if in_cpu_memory(v) else v.tostype("default").as_in_context(mx.cpu())
        return v.astype("float32") if is_bfloat16(v.dtype) else v
    out = {k: readable(v) for k, v in params.items()
           if is_bfloat16(v.dtype) or np.dtype(v.dtype) in _PASS_DTYPES}
    mx.nd.waitall()
    return out


def _warn_float32_weights(graph):
    """A WARNING per INT8 layer that the last finishing pass on this thread
    left reading float32 weights, with its reason (the layer named as in
    `graph`, the graph it partitioned)."""
    for line in _library(load()).mxamp_onednn_float32_weights().decode().splitlines():
        nid, why = line.split("\t", 1)
        log.warning("INT8: %r keeps float32 weights in the model: %s",
                    graph.nodes[int(nid)]["name"], why)


def _check_rest_dtype(compute, rest_dtype):
    """rest_dtype is one of REST_DTYPES, other than float32 only for INT8,
    and bfloat16 only where oneDNN has bfloat16 instructions (the partitioner
    would refuse it)."""
    if rest_dtype not in REST_DTYPES:
        raise OptionError(f"rest_dtype must be one of {', '.join(REST_DTYPES)}, "
                          f"got {rest_dtype!r}")
    if rest_dtype != "float32" and compute != "int8":
        raise OptionError(f"rest_dtype is what INT8 regions compute in where not INT8: it "
                          f"needs compute='int8', got compute={compute!r}")
    if rest_dtype == "bfloat16" and not cpu.features("onednn").bf16:
        raise OptionError(f"rest_dtype='bfloat16' needs bfloat16 instructions in oneDNN "
                          f"(AVX512-BF16 or AMX); this CPU offers {cpu.features('onednn')}")


def _node_lines(graph, nids):
    """Nodes as the partitioner's options name them: one "<index> <op>" line
    each, the index in the graph's JSON node list (the numbering MXNet hands
    the partitioner), the op for the library to check it against."""
    return "\n".join(f"{nid} {graph['nodes'][nid]['op']}" for nid in nids)


def _entry_type_lines(graph, types):
    """Every node's output types as the finishing pass reads them: one
    "<index> <op> <code>..." line a node, in the graph's JSON order."""
    codes = {}
    for (nid, _), code in sorted(types.items()):
        codes.setdefault(nid, []).append(str(code))
    return "\n".join(" ".join([str(nid), n["op"], *codes.get(nid, [])])
                     for nid, n in enumerate(graph["nodes"]))


def _output_name_lines(graph, types):
    """The names MXNet gives operators' outputs (the region inputs reading
    one are named after it) where they are not "output" (one output) or
    "output<k>": one "<index> <op> <name>..." line a node."""
    names = {}
    for (nid, _), name in zip(sorted(types), graph.symbol.get_internals().list_outputs()):
        names.setdefault(nid, []).append(name)
    lines = []
    for nid, got in names.items():
        node = graph.nodes[nid]
        prefix = f"{node['name']}_" if node["name"] else ""
        own = [n[len(prefix):] if n.startswith(prefix) else n for n in got]
        usual = ["output"] if len(got) == 1 else [f"output{k}" for k in range(len(got))]
        if node["op"] != "null" and own != usual:
            lines.append(" ".join([str(nid), node["op"], *own]))
    return "\n".join(lines)


def _mean_lines(graph, means):
    """Calibration's channel means as the finishing pass reads them: one
    "<index> <op> <mean>..." line a node of `graph` whose name `means`
    holds, each mean written so that it reads back exactly."""
    return "\n".join(
        " ".join([str(nid), n["op"], *map(repr, np.asarray(means[n["name"]], dtype=np.float64)
                                          .ravel().tolist())])
        for nid, n in enumerate(graph["nodes"]) if n["name"] in means)


def _other_type_nodes(graph, types):
    """The indices of operators reading or writing a type other than float32
    / bfloat16 (float64, integers): regions read and write float32 only, so
    these stay on MXNet."""
    other = {entry for entry, t in types.items() if t not in (-1, FLOAT32, BFLOAT16)}
    writers = {nid for nid, _ in other}
    return [nid for nid, n in enumerate(graph["nodes"]) if n["op"] != "null"
            and (nid in writers or any((e[0], e[1]) in other for e in n["inputs"]))]


def _region_counts():
    """The regions the last finishing pass on this thread made, and the
    operators they hold."""
    return map(int, _library(load()).mxamp_onednn_regions().split())


def regions(sym):
    """The operators each backend region of a symbol runs.

    Parameters
    ----------
    sym : mxnet.symbol.Symbol
        A model :func:`apply_backend` partitioned.

    Returns
    -------
    list of list of str
        Per region, the sorted operator names (casts included; not the
        nodes that cut and dequantize its packed parameters, which it reads
        as they lie).
    """
    table = operator_table()
    return [sorted(n["op"] for n in node["subgraphs"][0]["nodes"] if n["op"] in table)
            for node in graph_json(sym)["nodes"] if node["op"] == REGION_OP]
