"""Attention's head transposes inside oneDNN regions, in float32, bfloat16
and INT8: a transpose that only batch_dots read (through Reshapes that
regroup the batch axes) is a strided view the matmul reads where it lies,
and the transpose of a batch_dot's output is dense where the matmul wrote
it; a transpose any other operator reads is still copied dense.

Numerics against MXNet's float32, as the other oneDNN tests state them:
float32 and bfloat16 |got - ref| <= tol * max|ref| (1e-4: summation order
only; 3e-2: bfloat16's 8 significant bits), INT8 relative L2 error below
3e-2 (calibrated on the data itself, naive thresholds: INT8 rounding over a
few layers).

Run as a script (`python test_onednn_heads.py CASE COMPUTE`) it runs the
case's region twice and marks the second call in oneDNN's log, where the
verbose tests count its primitives; `permutations COMPUTE...` does so for
each case of the permutation tests.
"""
import functools
import itertools
import json
import sys

import numpy as np
import pytest

import mxnet as mx

import mxamp.backends
import onednn_verbose as verbose
from isa import needs, require_onednn3
from mxamp import cpu

require_onednn3()

pytestmark = pytest.mark.cpu  # which strided kernels oneDNN picks depends on the ISA

TOL = {"float32": 1e-4, "bfloat16": 3e-2}
INT8_RTOL = 3e-2
HEADS, SEQ, UNITS = 2, 8, 16
DEPTH = UNITS // HEADS
D = mx.sym.var("data")


def _fc(x, name, hidden=UNITS):
    return mx.sym.FullyConnected(x, num_hidden=hidden, flatten=False, name=name)


def _split(x, name, axes=(0, 2, 1, 3)):
    """(B, S, U) -> (B * heads, S, depth) as the bench's encoder splits
    heads: Reshape, transpose, Reshape. axes (0, 2, 3, 1) gives the keys
    already transposed, (B * heads, depth, S)."""
    heads = mx.sym.transpose(mx.sym.reshape(x, shape=(0, 0, HEADS, -1)), axes=axes,
                             name=name + "_t")
    rows = (-1, SEQ, DEPTH) if axes[2] == 1 else (-1, DEPTH, SEQ)
    return mx.sym.reshape(heads, shape=rows, name=name + "_heads")


def _merge(x):
    """(B * heads, S, depth) -> (B, S, U)."""
    x = mx.sym.transpose(mx.sym.reshape(x, shape=(-1, HEADS, SEQ, DEPTH)), axes=(0, 2, 1, 3),
                         name="ctx_t")
    return mx.sym.reshape(x, shape=(0, 0, -1), name="ctx_merged")


def _block(keys_transposed=False):
    """LayerNorm(x + proj(softmax(q k^T / sqrt(depth)) v)), the bench's
    attention block; `keys_transposed`: k^T by its transpose's axes instead
    of batch_dot's transpose_b."""
    q = _split(_fc(D, "q") * DEPTH ** -0.5, "q")
    if keys_transposed:
        scores = mx.sym.batch_dot(q, _split(_fc(D, "k"), "k", (0, 2, 3, 1)), name="scores")
    else:
        scores = mx.sym.batch_dot(q, _split(_fc(D, "k"), "k"), transpose_b=True, name="scores")
    att = mx.sym.softmax(scores, axis=-1, name="att")
    ctx = _merge(mx.sym.batch_dot(att, _split(_fc(D, "v"), "v"), name="ctx"))
    return mx.sym.LayerNorm(D + _fc(ctx, "proj"), name="norm")


def _shared(q, k):
    """(q k^T) (q + k): q and k read by batch_dots and by an add."""
    return mx.sym.batch_dot(mx.sym.batch_dot(q, k, transpose_b=True, name="scores"),
                            mx.sym.elemwise_add(q, k, name="sum"), name="out")


