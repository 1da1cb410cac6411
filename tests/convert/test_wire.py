"""The wire format to the C++ pass (mxamp/convert/wire.py): node names never
travel, so any name converts; malformed input fails the pass with an error
naming the problem instead of aborting the process."""
import json
from types import SimpleNamespace

import mxnet as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mxnet.base import MXNetError

import mxamp
from isa import needs
from mxamp import native
from mxamp.convert.wire import encode, run_pass
from mxamp.graph import _ENDS_IN_BACKSLASH
from mxamp.graph import graph_json
from mxamp.verify import run_emulated

# id: names of (data, FullyConnected, second input, elemwise_add)
NAMES = {
    "unicode": ("dätä", "全连接", "b☃", "ädd"),
    "spaces": (" data", "fc ", " b ", "a d d"),
    "newline": ("da\nta", "\nfc", "b\n", "ad\nd"),
    "empty": ("", "fc", "b", "add"),  # MXNet names an operator given "" itself
    "long": ("d" * 5000, "f" * 5000, "b" * 5000, "a" * 5000),
    "json-characters": ('"data"', "{fc}", "b\\b", "[add],:"),
    "tab-and-delete": ("da\tta", "fc\x7f", "b\tb", "add\x7f"),
}
NAME_CASES = [pytest.param(*names, id=key) for key, names in NAMES.items()]


def net(data, fc, b, add, out="out"):
    """FullyConnected (cast low) added to an input of unknown dtype (one
    amp_multicast), then relu, whose output is cast back to float32."""
    y = mx.sym.FullyConnected(mx.sym.var(data), num_hidden=3, name=fc)
    return mx.sym.relu(mx.sym.elemwise_add(y, mx.sym.var(b), name=add), name=out)


def casts(dtype):
    return {f"amp_cast:{dtype}": 3, "amp_cast:float32": 1, "amp_multicast": 1}


def names_of(sym):
    return [n["name"] for n in graph_json(sym)["nodes"]]


def model(sym, data):
    shapes, _, _ = sym.infer_shape(**{data: (2, 3)})
    rng = np.random.RandomState(0)
    args = {n: mx.nd.array(rng.uniform(-1, 1, s)) for n, s in zip(sym.list_arguments(), shapes)}
    return args, {data: args.pop(data)}


def run_float32(sym, args, feeds):
    exe = sym.bind(mx.cpu(), {**args, **feeds}, grad_req="null")
    return exe.forward(is_train=False)[0].asnumpy()


def check_converts(sym, data, dtype):
    """Converts `sym` both ways: exact casts, the original names kept, no two
    nodes of one name, and the model matches float32. Returns the names."""
    out = mxamp.convert_symbol(sym, target_dtype=dtype)
    assert mxamp.summarize(out) == casts(dtype)
    names = names_of(out)
    assert set(names_of(sym)) <= set(names)
    assert len(set(names)) == len(names)
    args, feeds = model(sym, data)
    converted, cargs, caux = mxamp.convert_model(sym, args, {}, target_dtype=dtype)
    assert mxamp.summarize(converted) == casts(dtype)
    got = run_emulated(converted, cargs, caux, feeds)[0].asnumpy()
    np.testing.assert_allclose(got, run_float32(sym, args, feeds), rtol=2e-2, atol=2e-2)
    return names


@pytest.mark.parametrize("data, fc, b, add", NAME_CASES)
def test_unusual_names_convert(data, fc, b, add, dtype):
    check_converts(net(data, fc, b, add), data, dtype)


def test_names_of_casts_taken_by_the_model_get_a_suffix(dtype):
    """A model whose nodes carry the names the pass would give its casts
    keeps them; the casts are named apart."""
    fc = f"data_amp_cast_{dtype}"  # the cast of data
    add = f"{fc}_weight_amp_cast_{dtype}"  # the cast of the FullyConnected weight
    names = check_converts(net("data", fc, "b", add, out=f"{add}_amp_multicast"), "data", dtype)
    assert {f"data_amp_cast_{dtype}_1", f"{add}_1", f"{add}_amp_multicast_1"} <= set(names)


def test_names_ending_in_a_backslash_are_refused_before_the_pass():
    """MXNet's lib_api.cc reads the graph's JSON taking such a backslash for an
    escape; mxamp refuses them with a clear error instead."""
    with pytest.raises(ValueError, match=r"ends in a backslash: \['fc\\\\'\]; rename"):
        mxamp.convert_symbol(net("data", "fc\\", "b", "add"))


def test_encode_sends_index_op_and_codes_of_nodes_with_a_cast():
    graph = graph_json(net("da\nta", "f c", "b", "add"))
    decisions = SimpleNamespace(nodes={3: "lll", 5: "mm", 6: "."}, outputs="f", body_outputs={})
    assert encode(graph, decisions) == "3 FullyConnected lll\n5 elemwise_add mm"


