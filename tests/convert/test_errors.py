"""Bad input gets a clear exception naming the bad value and what is allowed,
and leaves the caller's symbol, parameters and block exactly as they were."""
import json
import logging
import os
import re
import subprocess
import sys

import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from mxnet.base import MXNetError
from mxnet.gluon import nn

import mxamp
from mxamp import native as _lib
from mxamp.convert import api
from mxamp.dtypes import to_ndarray
from mxamp.graph import load_symbol_json
from mxamp.verify import run_emulated


def small_net():
    x = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc")
    return mx.sym.softmax(x, name="sm")


def params_of(sym):
    shapes, _, _ = sym.infer_shape(data=(2, 3))
    return {n: mx.nd.ones(s) for n, s in zip(sym.list_arguments(), shapes) if n != "data"}


class Model:
    """What a caller hands to the API: a symbol with parameters and a block."""

    def __init__(self):
        self.sym = mx.sym.BatchNorm(small_net(), name="bn")
        shapes, _, aux_shapes = self.sym.infer_shape(data=(2, 3))
        self.args = {n: mx.nd.random.uniform(shape=s)
                     for n, s in zip(self.sym.list_arguments(), shapes) if n != "data"}
        self.aux = {n: mx.nd.random.uniform(shape=s)
                    for n, s in zip(self.sym.list_auxiliary_states(), aux_shapes)}
        self.block = nn.HybridSequential()
        self.block.add(nn.Dense(4), nn.BatchNorm())
        self.block.initialize()
        self.block.hybridize()
        self.block(mx.nd.ones((2, 3)))

    def snapshot(self):
        def arrays(params):
            return {k: (str(v.dtype), v.asnumpy().tobytes()) for k, v in params.items()}
        block_params = {p.name: p.data() for p in self.block.collect_params().values()}
        return (self.sym.tojson(remove_amp_cast=False), arrays(self.args), arrays(self.aux),
                self.block._cached_graph[1].tojson(), arrays(block_params))


def converted_model(m):
    sym, args, aux = mxamp.convert_model(m.sym, m.args, m.aux, target_dtype="bfloat16")
    return mxamp.convert_model(sym, args, aux, target_dtype="bfloat16")


def hybridized_never_run(m):
    net = nn.Dense(3)
    net.initialize()
    net.hybridize()
    return mxamp.convert_hybrid_block(net)


def uninitialized_block(m):
    data = mx.sym.var("data")
    return mxamp.convert_hybrid_block(mx.gluon.SymbolBlock(small_net(), [data]))


def cyclic_json(subgraph):
    """A float32 model's JSON where one node reads a later one: in the main
    graph, or inside a foreach body."""
    if subgraph:
        out, _ = mx.sym.contrib.foreach(lambda x, s: (mx.sym.relu(x + s[0]), [x]),
                                        mx.sym.var("data"), [mx.sym.var("s0")])
    else:
        out = mx.sym.relu(mx.sym.sigmoid(mx.sym.var("data"), name="a"), name="b")
    graph = json.loads(out.tojson())
    nodes = graph["nodes"][2]["subgraphs"][0]["nodes"] if subgraph else graph["nodes"]
    first, last = (next(i for i, n in enumerate(nodes) if n["op"] == op)
                   for op in ("elemwise_add" if subgraph else "sigmoid", "relu"))
    nodes[first]["inputs"][0] = [last, 0, 0]
    return json.dumps(graph)


def float64_block():
    net = nn.Dense(4)
    net.initialize()
    net.cast("float64")
    net.hybridize()
    net(mx.nd.ones((2, 3), dtype="float64"))
    return net


def sym_call(**kwargs):
    return lambda m: mxamp.convert_symbol(m.sym, **kwargs)


def model_call(**kwargs):
    return lambda m: mxamp.convert_model(m.sym, m.args, m.aux, **kwargs)


def mutated_json(change):
    """small_net's JSON (nodes data, fc_weight, fc_bias, fc, sm) after
    `change(graph)`."""
    graph = json.loads(small_net().tojson())
    change(graph)
    return json.dumps(graph)


def set_item(path, value):
    """A change that sets graph[path[0]][path[1]]... to `value`."""
    def change(graph):
        target = graph
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return change


