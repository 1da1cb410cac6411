"""Control-flow bodies (_foreach, _while_loop, _cond) converted by the same
policy as the outer graph (mxamp/convert/decide.py, _Walker.control_flow):
casts counted per body, loop state float32 on both sides of the loop,
loop-invariant inputs cast once before it, numerics against float32
(natively where MXNet has bfloat16 kernels here, emulated elsewhere), the
policy's options inside bodies, and export / reload."""
import importlib.util
import json
import sys
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import mxamp
from isa import needs
from mxamp.graph import (CONTROL_FLOW_OPS, body_variables, carried_inputs, graph_json,
                         infer_entry_types)
from mxamp.dtypes import DTYPE_CODES, FLOAT32, to_code
from mxamp.policy import Rule
from mxamp.verify import run_emulated

S = mx.sym
H = 8
EXAMPLES = Path(__file__).resolve().parents[2] / "example"
TOL = {"bfloat16": 3e-2, "float16": 5e-3}  # relative L2 error against float32, as test_networks


def fc(x, name):
    return S.FullyConnected(x, S.var(name + "_weight"), S.var(name + "_bias"), num_hidden=H,
                            flatten=False, name=name)


def rnn_cell():
    """h = tanh(i2h(x) + h2h(h)) over the steps of x: the weights are
    closures of the body, h0 its state."""
    def step(data, states):
        h = S.tanh(S.elemwise_add(fc(data, "i2h"), fc(states[0], "h2h"), name="plus"), name="h")
        return h, [h]
    outs, states = S.contrib.foreach(step, S.var("x"), [S.var("h0")])
    return S.Group([outs, states[0]])


def while_early_exit():
    """Three iterations of at most five (the rest of the output is padding)."""
    def func(h, i):
        y = fc(h, "fc")
        return [y], [S.relu(y, name="relu"), i + 1]
    outs, (h, _) = S.contrib.while_loop(lambda h, i: i < 3, func, [S.var("h0"), S.var("i0")],
                                        max_iterations=5)
    return S.Group([outs[0], h])


def cond_differ():
    """A Dense in one branch, exp (float32 by the lists) in the other."""
    x = S.var("x")
    return S.contrib.cond(S.sum(x) > 0, lambda: fc(x, "then_fc"),
                          lambda: S.exp(x, name="else_exp") * 2)


def nested():
    """A foreach over the rows of x whose body runs a foreach over the row."""
    def outer(row, states):
        def inner(col, s):
            y = S.elemwise_add(fc(col, "inner_fc"), s[0], name="inner_add")
            return y, [y]
        ys, last = S.contrib.foreach(inner, row, [states[0]])
        return ys, [last[0]]
    outs, states = S.contrib.foreach(outer, S.var("x"), [S.var("h0")])
    return S.Group([outs, states[0]])


def gated():
    """fc then sigmoid (float32 in the bfloat16 lists) added to the state."""
    def step(data, states):
        out = S.elemwise_add(S.sigmoid(fc(data, "fc"), name="act"), states[0], name="add")
        return out, [out]
    outs, _ = S.contrib.foreach(step, S.var("x"), [S.var("h0")])
    return outs


def conv_scan():
    """A Convolution per step added to the state, and a batch_dot of its
    output with itself as the step's output."""
    def step(data, states):
        conv = S.Convolution(data, S.var("conv_weight"), S.var("conv_bias"), kernel=(3, 3),
                             pad=(1, 1), num_filter=3, name="conv")
        flat = S.reshape(conv, (2, 3, 16), name="flat")
        gram = S.batch_dot(flat, flat, transpose_b=True, name="gram")
        new = S.elemwise_add(conv, states[0], name="add")
        return gram, [new]
    outs, states = S.contrib.foreach(step, S.var("x"), [S.var("h0")])
    return S.Group([outs, states[0]])


MODELS = {  # builder, data shapes, parameter shapes MXNet cannot infer (in while_loop)
    "foreach_rnn_cell": (rnn_cell, {"x": (4, 2, 5), "h0": (2, H)}, {}),
    "while_early_exit": (while_early_exit, {"h0": (2, H), "i0": (1,)},
                         {"fc_weight": (H, H), "fc_bias": (H,)}),
    "cond_differ": (cond_differ, {"x": (2, H)}, {"then_fc_weight": (H, H), "then_fc_bias": (H,)}),
    "loop_in_loop": (nested, {"x": (3, 4, 2, 5), "h0": (2, H)}, {}),
    "gated": (gated, {"x": (4, 2, 5), "h0": (2, H)}, {}),
    "conv_scan": (conv_scan, {"x": (3, 2, 3, 4, 4), "h0": (2, 3, 4, 4)}, {}),
}


