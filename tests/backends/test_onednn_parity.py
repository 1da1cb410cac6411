"""Parity sweep: every operator the oneDNN backend accepts, over its
attribute space, computes what MXNet computes.

For each operator a hypothesis strategy draws attributes (pooling type and
convention, kernel, stride, padding, count_include_pad, global pooling;
convolution stride, padding, dilation, groups, bias, chains of two; FullyConnected flatten
and rank; softmax and LayerNorm axes, eps, temperature; batch_dot transposes;
activation kinds and scalars; Reshape codes; transpose axes) and an input
shape. Configurations MXNet itself rejects are skipped. The rest go through
``apply_backend`` computing in float32, and in bfloat16 where oneDNN has the
kernels: applying and running must not fail, and the output must equal
MXNet's float32 output to |got - ref| <= tol * max(|ref|, 1), tol 1e-4 for
float32 (summation order and BatchNorm folding differ, nothing else) and
3e-2 for bfloat16 (8 significant bits).
Where the backend cannot match MXNet it must leave the operator outside the
region; the configurations known to be such are asserted to stay outside.

CI runs a fixed (derandomized) profile of EXAMPLES draws per operator; a
longer local run:

    MXAMP_FUZZ_EXAMPLES=500 python -m pytest -q tests/backends/test_onednn_parity.py
"""
import os

import mxnet as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import mxamp.backends
from isa import needs, require_onednn3

require_onednn3()

pytestmark = pytest.mark.cpu  # oneDNN's float32 kernels differ by ISA too

EXAMPLES = int(os.environ.get("MXAMP_FUZZ_EXAMPLES", "100"))
# |got - ref| <= TOL * max(|ref|, 1): float32 differs in summation order and
# BatchNorm folding only; bfloat16 keeps 8 significant bits.
TOL = {"float32": 1e-4, "bfloat16": 3e-2}
SWEEP = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                 suppress_health_check=list(HealthCheck))
D = mx.sym.var("data")


@pytest.fixture(params=["float32", pytest.param("bfloat16", marks=needs("bf16"))])
def compute(request):
    return request.param


def _check(sym, shape, compute, outside=False):
    """sym on random data of `shape` through the backend (float32) equals
    MXNet's own output; returns whether its operator went into a region.
    `outside`: the configuration must stay on MXNet."""
    onednn = mxamp.backends.get("onednn")
    rs = np.random.RandomState(0)
    try:
        arg_shapes, _, aux_shapes = sym.infer_shape(data=shape)
    except mx.base.MXNetError:
        assume(False)  # a configuration MXNet rejects
    args = {n: mx.nd.array(rs.uniform(-1, 1, s))
            for n, s in zip(sym.list_arguments(), arg_shapes) if n != "data"}
    aux = {n: mx.nd.array(rs.uniform(0.5, 1.5, s))
           for n, s in zip(sym.list_auxiliary_states(), aux_shapes)}
    data = mx.nd.array(rs.uniform(-1, 1, shape))

    def run(s, a):
        ex = s.bind(mx.cpu(), {**a, "data": data},
                    aux_states={k: v.copy() for k, v in aux.items()}, grad_req="null")
        return ex.forward(is_train=False)[0].asnumpy()

    try:
        ref = run(sym, args)
    except mx.base.MXNetError:
        assume(False)  # one MXNet's own kernels reject (max pooling with pad >= kernel)
    out, out_args, _ = onednn.apply_backend(sym, args, aux, compute=compute)
    got = run(out, out_args)
    offloaded = bool(onednn.regions(out))
    if outside:
        assert not offloaded, "a configuration the backend cannot match went into a region"
    assert got.shape == ref.shape
    scale = max(float(np.abs(ref).max()), 1.0)
    np.testing.assert_allclose(got, ref, rtol=0, atol=TOL[compute] * scale, equal_nan=True)
    return offloaded


PAIRS = st.tuples(st.integers(1, 4), st.integers(1, 4))


@SWEEP
@given(pool_type=st.sampled_from(["max", "avg", "sum", "lp"]),
       convention=st.sampled_from(["valid", "full", "same"]),
       kernel=PAIRS, stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       pad=st.tuples(st.integers(0, 2), st.integers(0, 2)), include_pad=st.booleans(),
       global_pool=st.booleans(), size=st.tuples(st.integers(1, 9), st.integers(1, 9)))
