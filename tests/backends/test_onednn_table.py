"""The oneDNN backend's operator table (mxamp.backends.onednn.operator_table,
read from the library) against what the backend does: every row's operator
is offloaded in every data type the row names, its post-op operators fuse
into the primitive before them, and its parameter inputs are packed from the
region's inputs (what computes them stays on MXNet).

Outputs are compared with MXNet's float32 output by max error relative to
max |ref|: float32 1e-4 (summation order, BatchNorm folding), bfloat16 3e-2
(8 significant bits over two layers), int8 5e-2 (INT8 rounding of one or
two layers, calibrated on the case's own data).
"""
import json
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import mxamp.backends
import onednn_verbose as verbose
from isa import needs, require_onednn3
from test_onednn_backend import _params as _inputs, _run as _outputs
from test_onednn_int8 import _annotate, _ranges

require_onednn3()

ROOT = Path(__file__).resolve().parents[2]
TOL = {"float32": 1e-4, "bfloat16": 3e-2, "int8": 5e-2}
D, D2 = mx.sym.var("data"), mx.sym.var("data2")
IMAGE, TOKENS = {"data": (2, 4, 6, 6)}, {"data": (2, 3, 8)}


def _conv(x, name="c"):
    return mx.sym.Convolution(x, kernel=(3, 3), pad=(1, 1), num_filter=8, name=name)


def _fc(x, name="fc"):
    return mx.sym.FullyConnected(x, num_hidden=8, flatten=False, name=name)


# One case per table row: the row's operator, after an operator with
# weights where it needs one to compute (or to fuse into), and input shapes.
CASES = {
    "amp_cast": (mx.sym.relu(mx.sym.amp_cast(_fc(D), dtype="float32")), TOKENS),
    "amp_multicast": (mx.sym.elemwise_add(*mx.sym.amp_multicast(_fc(D), _fc(D, "fc2"),
                                                                num_outputs=2)), TOKENS),
    "Convolution": (_conv(D), IMAGE),
    "FullyConnected": (_fc(D), TOKENS),
    "BatchNorm": (mx.sym.BatchNorm(_conv(D), fix_gamma=False, name="bn"), IMAGE),
    "elemwise_add": (mx.sym.elemwise_add(_conv(D), _conv(D, "c2")), IMAGE),
    "Pooling": (mx.sym.Pooling(_conv(D), kernel=(2, 2), stride=(2, 2), pool_type="max"), IMAGE),
    "softmax": (mx.sym.softmax(_fc(D)), TOKENS),
    "LayerNorm": (mx.sym.LayerNorm(_fc(D), name="ln"), TOKENS),
    "batch_dot": (mx.sym.batch_dot(_fc(D), _fc(D2, "fc2"), transpose_b=True),
                  {"data": (2, 3, 8), "data2": (2, 5, 8)}),
    "Flatten": (_fc(mx.sym.Flatten(_conv(D))), IMAGE),
    "Reshape": (mx.sym.reshape(_fc(D), shape=(0, -1)), TOKENS),
    "transpose": (mx.sym.transpose(_fc(D), axes=(0, 2, 1)), TOKENS),
    "Activation": (mx.sym.Activation(_fc(D), act_type="tanh"), TOKENS),
    "relu": (mx.sym.relu(_fc(D)), TOKENS),
    "sigmoid": (mx.sym.sigmoid(_fc(D)), TOKENS),
    "tanh": (mx.sym.tanh(_fc(D)), TOKENS),
    "LeakyReLU": (mx.sym.LeakyReLU(_fc(D), act_type="leaky", slope=0.1), TOKENS),
    "_mul_scalar": (_fc(D) * 1.5, TOKENS),
    "_div_scalar": (_fc(D) / 2.0, TOKENS),
    "clip": (mx.sym.clip(_fc(D), -0.2, 0.3), TOKENS),
}


@pytest.fixture(scope="module")
def onednn():
    return mxamp.backends.get("onednn")


def _run(sym, args, aux, data):
    return _outputs(sym, args, aux, data)[0]