def model(name, seed=0):
    """(symbol, arg_params, feeds) of MODELS[name], random values in [-1, 1]."""
    build, shapes, hints = MODELS[name]
    sym = build()
    arg_shapes, _, _ = sym.infer_shape_partial(**shapes, **hints)
    rng = np.random.RandomState(seed)
    args = {n: mx.nd.array(rng.uniform(-1, 1, s)) for n, s in zip(sym.list_arguments(), arg_shapes)}
    if "i0" in args:
        args["i0"] = mx.nd.zeros((1,))
    return sym, {n: a for n, a in args.items() if n not in shapes}, \
        {n: a for n, a in args.items() if n in shapes}


def loop(graph):
    """The one control-flow node of `graph`."""
    found = [n for n in graph["nodes"] if n["op"] in CONTROL_FLOW_OPS]
    assert len(found) == 1, [n["op"] for n in graph["nodes"]]
    return found[0]


def casts(graph):
    """Sorted (name of what it reads, dtype) of the amp_cast nodes of `graph`
    itself (not of its bodies); "_copy" for a copy MXNet made of a state,
    whose name counts such copies process-wide."""
    nodes = graph["nodes"]

    def name(node):
        return "_copy" if node["op"] == "_copy" else node["name"]
    return sorted((name(nodes[n["inputs"][0][0]]), n["attrs"]["dtype"]) for n in nodes
                  if n["op"] == "amp_cast")


def all_casts(graph):
    """Every amp_cast and amp_multicast of `graph` and its bodies."""
    count = sum(n["op"] in ("amp_cast", "amp_multicast") for n in graph["nodes"])
    return count + sum(all_casts(b) for n in graph["nodes"] for b in n.get("subgraphs", []))


def convert(name, dtype, sym=None, **options):
    """The converted graph of MODELS[name] (or of `sym`, built from it)."""
    sym = MODELS[name][0]() if sym is None else sym
    feeds = MODELS[name][1]
    return graph_json(mxamp.convert_symbol(sym, target_dtype=dtype, data_names=list(feeds),
                                           **options))


def test_foreach_rnn_cell_casts(dtype):
    graph = convert("foreach_rnn_cell", dtype)
    assert casts(graph) == sorted(
        [("x", dtype)]  # +1: the sequence, cast once for every step (i2h reads it low)
        + [(f"{p}_{k}", dtype) for p in ("i2h", "h2h") for k in ("weight", "bias")])  # +4
    body = loop(graph)["subgraphs"][0]
    assert casts(body) == sorted(
        [("h0-0", dtype),  # +1: the state arrives float32; h2h reads it low
         ("h", "float32")]  # +1: the new state (and the step's output) leave float32
        # +1 in float16 only: _copy (the state's own output) is neutral there and
        # runs in float16 on h; in bfloat16 it is float32 and reads the cast above.
        + ([("_copy", "float32")] if dtype == "float16" else []))


def test_while_loop_casts(dtype):
    graph = convert("while_early_exit", dtype)
    node = loop(graph)
    assert casts(graph) == [("fc_bias", dtype), ("fc_weight", dtype)]  # +2: closures, once
    cond, func = node["subgraphs"]
    assert casts(cond) == []  # i < 3 is float32 throughout
    assert casts(func) == sorted([
        ("h0-0", dtype),  # +1: the loop variable arrives float32; fc reads it low
        ("fc", "float32"),  # +1: fc's output leaves the loop float32
        ("relu", "float32")])  # +1: relu runs low on fc; the new loop variable is float32


def test_cond_branches_convert_apart(dtype):
    graph = convert("cond_differ", dtype)
    cond, then, other = loop(graph)["subgraphs"]
    # +2: the then-branch's closures, cast once before the node; x is read in
    # float32 by the other branch, so it is not.
    assert casts(graph) == [("then_fc_bias", dtype), ("then_fc_weight", dtype)]
    assert casts(cond) == []
    assert casts(then) == [("then_fc", "float32"),  # +1: the branch's output leaves float32
                           ("x", dtype)]  # +1: x for then_fc
    assert casts(other) == []  # exp and its scaling run in float32: no cast