def test_pooling(compute, pool_type, convention, kernel, stride, pad, include_pad, global_pool,
                 size):
    sym = mx.sym.Pooling(D, kernel=kernel, stride=stride, pad=pad, pool_type=pool_type,
                         pooling_convention=convention, count_include_pad=include_pad,
                         global_pool=global_pool)
    # MXNet averages a "full" window running past the edge over its part
    # inside input + pad; oneDNN cannot. oneDNN needs every window to reach
    # into the input (pad < kernel; pad + stride <= kernel with "full").
    windows = (any(p >= k for p, k in zip(pad, kernel))
               or convention == "full" and any(p + s > k for p, s, k in zip(pad, stride, kernel))
               or pool_type == "avg" and convention == "full" and include_pad and any(pad))
    outside = pool_type in ("sum", "lp") or convention == "same" or windows and not global_pool
    assert _check(sym, (1, 3, *size), compute, outside=outside) == (not outside)


@SWEEP
@given(pool_type=st.sampled_from(["max", "avg"]), rank=st.sampled_from([3, 4, 5]),
       dims=st.lists(st.integers(1, 5), min_size=5, max_size=5), relu=st.booleans())
def test_global_pooling_of_any_rank(compute, pool_type, rank, dims, relu):
    """Global pooling of 1, 2 or 3 spatial axes (the kernel attribute, 2-d,
    does not say which), after a region operator or at the region's input."""
    x = mx.sym.relu(D) if relu else D
    sym = mx.sym.Pooling(x, kernel=(1, 1), global_pool=True, pool_type=pool_type)
    assert _check(sym, tuple(dims[:rank]), compute)


@SWEEP
@given(kernel=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       pad=st.tuples(st.integers(0, 2), st.integers(0, 2)),
       dilate=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       groups=st.sampled_from([1, 2, 4]), per_group=st.integers(1, 3),
       filters_per_group=st.integers(1, 3), no_bias=st.booleans(),
       size=st.tuples(st.integers(1, 10), st.integers(1, 10)), bn=st.booleans(),
       eps=st.sampled_from([1e-5, 1e-3, 0.1]), fix_gamma=st.booleans())
def test_convolution_and_batchnorm(compute, kernel, stride, pad, dilate, groups, per_group,
                                   filters_per_group, no_bias, size, bn, eps, fix_gamma):
    sym = mx.sym.Convolution(D, kernel=kernel, stride=stride, pad=pad, dilate=dilate,
                             num_group=groups, num_filter=groups * filters_per_group,
                             no_bias=no_bias, name="conv")
    if bn:
        sym = mx.sym.BatchNorm(sym, eps=eps, fix_gamma=fix_gamma, name="bn")
    assert _check(sym, (1, groups * per_group, *size), compute)


@SWEEP
@given(channels=st.integers(1, 4), stride=st.integers(1, 2), clip=st.booleans(),
       kernel=st.integers(1, 3), groups=st.sampled_from([1, 2, 16]),
       filters=st.sampled_from([16, 32]), size=st.integers(3, 12))
