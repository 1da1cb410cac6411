"""Asks the device whether it has a low-precision kernel for an operator.

The answer comes from running the operator once on small synthetic inputs, in
float32 and then in the target dtype, and is cached per (op, attributes,
input dtypes, context). Shapes are guessed: input 0 gets a small tensor of
rank 4, 2, 3 or 5, either (batch, channels, side, ...) or all sides equal
(for products such as dot and batch_dot); MXNet's shape inference fills in
the rest, and inputs it cannot infer get input 0's shape.
"""
import functools

import mxnet as mx
import numpy as np
from mxnet.base import MXNetError

from ..dtypes import DTYPE_CODES, to_numpy
from ..graph import single_op

_RANKS = (4, 2, 3, 5)
_SIDE = 24  # larger than common kernels, small enough to run in microseconds


def _runs(sym, shapes, dtypes, ctx):
    """True if `sym` executes with inputs of these shapes and dtype codes on
    `ctx` (False also for a context this machine does not have)."""
    names = sym.list_arguments() + sym.list_auxiliary_states()
    try:
        # Constant inputs: drawing random ones would move the user's random stream.
        arrays = {n: mx.nd.amp_cast(mx.nd.full(shapes[n], 0.75, ctx=ctx),
                                    dtype=to_numpy(dtypes[n])) for n in names}
        exe = sym.bind(ctx, {n: arrays[n] for n in sym.list_arguments()},
                       aux_states=[arrays[n] for n in sym.list_auxiliary_states()],
                       grad_req="null")
        exe.forward(is_train=False)[0].wait_to_read()
    except MXNetError:
        return False
    return True


@functools.lru_cache(maxsize=None)
def has_kernel(op, attrs, in_types, dtype, ctx):
    """True / False when `op` with these attributes does / does not run with the
    given input dtype codes (-1: the target `dtype`) on `ctx`; None when it
    does not run even in float32 (no synthetic input shape fits the op, or
    `ctx` is a device this machine lacks), so nothing can be said."""
    sym = single_op(op, attrs, len(in_types))
    channels = max(4, 2 * int(dict(attrs).get("num_group", 1)))
    names = sym.list_arguments() + sym.list_auxiliary_states()
    guesses = [(2, channels) + (_SIDE,) * (rank - 2) for rank in _RANKS] + \
        [(_SIDE,) * rank for rank in _RANKS]
    if "shape" in dict(attrs):
        # Reshape's shape inference accepts any input, and running it with the
        # wrong number of elements crashes MXNet: feed exactly as many.
        try:
            out = sym.infer_shape_partial(in0=guesses[0])[1][0]
        except MXNetError:
            return None
        guesses = [(int(np.prod(out)),)] if out and 0 not in out else []
    for in0 in guesses:
        known = {"in0": in0}
        try:
            args, _, aux = sym.infer_shape_partial(**known)
            if any(not s or 0 in s for s in args + aux):
                known.update((n, in0) for n, s in zip(names, args + aux) if not s or 0 in s)
                args, _, aux = sym.infer_shape_partial(**known)
        except MXNetError:
            continue
        if not args or any(not s or 0 in s for s in args + aux):
            continue
        shapes = dict(zip(names, args + aux))
        order = [int(n[2:]) for n in names]  # input index of each name
        fp32 = {n: 0 for n in names}
        if not _runs(sym, shapes, fp32, ctx):
            continue  # the guessed shapes do not fit this op
        target = DTYPE_CODES[dtype]
        low = {n: target if in_types[i] < 0 else in_types[i] for n, i in zip(names, order)}
        return _runs(sym, shapes, low, ctx)
    return None
