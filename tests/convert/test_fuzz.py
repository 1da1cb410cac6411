"""Property tests: random graphs convert, stay valid, run, and match float32.

Graphs are DAGs of 1-60 nodes over (2, 8) float tensors built from 49
shape-preserving ops of every list category (convolution, dense, batch norm
with auxiliary states, pooling, activations incl. conditional ones,
element-wise and broadcast arithmetic with fan-out, concat/split/slice,
reshape/transpose, reductions, softmax, embedding/take with integer indices)
and small control-flow nodes (a foreach RNN cell, a foreach inside a
foreach; their bodies convert too; while_loop and cond are left out: MXNet
infers no shape of their outputs, and its executor then fails with "Shape is
unknown" on some float32 graphs around them already; tests/convert/test_bodies.py
covers them),
with shared parameters, several outputs and random exclusions. Every graph is
converted to both target dtypes.

CI runs a fixed-seed profile of 200 graphs; the long profile is

    MXAMP_FUZZ_EXAMPLES=3000 python -m pytest -q tests/convert/test_fuzz.py
"""
import os

import mxnet as mx
import numpy as np
from hypothesis import HealthCheck, given, settings

import mxamp
from graphs import nodes_of, structure
from mxamp.graph import CAST_OPS, infer_entry_types
from mxamp.dtypes import DTYPE_CODES
from mxamp.verify import no_graph_fusion
from random_graphs import SHAPE, graphs

EXAMPLES = int(os.environ.get("MXAMP_FUZZ_EXAMPLES", "200"))
DATA = {"x0": SHAPE, "x1": SHAPE, "idx": (2,)}
FLOAT, INT32 = DTYPE_CODES["float32"], 4
FLOATS = {DTYPE_CODES[d] for d in ("float32", "float16", "bfloat16")}


def run(sym, args, aux, x):
    """Outputs of `sym` from a plain executor (see mxamp.verify.no_graph_fusion)."""
    with no_graph_fusion():
        exe = sym.bind(mx.cpu(), {**args, **x}, aux_states=aux, grad_req="null")
        return [o.astype("float32").asnumpy() for o in exe.forward(is_train=False)]


def check_types(converted):
    """Full type inference succeeds, and casts only ever read float entries
    (the integer indices and everything computed from them stay untouched)."""
    types = infer_entry_types(converted, {"x0": FLOAT, "x1": FLOAT, "idx": INT32})
    assert -1 not in types.values()
    for node in nodes_of(converted)["nodes"]:
        if node["op"] in CAST_OPS:
            assert all(types[tuple(e[:2])] in FLOATS for e in node["inputs"]), node["name"]


@settings(max_examples=EXAMPLES, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(graphs())
def test_random_graphs_convert_run_and_match_float32(graph):
    sym, excluded = graph
    data = {n: s for n, s in DATA.items() if n in sym.list_arguments()}
    # partial: MXNet infers no shapes inside some control-flow bodies
    arg_shapes, out_shapes, aux_shapes = sym.infer_shape_partial(**data)
    rng = np.random.RandomState(0)
    args = {n: mx.nd.array(rng.uniform(-1, 1, s))
            for n, s in zip(sym.list_arguments(), arg_shapes)}
    # moving variances must be positive
    aux = {n: mx.nd.array(rng.uniform(0.5, 1.5, s))
           for n, s in zip(sym.list_auxiliary_states(), aux_shapes)}
    x = {n: args.pop(n) for n in data}
    if "idx" in x:
        x["idx"] = mx.nd.array([1, 0], dtype="int32")
    before = sym.tojson()
    refs = run(sym, args, aux, x)
    for dtype in ("bfloat16", "float16"):
        converted, cargs, caux = mxamp.convert_model(sym, args, aux, target_dtype=dtype,
                                                     excluded_sym_names=excluded, ctx=mx.cpu())
        assert sym.tojson() == before
        casts, _, _ = structure(converted)
        # never two amp_casts of one entry to one dtype (each widest node has its own multicast)
        assert all(n == 1 for key, n in casts.items() if key[0] == "amp_cast")
        check_types(converted)
        assert converted.infer_shape_partial(**data)[1] == out_shapes
        for got, ref in zip(run(converted, cargs, caux, x), refs):
            assert got.shape == ref.shape and np.isfinite(got).all()
            # bfloat16 keeps 8 bits of mantissa; random graphs chain up to 60 ops
            tol = 0.1 if dtype == "bfloat16" else 1e-2
            assert np.linalg.norm(got - ref) <= tol * np.linalg.norm(ref) + 1e-3