def test_rows_are_the_operators_the_backend_runs(onednn):
    table = onednn.operator_table()
    assert set(table) == set(CASES)
    assert onednn.operator_table() is table  # read once
    for op, row in table.items():
        assert row.op == op and row.dtypes and row.dtypes <= {"float32", "bfloat16", "int8"}
        assert row.int8 in ("quantizes", "quantized", "float", "narrowest", "none")
    assert sorted(op for op, row in table.items() if row.int8 == "quantizes") == [
        "Convolution", "FullyConnected", "batch_dot"]
    assert sorted(op for op, row in table.items() if row.int8 == "quantized") == [
        "Pooling", "elemwise_add"]
    assert sorted(op for op, row in table.items() if "int8" not in row.dtypes) == sorted(
        op for op, row in table.items() if row.int8 in ("float", "narrowest"))
    assert sorted(op for op, row in table.items() if row.int8 == "narrowest") == ["LayerNorm"]
    # What the region packs: weights and bias; BatchNorm's gamma, beta and
    # statistics; LayerNorm's gamma and beta.
    assert {op: row.params for op, row in table.items() if row.params} == {
        "Convolution": (1, 2), "FullyConnected": (1, 2), "BatchNorm": (1, 2, 3, 4),
        "LayerNorm": (1, 2)}
    # Regions of the others run a batch in chunks (test_onednn_chunks.py).
    assert sorted(op for op, row in table.items() if not row.apart) == ["Reshape", "transpose"]


def test_each_rows_auxiliary_states_are_mxnets(onednn):
    """The inputs a row holds as auxiliary states are the ones MXNet's own
    graph of its case lists as such (list_auxiliary_states)."""
    table = onednn.operator_table()
    found = {}
    for op, (sym, _) in CASES.items():
        nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
        aux = set(sym.list_auxiliary_states())
        for node in (n for n in nodes if n["op"] == op):
            found[op] = tuple(k for k, (i, _, _) in enumerate(node["inputs"])
                              if nodes[i]["name"] in aux)
    assert found == {op: row.aux for op, row in table.items()}
    assert found["BatchNorm"] == (3, 4)


def _row_dtypes():
    marks = {"float32": [pytest.mark.cpu], "bfloat16": needs("bf16"), "int8": needs("avx2")}
    return [pytest.param(op, dtype, marks=marks[dtype])
            for op in sorted(CASES) for dtype in ("float32", "bfloat16", "int8")]


@pytest.mark.parametrize("op, compute", _row_dtypes())
def test_each_row_runs_in_the_backend_in_each_compute_type(op, compute, onednn):
    """Every row's operator goes into one region in every compute type and
    agrees with MXNet; where the row names the compute type, the region
    computes the operator in it (int8: reads INT8 data, so it changes the
    output from the float32 region's)."""
    sym, shapes = CASES[op]
    args, aux, data = _inputs(sym, shapes)
    ref = _run(sym, args, aux, data)
    source = _annotate(sym, _ranges(sym, args, aux, data)) if compute == "int8" else sym
    out, out_args, out_aux = onednn.apply_backend(source, args, aux, compute=compute)
    nodes = json.loads(out.tojson())["nodes"]
    regions = [n for n in nodes if n["op"] == onednn.REGION_OP]
    assert [n["op"] for n in nodes if n["op"] not in ("null", onednn.REGION_OP)] == []
    assert len(regions) == 1 and regions[0]["attrs"]["compute"] == compute
    if (op, compute) == ("BatchNorm", "int8"):  # folded into the s8 weights and a new bias
        assert "BatchNorm" not in onednn.regions(out)[0]
        assert "_op0_bias_folded" in out_args and "c_bias" not in out_args
    else:
        assert op in onednn.regions(out)[0]
    got = _run(out, out_args, out_aux, data)
    scale = float(np.abs(ref).max())
    assert float(np.abs(got - ref).max()) <= TOL[compute] * scale


def test_post_op_rows_fuse_into_the_primitive_before_them(onednn):
    """ONEDNN_VERBOSE lists each primitive a region runs: after a
    FullyConnected (or a Convolution for BatchNorm), a post-op row's operator
    adds no primitive of its own."""
    post_ops = sorted(op for op, row in onednn.operator_table().items() if row.post_op)
    assert "clip" in post_ops and "BatchNorm" in post_ops
    script = f"""
import mxnet as mx, numpy as np, mxamp.backends, onednn_verbose
import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_onednn_table import CASES, _inputs, _run
onednn = mxamp.backends.get("onednn")
for op in {post_ops!r}:
    sym, shapes = CASES[op]
    args, aux, data = _inputs(sym, shapes)
    out = onednn.apply_backend(sym, args, aux, compute="float32")
    with onednn_verbose.marked(op):
        _run(*out, data)
"""
    kinds = {op: {verbose.kind(f) for f in lines}
             for op, lines in verbose.run(["-c", script], cwd=ROOT).items()}
    linear = {"inner_product", "convolution"}
    assert set(kinds) == set(post_ops)
    for op in post_ops:
        assert kinds[op] & linear and kinds[op] <= linear | {"reorder"}, (op, kinds[op])