# name -> the symbol, on data of shape (2, SEQ, UNITS)
CASES = {
    "attention": _block(),
    "keys_transposed": _block(keys_transposed=True),
    # transposed heads read by an add and by a FullyConnected, not a batch_dot
    "heads_to_add": _fc(mx.sym.elemwise_add(_split(_fc(D, "q"), "q"), _split(_fc(D, "k"), "k")),
                        "out"),
    "heads_to_fc": _fc(mx.sym.transpose(mx.sym.reshape(_fc(D, "q"), shape=(0, 0, HEADS, -1)),
                                        axes=(0, 2, 1, 3), name="q_t"), "out"),
    # q's and k's transposes read by batch_dots and by an add
    "heads_shared": _shared(_split(_fc(D, "q"), "q"), _split(_fc(D, "k"), "k")),
}
# compute type -> what its kernels need of the CPU (a name in mxamp.cpu.FEATURES)
NEEDS = {"float32": None, "bfloat16": "bf16", "int8": "avx2"}
COMPUTES = [pytest.param(c, marks=needs(f)) if f else c for c, f in NEEDS.items()]


def _inputs(sym, seed=0, **shapes):
    """Random arguments (every input but the data; `shapes` names those
    inference needs) and data, uniform in [-0.5, 0.5) and [-1, 1)."""
    rs = np.random.RandomState(seed)
    shapes = {"data": (2, SEQ, UNITS), **shapes}
    arg_shapes, _, _ = sym.infer_shape(**shapes)
    args = {n: mx.nd.array(rs.uniform(-0.5, 0.5, s))
            for n, s in zip(sym.list_arguments(), arg_shapes) if n != "data"}
    return args, mx.nd.array(rs.uniform(-1, 1, shapes["data"]))


def _bind(sym, args, data):
    return sym.bind(mx.cpu(), {**args, "data": data}, grad_req="null")


def _applied(sym, args, data, compute):
    """sym's regions and their parameters: INT8 through mxamp's quantization,
    calibrated on the data."""
    if compute != "int8":
        return mxamp.backends.get("onednn").apply_backend(sym, args, {}, compute=compute)[:2]
    from mxamp import quantization
    return quantization.quantize_model(sym, args, {}, label_names=(), calib_mode="naive",
                                       calib_data=mx.io.NDArrayIter(data, batch_size=2))[:2]


def _on_backend(case, compute):
    """The case on the backend: (executor, MXNet's float32 output, the
    regions' operators)."""
    sym = CASES[case]
    args, data = _inputs(sym)
    ref = _bind(sym, args, data).forward(is_train=False)[0].asnumpy()
    out, out_args = _applied(sym, args, data, compute)
    return _bind(out, out_args, data), ref, mxamp.backends.get("onednn").regions(out)


def _check(got, ref, compute):
    assert got.dtype == np.float32 and got.shape == ref.shape
    if compute == "int8":
        error = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
        assert 1e-4 < error < INT8_RTOL, f"relative L2 error {error}"
    else:
        scale = float(np.abs(ref).max())
        err = float(np.abs(got - ref).max())
        assert err <= TOL[compute] * scale, f"max error {err} > {TOL[compute]} * {scale}"