# (id, change to small_net's JSON, message): each crashed MXNet or gave a
# traceback / an unclear error before the graph check caught it.
MALFORMED = [
    ("head-output-index", set_item(["heads"], [[3, 3, 0]]),
     r"graph output 0 reads output 3 of node 'fc' \(FullyConnected\), which has 1 output"),
    ("input-output-index", set_item(["nodes", 4, "inputs", 0], [3, 3, 0]),
     r"node 'sm' reads output 3 of node 'fc' \(FullyConnected\), which has 1 output"),
    ("input-node-index", set_item(["nodes", 4, "inputs", 0], [9, 0, 0]),
     r"node 'sm' reads node 9, which does not exist \(the graph has 5 nodes\)"),
    ("input-not-a-list", set_item(["nodes", 4, "inputs", 0], "fc"),
     r"node 'sm' reads 'fc', not \[node id, output index, version\]"),
    ("node-without-name", lambda g: g["nodes"][2].pop("name"), "node 2 has no 'name'"),
    ("node-without-op", lambda g: g["nodes"][3].pop("op"), "node 3 has no 'op'"),
    ("node-not-an-object", set_item(["nodes", 2], 7),
     "node 2 is 7, not an object with 'op', 'name' and 'inputs'"),
    ("name-not-a-string", set_item(["nodes", 3, "name"], 5), "node 3 has 'op' 'FullyConnected' "
     "and 'name' 5; both must be strings"),
    ("attrs-not-strings", set_item(["nodes", 3, "attrs"], {"num_hidden": 4}),
     r"node 3 \('fc'\) has 'attrs' \{'num_hidden': 4\}, not an object of strings"),
    ("huge-attribute-cut", set_item(["nodes", 3, "attrs"], {"num_hidden": ["x" * 10**6]}),
     r"node 3 \('fc'\) has 'attrs' \{'num_hidden': \['x{43}\.\.\., not an object of strings$"),
    ("huge-name-cut", lambda g: (set_item(["nodes", 3, "name"], "f" * 10**6)(g),
                                 set_item(["heads"], [[3, 1, 0]])(g)),
     r"graph output 0 reads output 1 of node 'f{59}\.\.\. \(FullyConnected\), which has 1 "
     r"output\(s\)$"),
    ("duplicate-input-names", set_item(["nodes", 2, "name"], "fc_weight"),
     "nodes 1 and 2 are both the input 'fc_weight'; MXNet cannot bind two inputs of one name"),
    ("no-heads", set_item(["heads"], []), r"'heads' is \[\], not a list of the graph's outputs"),
    ("arg-nodes-out-of-range", set_item(["arg_nodes"], [0, 1, 70]),
     r"'arg_nodes' is \[0, 1, 70\], not a list of node ids"),
]