def test_convolution_chains(compute, channels, stride, clip, kernel, groups, filters, size):
    """A convolution read by another: the first writes the layout the second
    reads (a few input channels: oneDNN's kernel would prefer another)."""
    sym = mx.sym.Convolution(D, kernel=(3, 3), stride=(stride, stride), pad=(1, 1),
                             num_filter=16, name="first")
    if clip:
        sym = mx.sym.clip(sym, 0, 6)
    sym = mx.sym.Convolution(sym, kernel=(kernel, kernel), pad=(kernel // 2, kernel // 2),
                             num_group=groups, num_filter=filters, name="second")
    assert _check(sym, (2, channels, size, size), compute)


@SWEEP
@given(rank=st.integers(2, 4), flatten=st.booleans(), hidden=st.integers(1, 12),
       no_bias=st.booleans(), dims=st.lists(st.integers(1, 5), min_size=4, max_size=4))
def test_fully_connected(compute, rank, flatten, hidden, no_bias, dims):
    sym = mx.sym.FullyConnected(D, num_hidden=hidden, flatten=flatten, no_bias=no_bias)
    assert _check(sym, tuple(dims[:rank]), compute)


@SWEEP
@given(op=st.sampled_from(["softmax", "LayerNorm"]), rank=st.integers(1, 4),
       axis=st.integers(-4, 3), eps=st.sampled_from([1e-5, 1e-2, 0.5]),
       temperature=st.sampled_from([None, 1.0, 2.0]),
       dims=st.lists(st.integers(1, 6), min_size=4, max_size=4))
def test_softmax_and_layernorm(compute, op, rank, axis, eps, temperature, dims):
    assume(-rank <= axis < rank)
    if op == "softmax":
        sym = mx.sym.softmax(D, axis=axis, temperature=temperature)
    else:
        sym = mx.sym.LayerNorm(D, axis=axis, eps=eps)
    # The backend takes the last axis written as -1 (the default), softmax
    # without temperature.
    plain = axis == -1 and (op == "LayerNorm" or temperature in (None, 1.0))
    assert _check(sym, tuple(dims[:rank]), compute) == plain


ACTIVATIONS = {
    "relu": lambda x, v: mx.sym.Activation(x, act_type="relu"),
    "sigmoid": lambda x, v: mx.sym.Activation(x, act_type="sigmoid"),
    "tanh": lambda x, v: mx.sym.Activation(x, act_type="tanh"),
    "softrelu": lambda x, v: mx.sym.Activation(x, act_type="softrelu"),
    "softsign": lambda x, v: mx.sym.Activation(x, act_type="softsign"),
    "relu_op": lambda x, v: mx.sym.relu(x),
    "leaky": lambda x, v: mx.sym.LeakyReLU(x, act_type="leaky", slope=v),
    "gelu": lambda x, v: mx.sym.LeakyReLU(x, act_type="gelu"),
    "elu": lambda x, v: mx.sym.LeakyReLU(x, act_type="elu", slope=v),
    "mul_scalar": lambda x, v: x * v,
    "div_scalar": lambda x, v: x / v,
    "clip": lambda x, v: mx.sym.clip(x, -abs(v), v),
}


@SWEEP
@given(kind=st.sampled_from(sorted(ACTIVATIONS)),
       value=st.sampled_from([-2.0, -0.5, 0.0, 0.25, 1.0, 3.0]),
       dims=st.lists(st.integers(1, 6), min_size=1, max_size=4))
def test_elementwise(compute, kind, value, dims):
    _check(ACTIVATIONS[kind](D, value), tuple(dims), compute)


@SWEEP
@given(transpose_a=st.booleans(), transpose_b=st.booleans(), batch=st.integers(1, 3),
       m=st.integers(1, 6), k=st.integers(1, 6), n=st.integers(1, 6))
def test_batch_dot(compute, transpose_a, transpose_b, batch, m, k, n):
    # The second operand is computed from the data so both are region values.
    a_shape = (batch, k, m) if transpose_a else (batch, m, k)
    other = mx.sym.reshape(mx.sym.slice_axis(mx.sym.reshape(D * 0.5, (-1,)), axis=0, begin=0,
                                             end=batch * k * n),
                           (batch, n, k) if transpose_b else (batch, k, n))
    sym = mx.sym.batch_dot(D, other, transpose_a=transpose_a, transpose_b=transpose_b)
    assume(batch * m * k >= batch * k * n)
    assert _check(sym, a_shape, compute)


@SWEEP
@given(dims=st.lists(st.integers(1, 5), min_size=2, max_size=4), data=st.data())
def test_views_and_add(compute, dims, data):
    rank = len(dims)
    axes = tuple(data.draw(st.permutations(range(rank))))
    codes = data.draw(st.sampled_from(["flatten", "keep_first", "infer_last", "transpose"]))
    x = mx.sym.relu(D)
    view = {"flatten": lambda: mx.sym.Flatten(x),
            "keep_first": lambda: mx.sym.reshape(x, shape=(0, -1)),
            "infer_last": lambda: mx.sym.reshape(x, shape=(-1, dims[-1])),
            "transpose": lambda: mx.sym.transpose(x, axes=axes)}[codes]()
    assert _check(mx.sym.elemwise_add(view, view * 2.0), tuple(dims), compute)