def test_graph_numbered_differently_is_caught():
    """Decisions whose node indices are one off from the graph the pass gets."""
    sym = net("data", "fc", "b", "add")
    shifted = graph_json(sym)
    shifted["nodes"].insert(0, {"op": "null", "name": "extra", "inputs": []})
    decisions = SimpleNamespace(nodes={4: "lll"}, outputs="f", body_outputs={})
    with pytest.raises(RuntimeError, match="line '4 FullyConnected lll' is for a FullyConnected, "
                       "but node 4 is the variable 'b': the nodes are numbered differently"):
        run_pass(sym, shifted, decisions, "float16")


def run_pass_directly(decisions, outputs="f"):
    """The pass on net(): data, fc_weight, fc_bias, fc (3), b, add (5), out."""
    native.load()
    return net("data", "fc", "b", "add").optimize_for(
        native.PASS_NAME, skip_infer=True, target_dtype="float16", decisions=decisions,
        outputs=outputs)


# Wrong code counts, unknown codes, a variable at the index, an index out of
# range: tests/convert/test_errors.py (run under the sanitizers).
@pytest.mark.parametrize("decisions, match", [
    ("3 FullyConnected lll\n3 FullyConnected fff", "node 3 has two decision lines"),
    ("5 FullyConnected lll", "is for a FullyConnected, but node 5 is a elemwise_add 'add'"),
    ("3 lll fc", "is for a lll, but node 3 is a FullyConnected 'fc'"),  # the old format
    ("3 FullyConnected", "malformed decision line '3 FullyConnected' "
     r"\(expected '<node index> <op> <codes>'\)"),
    ("3 FullyConnected lll fc", "malformed decision line '3 FullyConnected lll fc'"),
    ("-1 FullyConnected lll", "malformed decision line '-1 FullyConnected lll'"),
    ("99999999999999999999 FullyConnected lll", "malformed decision line '9+ FullyConnected"),
    ("3 FullyConnected lll\n\n5 elemwise_add mm", "malformed decision line ''"),
])
def test_malformed_decisions_raise_instead_of_aborting(decisions, match):
    with pytest.raises(MXNetError, match=match):
        run_pass_directly(decisions)


def test_multicast_is_no_output_code():
    with pytest.raises(MXNetError, match=r"unknown output cast code 'm' for output 0 "
                       r"\(allowed: \. l f\)"):
        run_pass_directly("", outputs="m")


def test_a_newline_ending_the_last_line_is_allowed():
    out = run_pass_directly("3 FullyConnected lll\n5 elemwise_add mm\n")
    assert mxamp.summarize(out) == casts("float16")


def test_name_with_a_control_character_is_refused_clearly():
    """JSON writes such characters as \\u escapes, which MXNet cannot read back."""
    with pytest.raises(ValueError, match=r"node name 'da\\x01ta' holds a control character"):
        mxamp.convert_symbol(net("da\x01ta", "fc", "b", "add"), target_dtype="float16")


def foreach_net():
    """A foreach whose body (subgraph 0 of node 3) is: x-0 (0), w (1),
    fc (2), s0-0 (3), add (4), a copy of it as the state (5)."""
    def step(data, states):
        fc = mx.sym.FullyConnected(data, mx.sym.var("w"), num_hidden=4, no_bias=True,
                                   flatten=False, name="fc")
        out = mx.sym.elemwise_add(fc, states[0], name="add")
        return out, [out]
    return mx.sym.contrib.foreach(step, mx.sym.var("x"), [mx.sym.var("s0")])[0]


def body_of(sym, nid=3, k=0):
    return graph_json(sym)["nodes"][nid]["subgraphs"][k]


def test_encode_sends_paths_of_nodes_inside_bodies():
    sym = foreach_net()
    decisions = SimpleNamespace(nodes={(3, 0, 4): "ff", (3, 0, 2): "ll", 3: "..."}, outputs=".",
                                body_outputs={(3, 0): ".f"})
    assert encode(graph_json(sym), decisions) == ("3/0 outputs .f\n"
                                                  "3/0/2 FullyConnected ll\n"
                                                  "3/0/4 elemwise_add ff")


BODY_DECISIONS = SimpleNamespace(nodes={(3, 0, 2): "ll", (3, 0, 4): "ff", (3, 0, 5): "f"},
                                 outputs=".", body_outputs={})


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_body_decisions_cast_inside_the_body(dtype):
    """The casts a body's lines ask for are made in that body, one per
    (entry, dtype) there, and the outer graph gets none."""
    sym = foreach_net()
    out = run_pass(sym, graph_json(sym), BODY_DECISIONS, dtype)
    casts_in_body = sorted((n["name"], n["attrs"]["dtype"]) for n in body_of(out)["nodes"]
                           if n["op"] == "amp_cast")
    # x-0 and w to dtype for fc; fc's output and s0-0 to float32 for the add;
    # the add's output to float32 for the copy.
    assert casts_in_body == sorted([("x-0_amp_cast_" + dtype, dtype), ("w_amp_cast_" + dtype, dtype),
                                    ("fc_amp_cast_float32", "float32"),
                                    ("s0-0_amp_cast_float32", "float32"),
                                    ("add_amp_cast_float32", "float32")])
    assert mxamp.summarize(out) == {}  # the outer graph has no cast