@pytest.mark.parametrize("change, match", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_symbol_json(change, match):
    with pytest.raises(ValueError, match="the symbol JSON is not a valid MXNet graph: " + match):
        load_symbol_json(mutated_json(change))


@pytest.mark.parametrize("case", ["head-output-index", "input-output-index",
                                  "node-without-name", "node-not-an-object"])
def test_convert_command_refuses_malformed_symbol_files(case, tmp_path):
    """The way a user met them: ``mxamp convert`` died with a segmentation
    fault (exit 255) or a traceback."""
    change, match = {c[0]: c[1:] for c in MALFORMED}[case]
    prefix = tmp_path / "m"
    (tmp_path / "m-symbol.json").write_text(mutated_json(change))
    mx.nd.save(str(tmp_path / "m-0000.params"), {"arg:fc_weight": mx.nd.ones((4, 3)),
                                                  "arg:fc_bias": mx.nd.ones(4)})
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(mxamp.__file__))}
    done = subprocess.run([sys.executable, "-m", "mxamp", "convert", str(prefix), "--dtype",
                           "float16", "--shape", "data:2,3"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"Error: {prefix}-symbol.json is not a valid MXNet graph: ")
    assert re.search(match, lines[0]), lines[0]
    assert sorted(os.listdir(tmp_path)) == ["m-0000.params", "m-symbol.json"]


ALLOWED = r"not supported; allowed: float16, bfloat16"
# (id, call on a fresh Model, exception, message pattern)
CASES = [
    ("dtype-float64", sym_call(target_dtype="float64"), ValueError, "'float64' is " + ALLOWED),
    ("dtype-int8", model_call(target_dtype="int8"), ValueError, "'int8' is " + ALLOWED),
    ("dtype-fp16-string", sym_call(target_dtype="fp16"), ValueError, "'fp16' is " + ALLOWED),
    ("dtype-int", sym_call(target_dtype=3), ValueError, "3 is " + ALLOWED),
    ("dtype-none", sym_call(target_dtype=None), ValueError, "None is " + ALLOWED),
    ("lists-overlap", sym_call(target_dtype_ops=["FullyConnected"],
                               fp32_ops=["FullyConnected", "exp"]),
     ValueError, r"both target_dtype_ops and fp32_ops: \['FullyConnected'\]"),
    ("lists-overlap-alias", sym_call(target_dtype_ops=["FullyConnected"],
                                     fp32_ops=["_sparse_FullyConnected"]),
     ValueError, "FullyConnected"),
    ("lists-overlap-conditional",
     sym_call(fp32_ops=["Activation"], conditional_fp32_ops=[("Activation", "act_type", ["tanh"])]),
     ValueError, r"both fp32_ops and conditional_fp32_ops: \['Activation'\]"),
    ("unknown-ops", sym_call(fp32_ops=["Zzz", "exp", "NoSuchOp"]),
     ValueError, r"fp32_ops names operators MXNet does not know: 'NoSuchOp', 'Zzz'; see"),
    ("unknown-conditional-op", sym_call(conditional_fp32_ops=[("NoSuchOp", "a", ["b"])]),
     ValueError, "conditional_fp32_ops names operators MXNet does not know: 'NoSuchOp'"),
    ("excluded-str", sym_call(excluded_sym_names="fc"),
     TypeError, "excluded_sym_names must be a list of str"),
    ("excluded-int", model_call(excluded_sym_names=[1]),
     TypeError, "excluded_sym_names must be a list of str"),
    ("target-ops-str", sym_call(target_dtype_ops="Convolution"),
     TypeError, "target_dtype_ops must be a list of str"),
    ("widest-ops-str", sym_call(widest_dtype_ops="Concat"),
     TypeError, "widest_dtype_ops must be a list of str, got 'Concat'"),
    ("conditional-str", sym_call(conditional_fp32_ops="Activation"),
     TypeError, "conditional_fp32_ops must be a list"),
    ("conditional-values-str", sym_call(conditional_fp32_ops=[("Activation", "act_type", "tanh")]),
     TypeError, r"entries must be \(op: str, attribute: str, values: list of str\)"),
    ("data-names-str", sym_call(data_names="data"), TypeError, "data_names must be a list of str"),
    ("data-names-unknown", sym_call(data_names=["image"]),
     ValueError, r"data_names \['image'\] are not inputs"),
    ("keep-io-types-str", sym_call(keep_io_types="no"),
     TypeError, "keep_io_types must be True or False, got 'no'"),
    ("ctx-str", model_call(ctx="cpu"),
     TypeError, r"ctx must be an mxnet.Context \(e.g. mx.cpu\(\)\) or None, got 'cpu'"),
    ("cast-optional-str", model_call(cast_optional_params="yes"),
     TypeError, "cast_optional_params must be True or False, got 'yes'"),
    ("sym-str", lambda m: mxamp.convert_symbol("net-symbol.json"),
     TypeError, "sym must be an mxnet.symbol.Symbol, got str"),
    ("sym-already-converted",
     lambda m: mxamp.convert_symbol(mxamp.convert_symbol(m.sym, target_dtype="bfloat16")),
     ValueError, "already converted"),
    ("model-already-converted", converted_model, ValueError, "already converted"),
    ("arg-params-list", lambda m: mxamp.convert_model(m.sym, list(m.args.values()), m.aux),
     TypeError, "arg_params must be a dict of str to mxnet.nd.NDArray, got list"),
    ("arg-params-numpy",
     lambda m: mxamp.convert_model(m.sym, {k: v.asnumpy() for k, v in m.args.items()}, m.aux),
     TypeError, "arg_params must be a dict of str to mxnet.nd.NDArray"),
    ("aux-params-none", lambda m: mxamp.convert_model(m.sym, m.args, None),
     TypeError, "aux_params must be a dict of str to mxnet.nd.NDArray, got NoneType"),
    ("arg-params-missing",
     lambda m: mxamp.convert_model(m.sym, {k: v for k, v in m.args.items() if k != "fc_bias"},
                                   m.aux, data_names=["data"]),
     ValueError, r"no parameter given for the graph inputs \['fc_bias'\]"),
    ("aux-params-missing", lambda m: mxamp.convert_model(m.sym, m.args, {}),
     ValueError, r"no value for the auxiliary states \['bn_moving_mean', 'bn_moving_var'\]"),
    ("params-swapped", lambda m: mxamp.convert_model(
        m.sym, {**m.args, **m.aux}, {"fc_bias": m.args["fc_bias"]}),
     ValueError, r"arg_params holds the auxiliary states \['bn_moving_mean', 'bn_moving_var'\] "
     r"and aux_params holds the arguments \['fc_bias'\] of the symbol"),
    ("param-wrong-shape", lambda m: mxamp.convert_model(
        m.sym, {**m.args, "fc_weight": mx.nd.ones((5, 3))}, m.aux, input_shapes={"data": (2, 3)}),
     ValueError, r"parameter 'fc_weight' has shape \(5, 3\) in arg_params / aux_params, but the "
     r"graph needs \(4, 3\) for the data shapes of input_shapes"),
    ("params-float64", lambda m: mxamp.convert_model(
        m.sym, {k: v.astype("float64") for k, v in m.args.items()}, m.aux),
     TypeError, r"the parameters \[bn_beta, bn_gamma, fc_bias, fc_weight\] are float64; mxamp "
     r"converts float32 models \(float32 and integer parameters\): cast the model to float32"),
    ("block-float64", lambda m: mxamp.convert_hybrid_block(float64_block()),
     TypeError, r"are float64; .*\(Gluon: block.cast\('float32'\)\)"),
    ("block-not-hybrid", lambda m: mxamp.convert_hybrid_block(nn.Block()),
     TypeError, "block must be a gluon HybridBlock, got Block"),
    ("block-none", lambda m: mxamp.convert_hybrid_block(None),
     TypeError, "block must be a gluon HybridBlock, got NoneType"),
    ("block-not-hybridized", lambda m: mxamp.convert_hybrid_block(nn.Dense(3)),
     RuntimeError, r"call block.hybridize\(\) and run one forward pass"),
    ("block-never-run", hybridized_never_run,
     RuntimeError, r"call block.hybridize\(\) and run one forward pass"),
    ("block-uninitialized", uninitialized_block,
     RuntimeError, r"uninitialized parameters \['fc_bias', 'fc_weight'\]"),
    ("block-bad-dtype", lambda m: mxamp.convert_hybrid_block(m.block, target_dtype="float64"),
     ValueError, "'float64' is " + ALLOWED),
    ("block-bad-ctx", lambda m: mxamp.convert_hybrid_block(m.block, ctx="gpu"),
     TypeError, "ctx must be an mxnet.Context"),
    ("backend-unknown", model_call(backend="mkldnn"),
     ValueError, "backend must be None or 'onednn', got 'mkldnn'"),
    ("graph-empty", lambda m: mxamp.convert_symbol(mx.sym.var("data")),
     ValueError, r"no operators, only the inputs \['data'\]: there is nothing to convert"),
    ("graph-cyclic", lambda m: mxamp.convert_symbol(mx.sym.load_json(cyclic_json(False))),
     ValueError, "the symbol's graph cannot be read"),
    ("subgraph-cyclic", lambda m: mxamp.convert_symbol(mx.sym.load_json(cyclic_json(True))),
     ValueError, "the symbol's graph cannot be read"),
    ("json-cyclic", lambda m: load_symbol_json(cyclic_json(False)),
     ValueError, r"the nodes \['a', 'b'\] form a cycle"),
    ("json-subgraph-cyclic", lambda m: load_symbol_json(cyclic_json(True)),
     ValueError, "subgraph 0 of node '.*foreach.*' in the symbol JSON is not a valid MXNet graph: "
     r"the nodes \['.*', '.*'\] form a cycle"),
    ("json-malformed", lambda m: load_symbol_json('{"nodes": [}'),
     ValueError, "the symbol JSON is not an MXNet symbol: Expecting value"),
    ("json-unknown-op", lambda m: load_symbol_json(json.dumps(
        {"nodes": [{"op": "NoSuchOp", "name": "a", "inputs": []}], "arg_nodes": [],
         "heads": [[0, 0, 0]]})),
     ValueError, "Operator NoSuchOp is not registered"),
]


@pytest.mark.parametrize("call, error, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(call, error, match):
    model = Model()
    before = model.snapshot()
    with pytest.raises(error, match=match):
        call(model)
    assert model.snapshot() == before


def test_float32_models_with_their_own_multicast_are_not_taken_as_converted():
    """GluonCV's box decoders hold amp_multicast in the float32 model."""
    a, b = mx.sym.var("a"), mx.sym.var("data")
    both = mx.sym.amp_multicast(a, b, num_outputs=2, name="mc")
    sym = mx.sym.FullyConnected(mx.sym.elemwise_add(both[0], both[1]), num_hidden=2, name="fc")
    out = mxamp.convert_symbol(sym, target_dtype="bfloat16")
    # the model's own multicast of two float32 inputs gives float32, so
    # elemwise_add runs in float32 with no multicast of its own;
    # FullyConnected's three inputs and the output are cast
    assert mxamp.summarize(out) == {"amp_multicast": 1, "amp_cast:bfloat16": 3,
                                    "amp_cast:float32": 1}


def test_excluded_names_missing_from_graph_warn():
    with pytest.warns(UserWarning, match=r"not found in the graph: \['nope1', 'nope2'\]"):
        mxamp.convert_symbol(small_net(), excluded_sym_names=["fc", "nope2", "nope1"])


@pytest.mark.parametrize("decisions, match", [
    ("3 FullyConnected ll", "node 'fc' .* has 3 inputs but its cast decision 'll' has 2 entries"),
    ("3 FullyConnected lxl", "node 'fc' has unknown cast code 'x' for input 1"),
    ("3 FullyConnected mlm", "node 'fc' mixes multicast with other decisions"),
    ("2 FullyConnected lll", "line '2 FullyConnected lll' is for a FullyConnected, but node 2 is "
     "the variable 'fc_bias': the nodes are numbered differently"),
    ("99 FullyConnected lll", "names node 99, but the graph has 5 nodes"),
    ("fc FullyConnected lll", "malformed decision line 'fc FullyConnected lll'"),
])
def test_pass_errors_come_back_as_exceptions_with_the_node_name(decisions, match):
    """Bad decisions reaching the C++ pass raise in Python instead of aborting."""
    _lib.load()
    with pytest.raises(MXNetError, match=match):
        small_net().optimize_for(_lib.PASS_NAME, skip_infer=True, target_dtype="float16",
                                 decisions=decisions, outputs="f")


@pytest.mark.parametrize("options, match", [
    ({"target_dtype": "int8", "outputs": "f", "decisions": ""},
     "target_dtype must be 'float16' or 'bfloat16'"),
    ({"target_dtype": "float16", "decisions": ""}, "option 'outputs'"),
    ({"target_dtype": "float16", "outputs": "f"}, "option 'decisions'"),
    ({"target_dtype": "float16", "outputs": "ff", "decisions": ""},
     "graph has 1 outputs but the output decision 'ff' has 2 entries"),
])
def test_pass_option_errors(options, match):
    _lib.load()
    with pytest.raises(MXNetError, match=match):
        small_net().optimize_for(_lib.PASS_NAME, skip_infer=True, **options)


def test_parameters_float16_cannot_hold_stay_float32_with_a_warning(caplog):
    """A 1e6 weight is inf in float16 and a 1e-9 bias 0: stored so, the model
    gave inf where float32 gives a finite result, and nothing was logged."""
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3, name="fc")
    sym = mx.sym.FullyConnected(mx.sym.relu(fc, name="relu"), num_hidden=2, name="fc2")
    args = {"fc_weight": mx.nd.full((3, 4), 1e6), "fc_bias": mx.nd.full(3, 1e-9),
            "fc2_weight": mx.nd.full((2, 3), 0.5), "fc2_bias": mx.nd.full(2, 1e-9)}
    with caplog.at_level(logging.WARNING, logger="mxamp"):
        out, out_args, _ = mxamp.convert_model(sym, args, {}, target_dtype="float16",
                                               cast_optional_params=True)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "mxamp float16: the parameters [fc2_bias, fc_bias, fc_weight] do not fit float16 (a "
        "value out of its range, or mostly below its normal range): they and their readers "
        "[fc, fc2] stay float32"]
    assert {n: np.dtype(a.dtype).name for n, a in out_args.items()} == dict.fromkeys(args,
                                                                                     "float32")
    x = {"data": mx.nd.ones((1, 4))}
    got = run_emulated(out, out_args, {}, x)[0].asnumpy()
    np.testing.assert_allclose(got, run_emulated(sym, args, {}, x)[0].asnumpy(), rtol=1e-6)
    # parameters float16 holds are still stored in it
    fine = {**args, "fc_weight": mx.nd.full((3, 4), 0.25), "fc_bias": mx.nd.full(3, 0.5)}
    _, out_args, _ = mxamp.convert_model(sym, fine, {}, target_dtype="float16",
                                         cast_optional_params=True)
    assert np.dtype(out_args["fc_weight"].dtype).name == "float16"