def test_loop_in_loop_casts_in_the_inner_body_only(dtype):
    graph = convert("loop_in_loop", dtype)
    # +3: x (sliced low by both loops) and the inner closures, cast once outside both
    assert casts(graph) == sorted([("x", dtype), ("inner_fc_bias", dtype),
                                   ("inner_fc_weight", dtype)])
    outer = loop(graph)["subgraphs"][0]
    assert casts(outer) == []  # it passes the closures on as they arrive
    inner = loop(outer)["subgraphs"][0]
    assert casts(inner) == [("inner_fc", "float32")]  # +1: inner_fc meets the float32 state


def test_convolution_and_batch_dot_in_a_body(dtype):
    graph = convert("conv_scan", dtype)
    # +3: the sequence and the convolution's weight and bias, once for every step
    assert casts(graph) == sorted([("x", dtype), ("conv_weight", dtype), ("conv_bias", dtype)])
    assert casts(loop(graph)["subgraphs"][0]) == sorted(
        [("conv", "float32")]  # +1: the convolution meets the float32 state at add (and,
        # in bfloat16, Reshape, float32 in the reference's lists)
        # +1 in float16: batch_dot (widest) runs low on the low reshape, and
        # leaves the loop float32; in bfloat16 it runs float32 after Reshape
        + ([("gram", "float32")] if dtype == "float16" else []))


def no_invariant_casts(graph):
    """Checks that no body casts a variable that reads a loop-invariant input
    of its node (those are cast once, before the node), at any depth."""
    for node in graph["nodes"]:
        for k, body in enumerate(node.get("subgraphs", [])):
            invariant = {body["nodes"][v]["name"] for v, j in body_variables(node, k).items()
                         if j not in carried_inputs(node)}
            if node["op"] == "_cond" and k > 0:  # x feeds both branches: read float32 by one
                invariant -= {"x"}
            assert not {name for name, _ in casts(body)} & invariant, (node["name"], k)
            no_invariant_casts(body)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_no_cast_of_loop_invariant_inputs_inside_a_loop(name, dtype):
    no_invariant_casts(convert(name, dtype))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_loop_state_and_outputs_stay_float32(name, dtype):
    """Type inference of the converted graph (MXNet's own, through the
    bodies): every output of a control-flow node and every state it carries
    is float32, so no state changes dtype from one iteration to the next."""
    sym, args, feeds = model(name)
    converted, cargs, _ = mxamp.convert_model(sym, args, {}, target_dtype=dtype)
    types = infer_entry_types(converted, {**{n: to_code(a.dtype) for n, a in cargs.items()},
                                          **dict.fromkeys(feeds, FLOAT32)})
    graph = graph_json(converted)
    for nid, node in enumerate(graph["nodes"]):
        if node["op"] in CONTROL_FLOW_OPS:
            outs = [t for (i, _), t in types.items() if i == nid]
            assert outs and set(outs) == {FLOAT32}
            assert {types[tuple(node["inputs"][j][:2])] for j in carried_inputs(node)} \
                <= {FLOAT32}


# Rows of output 0 that hold values: the while_loop's output is padded to
# max_iterations with whatever memory held (MXNet leaves it uninitialised).
VALID = {"while_early_exit": slice(0, 3)}


def run(sym, args, feeds, native):
    if native:
        exe = sym.bind(mx.cpu(), {**args, **feeds}, grad_req="null")
        return [o.asnumpy() for o in exe.forward(is_train=False)]
    return [mx.nd.amp_cast(o, dtype="float32").asnumpy()
            for o in run_emulated(sym, args, {}, feeds)]


ENGINES = [pytest.param("bfloat16", True, marks=needs("avx512", "mxnet"), id="bfloat16-native"),
           pytest.param("bfloat16", False, id="bfloat16-emulated"),
           pytest.param("float16", False, id="float16-emulated")]  # MXNet: no float16 on CPUs


