"""Asks the device whether it has a low-precision kernel for an operator.

The answer comes from running the operator once on small synthetic inputs, in
float32 and then in the target dtype, and is cached per (op, attributes,
input dtypes, context). Shapes are guessed: input 0 gets a small tensor of
rank 4, 2, 3 or 5, either (batch, channels, side, ...) or all sides equal
(for products such as dot and batch_dot); MXNet's shape inference fills in
the rest, and inputs it cannot infer get input 0's shape.

A kernel that exists may still be slow: :func:`slowdown` says how much
slower than float32 it is, so that a conversion for a device never makes a
model slower than float32 there (see :data:`SLOWER`). The answer comes from
``kernel_speed.json``, shipped with the package and written by
``bench/kernel_speed.py`` per CPU class, so that a conversion does not depend
on the machine's load; ``measure=True`` times the kernel here instead.
Whether a kernel exists is still found by running it (the same answer on
every run), except for the operators whose kernel corrupts memory
(:data:`CORRUPTING`): they have none.
"""
import functools
import json
import time
from pathlib import Path

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError

from .. import cpu
from ..dtypes import CASTABLE, DTYPE_CODES, to_numpy
from ..graph import FLOAT_OR_UNKNOWN, UNTYPABLE, single_op

_RANKS = (4, 2, 3, 5)
_SIDE = 24  # larger than common kernels, small enough to run in microseconds
_TIMED_BATCH = 64  # the batch of timed runs: enough work that the kernel, not the call, is timed
_TIMED_SECONDS = 2e-3  # the least time one timed measurement takes
# A low-precision kernel this many times slower than float32 is not used on
# the device: MXNet 1.9.1's CPU kernels outside oneDNN (clip, sigmoid,
# softmax, broadcast and scalar arithmetic...) convert bfloat16 element by
# element and measured 7-25x slower than float32 on AVX512-BF16 CPUs, while
# oneDNN's run bfloat16 at 0.3-1.0x float32's time.
SLOWER = 4.0
SPEEDS = Path(__file__).with_name("kernel_speed.json")
# Attributes that choose a different kernel of one operator: the speed data
# keeps one entry per value ("Activation(act_type=relu)").
KIND_ATTRS = ("act_type", "pool_type")
# Operators whose low-precision CPU kernel in MXNet 1.9.1 corrupts the heap.
# transpose in bfloat16: with glibc's heap checks on, the first call aborts
# ("free(): invalid pointer") for every shape tried, 1-D to 4-D; without
# them, most shapes abort ("double free or corruption") or segfault within
# ten calls. They are never run in that dtype, not even to probe them:
# conversion keeps them float32. Found by bench/bf16_crash_sweep.py;
# tests/convert/test_corrupting.py fails when one no longer crashes MXNet.
CORRUPTING = {
    "bfloat16": frozenset({"transpose"}),
}
# Operators MXNet 1.9.1 dies on when run alone as the probe runs them (its
# guessed shapes, constant inputs), in float32 or in its type inference:
# image decoders fed no image, a gradient and legacy setter operators, and
# the untypable ones. The probe cannot ask them anything and answers None
# for them. Found by bench/bf16_crash_sweep.py; tests/convert/test_corrupting.py
# fails when one no longer kills MXNet.
UNRUNNABLE = frozenset({"_NoGradient", "_cvimdecode", "_imdecode", "_npi_backward_polyval",
                        "_onehot_encode", "_set_value", "fill_element_0index"}) | UNTYPABLE


def _arrays(sym, shapes, dtypes, ctx):
    # Constant inputs: drawing random ones would move the user's random stream.
    return {n: _constant(shapes[n], dtypes[n], ctx)
            for n in sym.list_arguments() + sym.list_auxiliary_states()}


def _constant(shape, code, ctx):
    """An array of 0.75 cast to dtype `code`, made by one operator call
    where that dtype holds 0.75 exactly (the float ones)."""
    if code in CASTABLE:
        return mx.nd._internal._full(shape=shape, value=0.75, ctx=ctx, dtype=to_numpy(code))
    return mx.nd.amp_cast(mx.nd._internal._full(shape=shape, value=0.75, ctx=ctx),
                          dtype=to_numpy(code))


def _executor(sym, shapes, dtypes, ctx):
    """`sym` bound to inputs of these shapes and dtype codes on `ctx`, having
    run once; None when it does not run (also for a context this machine
    does not have)."""
    try:
        arrays = _arrays(sym, shapes, dtypes, ctx)
        exe = sym.bind(ctx, {n: arrays[n] for n in sym.list_arguments()},
                       aux_states=[arrays[n] for n in sym.list_auxiliary_states()],
                       grad_req="null")
        exe.forward(is_train=False)[0].wait_to_read()
    except MXNetError:
        return None
    return exe