@pytest.mark.parametrize("compute", COMPUTES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_heads_match_float32(case, compute):
    """Every case runs as one region, every operator in it, and matches
    MXNet's float32: twice, the second call on the plan of the first."""
    ex, ref, regions = _on_backend(case, compute)
    ops = sorted(n["op"] for n in json.loads(CASES[case].tojson())["nodes"] if n["op"] != "null")
    # besides casts and INT8 weights' dequantization (Cast, broadcast_mul, the
    # packed scales' _split_v2)
    added = ("amp_cast", "Cast", "broadcast_mul", "_split_v2")
    assert [[op for op in r if op not in added] for r in regions] == [ops]
    for _ in range(2):
        _check(ex.forward(is_train=False)[0].asnumpy(), ref, compute)


def _permuted(axes, side):
    """A transpose by `axes` of (2, 3, 4, 5) heads: "in", read by a batch_dot
    as its first operand (through a Reshape merging the batch axes); "out",
    of a batch_dot's output (through a Reshape splitting its batch axis).
    Both operands are layers' outputs of data of shape (2, 6), so that INT8
    calibrates them."""
    def layer(name, shape):  # data (2, 6) -> shape
        return mx.sym.reshape(mx.sym.FullyConnected(D, num_hidden=int(np.prod(shape)) // 2,
                                                    name=name), shape=shape)
    x = layer("fc", (2, 3, 4, 5))
    if side == "out":
        x = mx.sym.batch_dot(mx.sym.reshape(x, shape=(6, 4, 5)), layer("other", (6, 5, 5)))
        return mx.sym.transpose(mx.sym.reshape(x, shape=(2, 3, 4, 5)), axes=axes)
    rows, cols = ((2, 3, 4, 5)[a] for a in axes[2:])
    t = mx.sym.reshape(mx.sym.transpose(x, axes=axes), shape=(-1, rows, cols))
    return mx.sym.batch_dot(t, layer("other", (120 // (rows * cols), cols, 5)))


SIDES = ("in", "out")
PERMUTATIONS = list(itertools.permutations(range(4)))


def _permutation(axes, side):
    """_permuted's symbol, its arguments and data."""
    sym = _permuted(axes, side)
    return (sym, *_inputs(sym, data=(2, 6)))


@pytest.mark.parametrize("compute", COMPUTES)
@pytest.mark.parametrize("side", SIDES)
def test_every_permutation_of_heads_matches_float32(side, compute):
    """Every transpose of 4-d heads read by a batch_dot, or of a batch_dot's
    output, is read or written by the matmul with the strides it gives."""
    for axes in PERMUTATIONS:
        sym, args, data = _permutation(axes, side)
        ref = _bind(sym, args, data).forward(is_train=False)[0].asnumpy()
        ex = _bind(*_applied(sym, args, data, compute), data)
        _check(ex.forward(is_train=False)[0].asnumpy(), ref, compute)


@functools.lru_cache(maxsize=None)
def _permutation_calls():
    """oneDNN's exec lines of each permutation's second call, {"COMPUTE SIDE
    AXES": lines}, in every compute type this CPU runs: one child for all
    (a child costs seconds, the 144 calls little)."""
    have = cpu.features()
    computes = [c for c, f in NEEDS.items() if f is None or getattr(have, f)]
    return verbose.run([__file__, "permutations", *computes])


@pytest.mark.parametrize("compute", COMPUTES)
@pytest.mark.parametrize("side", SIDES)
def test_no_permutation_of_heads_is_copied(side, compute):
    """In each case of the test above the matmul reads ("in") or writes
    ("out") the transpose where it lies (its layout tag is the
    permutation), and the only reorders are any region's: the data
    converted for the two layers reading it (bfloat16, INT8), the output,
    and without VNNI the second operand requantized to the weights' levels.
    No case has to copy the transpose: only one that another operator
    reads is copied (test_transposes_other_operators_read_are_copied_dense)."""
    calls = _permutation_calls()
    for axes in PERMUTATIONS:
        lines = calls[f"{compute} {side} {axes}"]
        reorders, permuting = _reorders(lines)
        expected = _expected(compute, layers_reading_x=2, transposes=0, weights=1)
        assert permuting == [] and len(reorders) == expected, \
            (axes, [",".join(f[3:10]) for f in reorders])
        (matmul,) = [verbose.descs(f) for f in lines if verbose.kind(f) == "matmul"]
        assert [verbose.layout(d) for d in matmul] == _matmul_layouts(axes, side), axes


def _matmul_layouts(axes, side):
    """The matmul's (src, wei, dst) layout tags (dims in memory order, outer
    first) where it reads or writes the transpose by `axes` in place: "in",
    src with x's strides permuted (view axis i lies where x's axis axes[i]
    does); "out", dst with the strides that make the transpose's output
    dense (its axis axes[k] is the k-th outermost). 3-d where axes is the
    identity (no view, the Reshape's 3-d operands)."""
    letters = "abcd"
    if list(axes) == sorted(axes):
        return ["abc"] * 3
    if side == "in":
        return ["".join(letters[axes.index(k)] for k in range(4)), "abcd", "abcd"]
    return ["abcd", "abcd", "".join(letters[a] for a in axes)]


def _second_call(case, compute):
    """oneDNN's exec lines of the case's second call, split into fields."""
    return verbose.run([__file__, case, compute])["second call"]


def _reorders(lines):
    """The reorders among the lines, and those of them reading a permuted
    layout (a transpose's strides, oneDNN's tag out of order: acbd)."""
    reorders = [f for f in lines if verbose.kind(f) == "reorder"]
    tags = [verbose.layout(verbose.descs(f)[0]) for f in reorders]
    return reorders, [f for f, t in zip(reorders, tags) if t != "".join(sorted(t))]


def _requantized(compute, weights):
    """Without VNNI, INT8 matmuls' weights (`weights` of them) are
    requantized to the 64 levels they take there (batch_dot.cc,
    weight_levels): a reorder each."""
    return weights if compute == "int8" and not cpu.features().vnni else 0


def _expected(compute, layers_reading_x, transposes, weights):
    """The reorders of one call: the transposes copied dense; the data
    converted once for all the layers reading it (bfloat16 or s8: MXNet
    gives a region one input per edge, which it reads as one value); the
    output, written float32; the matmuls' weights requantized."""
    converted = 0 if compute == "float32" else min(layers_reading_x, 1)
    return transposes + converted + 1 + _requantized(compute, weights)


@pytest.mark.parametrize("compute", COMPUTES)
@pytest.mark.parametrize("case", ["attention", "keys_transposed"])
def test_head_transposes_run_no_reorder(case, compute):
    """The four head transposes (q, k, v split; the context merged) run no
    primitive of their own: the matmuls read q, k and v where their layers
    wrote them and write the context where the projection reads it. Before,
    each was a reorder. Besides the data's conversion (one for q, k and v)
    and the output, one reorder: the residual x, which the projection sums into, as
    a copy (the region's input is not written) in the type LayerNorm reads.
    Without VNNI the keys and values are requantized to 64 levels for the
    matmuls' weights (batch_dot.cc), reading the strided heads as they are:
    the only reorders that read them."""
    lines = _second_call(case, compute)
    kinds = [verbose.kind(f) for f in lines]
    assert kinds.count("matmul") == 2 and kinds.count("inner_product") == 4
    reorders, permuting = _reorders(lines)
    assert len(permuting) == _requantized(compute, 2)
    residual = 1
    assert len(reorders) == _expected(compute, 3, 0, 2) + residual, \
        [",".join(f[3:10]) for f in lines]


@pytest.mark.parametrize("compute", COMPUTES)
@pytest.mark.parametrize("case, layers, transposes, weights", [
    ("heads_to_add", 2, 2, 0), ("heads_to_fc", 1, 1, 0), ("heads_shared", 2, 2, 2)])
def test_transposes_other_operators_read_are_copied_dense(case, layers, transposes, weights,
                                                          compute):
    """A transpose an add or a FullyConnected reads is one reorder, as
    before; so is one read by an add and by a batch_dot (whose copy serves
    both)."""
    reorders, permuting = _reorders(_second_call(case, compute))
    assert len(permuting) == transposes
    assert len(reorders) == _expected(compute, layers, transposes, weights)


def _log_permutations(computes):
    """Runs each permutation's region twice, in each compute type, marking
    the second call "COMPUTE SIDE AXES"."""
    for compute in computes:
        for side in SIDES:
            for axes in PERMUTATIONS:
                sym, args, data = _permutation(axes, side)
                verbose.call(_bind(*_applied(sym, args, data, compute), data), 2,
                             f"{compute} {side} {axes}")


if __name__ == "__main__":
    if sys.argv[1] == "permutations":
        _log_permutations(sys.argv[2:])
    else:
        verbose.call(_on_backend(sys.argv[1], sys.argv[2])[0], 2, "second call")