@pytest.mark.parametrize("dtype, native", ENGINES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_numerics_match_float32(name, dtype, native):
    sym, args, feeds = model(name)
    converted, cargs, _ = mxamp.convert_model(sym, args, {}, target_dtype=dtype)
    assert all_casts(graph_json(converted)) > 0
    differ = []
    for sign in (1, -1):  # both branches of cond_differ
        signed = {n: a * sign if n == "x" else a for n, a in feeds.items()}
        expected = run(sym, args, signed, True)
        got = run(converted, cargs, signed, native)
        for k, (out, ref) in enumerate(zip(got, expected)):
            if k == 0:
                out, ref = out[VALID.get(name, slice(None))], ref[VALID.get(name, slice(None))]
            assert np.isfinite(out).all()
            assert np.linalg.norm(out - ref) <= TOL[dtype] * np.linalg.norm(ref)
            differ.append(not np.array_equal(out, ref))
    assert any(differ)  # it ran in low precision (cond_differ: in its then-branch)


def test_excluded_body_node_stays_float32(dtype):
    graph = convert("foreach_rnn_cell", dtype, excluded_sym_names=["h2h"])
    # +3: x and i2h's parameters, once; h2h's are read float32
    assert casts(graph) == sorted([("x", dtype), ("i2h_weight", dtype), ("i2h_bias", dtype)])
    body = loop(graph)["subgraphs"][0]
    # +1: i2h's output meets h2h's float32 one at plus, which then runs
    # float32, as do tanh and the state: nothing else is cast
    assert casts(body) == [("i2h", "float32")]


def test_excluded_loop_keeps_its_bodies_float32(dtype):
    sym = nested()
    graph = convert("loop_in_loop", dtype, sym, excluded_sym_names=[loop(graph_json(sym))["name"]])
    assert all_casts(graph) == 0


def test_rules_and_follow_reach_bodies():
    """A rule keeping a body's FullyConnected float32, and one making the
    bfloat16 float32 sigmoid FOLLOW (low, since fc's output arrives low)."""
    keep = Rule("FullyConnected", lambda info: "FP32" if info.name == "h2h" else None)
    graph = convert("foreach_rnn_cell", "bfloat16", rules=[keep])
    assert casts(loop(graph)["subgraphs"][0]) == [("i2h", "float32")]  # as by exclusion
    before = casts(loop(convert("gated", "bfloat16"))["subgraphs"][0])
    assert before == [("fc", "float32")]  # +1: sigmoid is float32
    follow = Rule("sigmoid", lambda info: "FOLLOW")
    after = casts(loop(convert("gated", "bfloat16", rules=[follow]))["subgraphs"][0])
    assert after == [("act", "float32")]  # +1: sigmoid runs low; its output meets the state


def test_rules_see_shapes_inside_bodies():
    """convert_model gives rules the parameters' shapes, and a body's
    variables get theirs (one step of the sequence for foreach's data)."""
    seen = {}

    def record(info):
        seen[info.name] = info.input_shapes
    sym, args, _ = model("foreach_rnn_cell")
    mxamp.convert_model(sym, args, {}, target_dtype="bfloat16",
                        rules=[Rule("FullyConnected", record)],
                        input_shapes={"x": (4, 2, 5), "h0": (2, H)})
    assert seen == {"i2h": ((2, 5), (H, 5), (H,)), "h2h": ((2, H), (H, H), (H,))}
    sym, args, _ = model("loop_in_loop")  # two slices deep
    mxamp.convert_model(sym, args, {}, target_dtype="bfloat16",
                        rules=[Rule("FullyConnected", record)],
                        input_shapes={"x": (3, 4, 2, 5), "h0": (2, H)})
    assert seen["inner_fc"] == ((2, 5), (H, 5), (H,))


def test_cast_optional_params_stores_closures_low(dtype):
    """Parameters that every body reads low are stored low: no cast of them
    anywhere."""
    sym, args, feeds = model("foreach_rnn_cell")
    converted, cargs, _ = mxamp.convert_model(sym, args, {}, target_dtype=dtype,
                                              cast_optional_params=True)
    assert {n: to_code(a.dtype) for n, a in cargs.items()} == dict.fromkeys(
        args, DTYPE_CODES[dtype])
    graph = graph_json(converted)
    assert casts(graph) == [("x", dtype)]  # +1: only the data remains to cast outside
    out = run(converted, cargs, feeds, False)
    ref = run(sym, args, feeds, True)
    assert np.linalg.norm(out[0] - ref[0]) <= TOL[dtype] * np.linalg.norm(ref[0])


def example(name):
    """An example script of example/ as a module (its folder on the path
    while it imports its helpers)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(EXAMPLES))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(EXAMPLES))
    return module


@needs("avx512", "mxnet")
def test_gluon_foreach_exports_and_reloads(tmp_path):
    """convert_hybrid_block's block runs its bfloat16 body natively; its
    export keeps the body's casts and reloads to the same outputs."""
    net = example("foreach_rnn").ForeachRNN(H)  # the example's model
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x, h0 = mx.nd.random.uniform(-1, 1, (4, 2, 5)), mx.nd.random.uniform(-1, 1, (2, H))
    ref = net(x, h0).asnumpy()
    converted = mxamp.convert_hybrid_block(net, target_dtype="bfloat16")
    expected = converted(x, h0).asnumpy()
    assert np.linalg.norm(expected - ref) <= TOL["bfloat16"] * np.linalg.norm(ref)
    converted.export(str(tmp_path / "rnn"))
    reloaded = mx.gluon.SymbolBlock.imports(str(tmp_path / "rnn-symbol.json"), ["data0", "data1"],
                                            str(tmp_path / "rnn-0000.params"))
    np.testing.assert_array_equal(reloaded(x, h0).asnumpy(), expected)
    sym, _, _ = mx.model.load_checkpoint(str(tmp_path / "rnn"), 0)
    assert len(casts(loop(graph_json(sym))["subgraphs"][0])) == 2  # the state, in and out


@pytest.mark.parametrize("name", sorted(MODELS))
def test_saved_and_loaded_model_keeps_its_body_casts(name, dtype, tmp_path):
    sym, args, feeds = model(name)
    converted, cargs, _ = mxamp.convert_model(sym, args, {}, target_dtype=dtype)
    converted.save(str(tmp_path / "m.json"), remove_amp_cast=False)
    mx.nd.save(str(tmp_path / "m.params"), cargs)
    loaded, largs = mx.sym.load(str(tmp_path / "m.json")), mx.nd.load(str(tmp_path / "m.params"))
    assert graph_json(loaded) == graph_json(converted)
    for got, expected in zip(run(loaded, largs, feeds, False), run(converted, cargs, feeds, False)):
        np.testing.assert_array_equal(got[VALID.get(name, slice(None))],
                                      expected[VALID.get(name, slice(None))])


@needs("avx512", "mxnet")
def test_mxnet_cannot_carry_bfloat16_foreach_state():
    """Why loop state stays float32: MXNet 1.9.1's foreach fails when its
    state is bfloat16 (a oneDNN array written through a view), even with
    every input and output of the body's operators bfloat16. If this test
    fails, MXNet runs such state: control_flow may then let states go low."""
    from mxamp.dtypes import to_numpy
    low = to_numpy(DTYPE_CODES["bfloat16"])

    def step(data, states):
        out = S.elemwise_add(S.FullyConnected(data, S.var("w"), num_hidden=4, no_bias=True,
                                              flatten=False), states[0])
        return out, [out]
    sym = S.contrib.foreach(step, S.var("x"), [S.var("s0")])[0]
    args = {"x": mx.nd.ones((3, 2, 4)), "w": mx.nd.ones((4, 4)), "s0": mx.nd.zeros((2, 4))}
    exe = sym.bind(mx.cpu(), {n: mx.nd.amp_cast(a, dtype=low) for n, a in args.items()},
                   grad_req="null")
    with pytest.raises(mx.base.MXNetError, match="IsView"):
        exe.forward()[0].wait_to_read()


def test_control_flow_node_whose_attributes_miss_a_variable_is_refused():
    graph = graph_json(rnn_cell())
    node = loop(graph)
    node["attrs"]["remain_locs"] = node["attrs"]["remain_locs"][:-4] + "]"  # drop one
    sym = mx.sym.load_json(json.dumps(graph))
    with pytest.raises(ValueError, match=r"control-flow node '_foreach\d+' \(_foreach\): its "
                       r"attributes map its 6 inputs to .*, which do not match the 6 variables "
                       "of its subgraph 0"):
        mxamp.convert_symbol(sym, target_dtype="bfloat16")