def runs(sym, shapes, dtypes, ctx):
    """True if `sym` executes with inputs of these shapes and dtype codes on
    `ctx` (False also for a context this machine does not have)."""
    return _executor(sym, shapes, dtypes, ctx) is not None


def _guesses(sym, attrs, batch):
    """Input shapes to try for the single-op `sym`, most likely first."""
    groups = int(dict(attrs).get("num_group", 1))
    # A multiple of the groups: with 4 groups or more, one channel per group,
    # the depthwise convolution networks run; two per group take a generic
    # grouped kernel about 8x slower to probe (same answers on every grouped
    # convolution of the GluonCV zoo under AVX2, AVX-512 and AVX512-BF16).
    channels = groups if groups >= 4 else max(4, 2 * groups)
    guesses = [(batch, channels) + (_SIDE,) * (rank - 2) for rank in _RANKS] + \
        [(_SIDE,) * rank for rank in _RANKS]
    if "shape" in dict(attrs):
        # Reshape's shape inference accepts any input, and running it with the
        # wrong number of elements crashes MXNet: feed exactly as many.
        try:
            out = sym.infer_shape_partial(in0=guesses[0])[1][0]
        except MXNetError:
            return []
        guesses = [(int(np.prod(out)),)] if out and 0 not in out else []
    return guesses


def _inferred(sym, in0):
    """{input name: shape} from input 0's shape (inputs MXNet cannot infer
    get in0's shape too); None when MXNet's shape inference refuses."""
    names = sym.list_arguments() + sym.list_auxiliary_states()
    known = {"in0": in0}
    try:
        args, _, aux = sym.infer_shape_partial(**known)
        if any(not s or 0 in s for s in args + aux):
            known.update((n, in0) for n, s in zip(names, args + aux) if not s or 0 in s)
            args, _, aux = sym.infer_shape_partial(**known)
    except MXNetError:
        return None
    if not args or any(not s or 0 in s for s in args + aux):
        return None
    return dict(zip(names, args + aux))


@functools.lru_cache(maxsize=None)
def _fitting_shapes(op, attrs, num_inputs, ctx, batch):
    """The first guessed input shapes `op` runs with in float32 on `ctx`."""
    sym = single_op(op, attrs, num_inputs)
    for in0 in _guesses(sym, attrs, batch):
        shapes = _inferred(sym, in0)
        if shapes is not None and runs(sym, shapes, dict.fromkeys(shapes, 0), ctx):
            return shapes
    return None


def _low_types(sym, in_types, dtype):
    """{input name: dtype code}: -1 in `in_types` stands for `dtype`."""
    names = sym.list_arguments() + sym.list_auxiliary_states()
    order = [int(n[2:]) for n in names]  # input index of each name
    target = DTYPE_CODES[dtype]
    return {n: target if in_types[i] < 0 else in_types[i] for n, i in zip(names, order)}


@functools.lru_cache(maxsize=None)
def has_kernel(op, attrs, in_types, dtype, ctx):
    """True / False when `op` with these attributes does / does not run with the
    given input dtype codes (-1: the target `dtype`) on `ctx` with the first
    guessed input shapes it runs with in float32; None when it does not run
    even in float32 (no synthetic input shape fits the op, or `ctx` is a
    device this machine lacks), so nothing can be said. Without running it:
    False for an operator that corrupts memory in `dtype`
    (:data:`CORRUPTING`), None for one MXNet dies running alone
    (:data:`UNRUNNABLE`). Cached per process, keyed by all five arguments."""
    if corrupts(op, dtype):
        return False
    if op in UNRUNNABLE:
        return None
    return run_kernel(op, attrs, in_types, dtype, ctx)