def _computed(name):
    """Variable `name` passed through an operator (the parameter is computed)."""
    return mx.sym.var(name) * 1.0


# Each row with parameters, with every parameter computed (BatchNorm's
# statistics are auxiliary states, which MXNet keeps variables): the symbol
# and how many parameters are computed.
COMPUTED = {
    "Convolution": (mx.sym.Convolution(D, _computed("w"), _computed("b"), kernel=(3, 3),
                                       num_filter=8), 2),
    "FullyConnected": (mx.sym.FullyConnected(D, _computed("w"), _computed("b"), num_hidden=8),
                       2),
    "BatchNorm": (mx.sym.BatchNorm(_conv(D), _computed("g"), _computed("b"), fix_gamma=False),
                  2),
    "LayerNorm": (mx.sym.LayerNorm(_fc(D), _computed("g"), _computed("b")), 2),
}


def test_computed_parameters_stay_outside_the_region(onednn):
    """A row's parameter inputs are packed from region inputs: where an
    operator computes one, that operator stays on MXNet (and the row's
    operator still runs in a region)."""
    assert set(COMPUTED) == {op for op, row in onednn.operator_table().items() if row.params}
    for op, (sym, computed) in COMPUTED.items():
        out, _, _ = onednn.apply_backend(sym, {}, {}, compute="float32")
        outside = [n["op"] for n in json.loads(out.tojson())["nodes"]
                   if n["op"] not in ("null", onednn.REGION_OP)]
        assert outside == ["_mul_scalar"] * computed, op
        assert op in sum(onednn.regions(out), []), op


@pytest.mark.cpu
def test_int8_layers_answer_for_the_regions(onednn):
    """The INT8 layers' facts from the library: the BatchNorm a convolution
    folds (not where the convolution has another reader), the data read
    through casts, the
    channels' axis, whether a layer runs INT8 (calibrated, not kept float32)
    and its weights' levels: 127 with VNNI; without, 127 in steps of 2 for a
    convolution of signed data (oneDNN halves those weights itself), 64
    otherwise."""
    from mxamp import cpu
    data = mx.sym.var("data", attr={"__mxamp_amax__": "1.0", "__mxamp_min__": "-1.0"})
    conv = _conv(data)
    bn = mx.sym.BatchNorm(conv, fix_gamma=False, eps=0.25, name="bn")
    relu = mx.sym.relu(bn, name="relu", attr={"__mxamp_amax__": "2.0", "__mxamp_min__": "0"})
    fc = mx.sym.FullyConnected(mx.sym.amp_cast(relu, dtype="float32"), num_hidden=3,
                               name="fc", attr={"__mxamp_float__": "1",
                                                "__mxamp_float32_weights__": 'why "so"\\\n'})
    c2 = _conv(data, "c2")
    graph = json.loads(mx.sym.Group([fc, mx.sym.BatchNorm(c2, name="bn2"), c2]).tojson())
    names = [n["name"] for n in graph["nodes"]]
    layers = {names[layer["node"]]: layer for layer in onednn.int8_layers(graph)}
    vnni = cpu.features("onednn").vnni
    assert layers["c"] == {
        "node": names.index("c"), "params": [names.index("c_weight"), names.index("c_bias")],
        "data": [0, 0], "axis": 1, "groups": 1, "int8": True,
        "levels": 127, "step": 1 if vnni else 2, "s8_weights": False, "float32_weights": "",
        "batchnorm": {"node": names.index("bn"), "params": [names.index(f"bn_{p}") for p in (
            "gamma", "beta", "moving_mean", "moving_var")], "eps": 0.25, "fix_gamma": False}}
    assert layers["fc"]["data"] == [names.index("relu"), 0] and layers["fc"]["axis"] is None
    assert (layers["fc"]["int8"], layers["fc"]["levels"]) == (False, 127 if vnni else 64)
    assert layers["fc"]["float32_weights"] == 'why "so"\\\n'  # the pass's reason, as written
    assert "batchnorm" not in layers["c2"]  # c2 has another reader: it keeps its output


def test_int8_layers_give_a_folded_batchnorms_eps_as_it_is(onednn):
    """The eps the weights' writer folds with comes back as the double the
    model holds, one that needs 17 significant digits too."""
    eps = 0.1 + 0.2
    assert float(f"{eps:.16g}") != eps
    bn = mx.sym.BatchNorm(_conv(D), fix_gamma=False, eps=eps, name="bn")
    (layer,) = onednn.int8_layers(json.loads(bn.tojson()))
    assert layer["batchnorm"]["eps"] == eps