def scaled_values():
    """float32 arrays of one magnitude (from float32's subnormals to its
    largest values), some with zeros, infinities or NaN."""
    special = st.sampled_from([float(np.float32(v)) for v in
                               (0.0, np.inf, np.nan, 2.0 ** -149, 65520.0, 3.4e38)])
    plain = st.floats(-1, 1, width=32)
    return st.builds(lambda v, e: (v * np.float32(2.0) ** e).astype(np.float32),
                     arrays(np.float32, st.integers(1, 40), elements=st.one_of(plain, special)),
                     st.integers(-150, 127))


@settings(max_examples=300, deadline=None)
@given(values=scaled_values(), dtype=st.sampled_from(["float16", "bfloat16"]))
def test_the_fit_bound_passes_no_parameter_that_the_cast_refuses(values, dtype):
    """The conversion skips casting a parameter whose fit the bound settles:
    the bound must never pass one that the cast itself fails."""
    with np.errstate(over="ignore", invalid="ignore"):
        if api._fits_surely(values, dtype):
            assert api._fits_when_cast(to_ndarray(values), values, dtype)


@settings(max_examples=300, deadline=None)
@given(values=scaled_values(), dtype=st.sampled_from(["float16", "bfloat16"]))
def test_the_sum_of_squares_bound_passes_no_parameter_that_the_cast_refuses(values, dtype):
    """The conversion reads no parameter whose fit MXNet's float32 sum of
    its squares settles: that bound must never pass one the cast fails."""
    [sum_sq] = api._sums_of_squares([to_ndarray(values)])
    with np.errstate(over="ignore", invalid="ignore"):
        if api._fits_by_sum_of_squares(sum_sq, values.size, dtype):
            assert api._fits_when_cast(to_ndarray(values), values, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_models_parameters_fit_without_being_cast(dtype, monkeypatch):
    """Weights of a usual scale and ones are settled by their sums of squares
    without being read, zeros by reading them, none by casting (reading and
    casting every parameter took most of a conversion's time)."""
    def cast(*_):
        raise AssertionError("a parameter was cast to test its fit")
    read = []
    monkeypatch.setattr(api, "_fits_when_cast", cast)
    monkeypatch.setattr(api, "as_numpy_all",
                        lambda arrays: [read.append(a.shape) or a.asnumpy() for a in arrays])
    rng = np.random.RandomState(0)
    params = {"conv_weight": rng.normal(0, 0.05, (64, 32, 3, 3)), "bn_beta": np.zeros(64),
              "bn_var": np.ones(64), "fc_weight": rng.uniform(-0.02, 0.02, (1000, 512))}
    assert api._unfit_params({n: to_ndarray(v, np.float32) for n, v in params.items()},
                             dtype) == []
    assert read == [(64,)]


def test_nested_block_outputs_keep_their_nesting():
    class Nested(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            with self.name_scope():
                self.a, self.b = nn.Dense(3), nn.Dense(2)

        def hybrid_forward(self, F, x):
            return self.a(x), (self.b(x), [x * 2])

    net = Nested()
    net.initialize()
    net.hybridize()
    x = mx.nd.ones((2, 3))
    want = net(x)
    got = mxamp.convert_hybrid_block(net, target_dtype="bfloat16")(x)
    assert isinstance(got, list) and len(got) == 2
    assert isinstance(got[1], list) and len(got[1]) == 2
    assert isinstance(got[1][1], list) and len(got[1][1]) == 1
    np.testing.assert_allclose(got[1][1][0].asnumpy(), want[1][1][0].asnumpy())
    np.testing.assert_allclose(got[0].asnumpy(), want[0].asnumpy(), rtol=3e-2, atol=3e-2)