def run_kernel(op, attrs, in_types, dtype, ctx):
    """:func:`has_kernel`'s answer found by running `op`, even one in
    :data:`CORRUPTING` (bench/bf16_crash_sweep.py runs those in a
    subprocess)."""
    if any(t not in FLOAT_OR_UNKNOWN for t in in_types):
        shapes = _fitting_shapes(op, attrs, len(in_types), ctx, 2)
        if shapes is None:
            return None
        sym = single_op(op, attrs, len(in_types))
        return runs(sym, shapes, _low_types(sym, in_types, dtype), ctx)
    # Float inputs only: what runs in low precision runs in float32 too, so a
    # guess is first run low, and in float32 only where that fails (half
    # the runs when the kernel exists: each costs milliseconds).
    sym = single_op(op, attrs, len(in_types))
    for in0 in _guesses(sym, attrs, 2):
        shapes = _inferred(sym, in0)
        if shapes is None:
            continue
        if runs(sym, shapes, _low_types(sym, in_types, dtype), ctx):
            return True
        if runs(sym, shapes, dict.fromkeys(shapes, 0), ctx):
            return False
    return None


def corrupts(op, dtype):
    """Whether MXNet's kernel of `op` corrupts memory in `dtype` (:data:`CORRUPTING`)."""
    return op in CORRUPTING.get(dtype, ())


def corruption_reason(dtype):
    """Why a node of :data:`CORRUPTING` is kept in float32, as reports say."""
    return f"MXNet 1.9.1's {dtype} kernel corrupts memory"


def cpu_class():
    """This CPU's class as MXNet's kernels see it (its ISA limit honoured):
    the key of the speed data."""
    mxnet = cpu.features("mxnet")
    if mxnet.amx:
        return "AVX512_CORE_AMX"
    if mxnet.bf16:
        return "AVX512_CORE_BF16"
    return "AVX512_CORE" if mxnet.avx512 else "AVX2"


@functools.lru_cache(maxsize=None)
def speed_data():
    """The shipped speed data (see ``kernel_speed.json``'s "about")."""
    return json.loads(SPEEDS.read_text())


def measured_class(name):
    """The class whose measurements stand for CPU class `name`: itself, or
    the nearest measured one the data names for it."""
    classes = speed_data()["classes"]
    entry = classes.get(name, {"same_as": speed_data()["default"]})
    return entry.get("same_as", name)


def kernel_key(op, attrs):
    """The speed data's name for `op` with the attributes `attrs` (pairs)."""
    kinds = [f"{k}={v}" for k, v in attrs if k in KIND_ATTRS]
    return f"{op}({','.join(kinds)})" if kinds else op


def speed_source(measure):
    """Where :func:`slowdown`'s answers come from, for messages."""
    if measure:
        return "timed on this machine"
    name = cpu_class()
    measured = measured_class(name)
    stand_in = "" if measured == name else f", standing in for {name}"
    return f"as measured on {measured} CPUs{stand_in} (mxamp/convert/{SPEEDS.name})"


def _seconds(exe):
    """The time of one forward of `exe`: the least over a few measurements."""
    started = time.perf_counter()
    exe.forward(is_train=False)[0].wait_to_read()
    runs = max(1, min(100, int(_TIMED_SECONDS / max(time.perf_counter() - started, 1e-9))))
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(runs):
            exe.forward(is_train=False)[0].wait_to_read()
        best = min(best, (time.perf_counter() - started) / runs)
    return best


@functools.lru_cache(maxsize=None)
def slowdown(op, attrs, in_types, dtype, ctx, measure=False):
    """How many times longer `op` takes with these input dtype codes (-1: the
    target `dtype`) than in float32 on `ctx`: from the shipped speed data of
    this CPU's class (None for an operator it does not hold, and for devices
    other than the CPU), or, with `measure`, timed here (:func:`timed`)."""
    if measure:
        return timed(op, attrs, in_types, dtype, ctx)
    if ctx.device_type != "cpu":
        return None
    speeds = speed_data()["classes"][measured_class(cpu_class())]["speeds"]
    return speeds.get(dtype, {}).get(kernel_key(op, attrs))


@functools.lru_cache(maxsize=None)
def timed(op, attrs, in_types, dtype, ctx):
    """:func:`slowdown` timed on synthetic inputs of batch 64, the float32
    and the low-precision kernel interleaved; None when it has no such
    kernel there or cannot be timed."""
    if not has_kernel(op, attrs, in_types, dtype, ctx):
        return None
    shapes = _fitting_shapes(op, attrs, len(in_types), ctx, _TIMED_BATCH)
    if shapes is None:
        return None
    sym = single_op(op, attrs, len(in_types))
    low = _executor(sym, shapes, _low_types(sym, in_types, dtype), ctx)
    full = _executor(sym, shapes, dict.fromkeys(shapes, 0), ctx)
    if low is None or full is None:
        return None
    times = [_seconds(exe) for exe in (full, low, full, low)]  # interleaved against drift
    return min(times[1::2]) / max(min(times[0::2]), 1e-9)