def test_a_body_outputs_line_casts_them_inside_the_body():
    """'<node>/<subgraph> outputs <codes>' casts the body's outputs there."""
    sym = foreach_net()
    decisions = SimpleNamespace(nodes={(3, 0, 2): "ll"}, outputs=".",
                                body_outputs={(3, 0): "ff"})
    old, new = body_of(sym), body_of(run_pass(sym, graph_json(sym), decisions, "bfloat16"))
    heads = [old["nodes"][h[0]] for h in old["heads"]]  # the add and its copy (the state)
    nodes = new["nodes"]
    new_heads = [nodes[h[0]] for h in new["heads"]]
    assert [(n["op"], n["attrs"]["dtype"], nodes[n["inputs"][0][0]]["name"]) for n in new_heads] \
        == [("amp_cast", "float32", h["name"]) for h in heads]


@needs("avx512", "mxnet")
def test_a_body_cast_by_the_pass_runs():
    """The rewritten body runs natively and matches float32 within bfloat16's rounding."""
    sym = foreach_net()
    out = run_pass(sym, graph_json(sym), BODY_DECISIONS, "bfloat16")
    rng = np.random.RandomState(0)
    args = {"x": mx.nd.array(rng.uniform(-1, 1, (3, 2, 4))),
            "w": mx.nd.array(rng.uniform(-1, 1, (4, 4))), "s0": mx.nd.zeros((2, 4))}
    expected = run_float32(sym, args, {})
    # 3 steps of a 4-term dot product on bfloat16 inputs (8 bits): < 1e-1.
    np.testing.assert_allclose(run_float32(out, args, {}), expected, rtol=0, atol=0.1)
    assert not np.array_equal(run_float32(out, args, {}), expected)  # it did run in bfloat16


@pytest.mark.parametrize("decisions, match", [
    ("3/0/9 FullyConnected ll", r"names node 9, but subgraph 0 of node '_foreach\d+' has 6 nodes"),
    ("3/1/2 FullyConnected ll", r"names subgraph 1 of node '_foreach\d+', which has 1 subgraphs"),
    ("2/0/2 FullyConnected ll", "names subgraph 0 of node 'w', which has 0 subgraphs"),
    ("3/0/4 FullyConnected ll", "is for a FullyConnected, but node 3/0/4 is a elemwise_add"),
    ("3/0/2 FullyConnected ll\n3/0/2 FullyConnected ff", "node 3/0/2 has two decision lines"),
    ("3/0 FullyConnected ll", "malformed decision line '3/0 FullyConnected ll'"),
    ("3/0/ FullyConnected ll", "malformed decision line '3/0/ FullyConnected ll'"),
    ("3//2 FullyConnected ll", "malformed decision line '3//2 FullyConnected ll'"),
    ("3/0 outputs f", r"subgraph 0 of node '_foreach\d+' has 2 outputs but the output "
     "decision 'f' has 1 entries"),
    ("3/0 outputs fm", "unknown output cast code 'm' for output 1"),
    ("3/0 outputs ff\n3/0 outputs ff", r"the outputs of subgraph 0 of node '_foreach\d+' have "
     "two decision lines"),
    ("3/2 outputs ff", r"names subgraph 2 of node '_foreach\d+', which has 1 subgraphs"),
    ("3/0/2 outputs ll", "is for a outputs, but node 3/0/2 is a FullyConnected"),
])
def test_malformed_body_paths_raise_instead_of_aborting(decisions, match):
    native.load()
    with pytest.raises(MXNetError, match=match):
        foreach_net().optimize_for(native.PASS_NAME, skip_infer=True, target_dtype="float16",
                                   decisions=decisions, outputs=".")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet='a\\"\n\t{}', max_size=6), min_size=1, max_size=6))
def test_the_backslash_scan_of_the_json_text_finds_exactly_the_strings_ending_in_one(names):
    """check_extension_json scans the graph's dumped JSON rather than every string: the
    same strings must be caught (names, attribute keys and values)."""
    graph = {"nodes": [{"op": "null", "name": n, "attrs": {n: n}, "inputs": []} for n in names]}
    found = bool(_ENDS_IN_BACKSLASH.search(json.dumps(graph, ensure_ascii=False)))
    assert found == any(n.endswith("\\") for n in names)
