"""mxamp.graph's one way to rewrite a graph: cast names (the C++ pass's
rule), the Inserter (order, renumbering, one cast per entry and dtype) and
the emulated graph verify builds with it; what a Graph learns from what it
has read (its internals' entries, the extension libraries' check)."""
import mxnet as mx
import pytest

import mxamp
from mxamp.dtypes import to_code
from mxamp.graph import Inserter, cast_name, graph_json, to_symbol
from mxamp.verify import emulated


def _chain():
    """data -> relu -> sin, in MXNet's JSON form: nodes 0, 1, 2."""
    return graph_json(mx.sym.sin(mx.sym.relu(mx.sym.var("data"), name="relu"), name="sin"))


def _nodes(graph):
    return [(n["op"], n["name"], n["inputs"]) for n in graph["nodes"]]


def test_cast_name_adds_the_output_index_past_the_first():
    assert cast_name("fc", 0, "float16") == "fc_amp_cast_float16"
    assert cast_name("split", 1, "bfloat16") == "split_1_amp_cast_bfloat16"


def test_the_cpp_pass_names_casts_by_the_same_rule(dtype):
    split = mx.sym.split(mx.sym.var("data"), num_outputs=2, axis=1, name="split")
    sym = mx.sym.FullyConnected(split[1], num_hidden=4, name="fc")
    params = {"fc_weight": mx.nd.ones((4, 3)), "fc_bias": mx.nd.ones((4,))}
    nodes = graph_json(mxamp.convert_model(sym, params, {}, target_dtype=dtype)[0])["nodes"]
    names = {n["name"]: cast_name(nodes[n["inputs"][0][0]]["name"], n["inputs"][0][1],
                                  n["attrs"]["dtype"])
             for n in nodes if n["op"] == "amp_cast"}
    assert f"split_1_amp_cast_{dtype}" in names
    assert all(name == rule for name, rule in names.items())


def test_inserter_puts_new_nodes_before_their_readers_and_renumbers():
    graph = _chain()
    edit = Inserter(graph)
    graph["nodes"][1]["inputs"] = [edit.cast([0, 0, 0], "float16")]
    graph["heads"] = [edit.cast(graph["heads"][0], "float32")]
    out = edit.apply()
    assert _nodes(out) == [
        ("null", "data", []), ("amp_cast", "data_amp_cast_float16", [[0, 0, 0]]),
        ("relu", "relu", [[1, 0, 0]]), ("sin", "sin", [[2, 0, 0]]),
        ("amp_cast", "sin_amp_cast_float32", [[3, 0, 0]])]
    assert out["heads"] == [[4, 0, 0]] and out["arg_nodes"] == [0]
    assert to_symbol(out).list_outputs() == ["sin_amp_cast_float32_output"]


def test_inserter_casts_an_entry_to_a_dtype_once():
    edit = Inserter(_chain())
    first = edit.cast([1, 0, 0], "float16")
    assert edit.cast([1, 0, 0], "float16") == first == [3, 0, 0]
    assert edit.cast([1, 0, 0], "bfloat16") == [4, 0, 0]
    assert [n["name"] for n in edit.apply()["nodes"] if n["op"] == "amp_cast"] == [
        "relu_amp_cast_float16", "relu_amp_cast_bfloat16"]


def test_inserter_reuses_a_cast_the_graph_has_and_moves_it_before_a_new_reader():
    relu = mx.sym.relu(mx.sym.var("data"), name="relu")
    graph = graph_json(mx.sym.Group([
        mx.sym.sin(relu, name="sin"),
        mx.sym.amp_cast(relu, dtype="float16", name="relu_amp_cast_float16")]))
    assert [n["name"] for n in graph["nodes"]] == ["data", "relu", "sin", "relu_amp_cast_float16"]
    edit = Inserter(graph)
    graph["nodes"][2]["inputs"] = [edit.cast([1, 0, 0], "float16")]
    out = edit.apply()
    assert _nodes(out) == [
        ("null", "data", []), ("relu", "relu", [[0, 0, 0]]),
        ("amp_cast", "relu_amp_cast_float16", [[1, 0, 0]]), ("sin", "sin", [[2, 0, 0]])]
    assert out["heads"] == [[3, 0, 0], [2, 0, 0]]


def test_inserter_adds_a_keyed_node_once():
    edit = Inserter(_chain())
    node = {"op": "_plus_scalar", "name": "relu_plain", "attrs": {"scalar": "0"},
            "inputs": [[1, 0, 0]]}
    assert edit.add(node, ("plain", 1, 0)) == edit.add(dict(node), ("plain", 1, 0)) == 3
    assert edit.add(dict(node)) == 4  # without a key every call adds one
    assert [edit.nodes[i]["name"] for i in (3, 4)] == ["relu_plain", "relu_plain_1"]


def test_inserter_names_a_cast_apart_from_a_node_the_model_named_like_it():
    """As the C++ pass does: the model's node keeps its name."""
    graph = graph_json(mx.sym.relu(mx.sym.var("data"), name="data_amp_cast_float16"))
    edit = Inserter(graph)
    graph["nodes"][1]["inputs"] = [edit.cast([0, 0, 0], "float16")]
    assert [n["name"] for n in edit.apply()["nodes"]] == [
        "data", "data_amp_cast_float16_1", "data_amp_cast_float16"]


def test_inserter_rejects_a_cycle():
    graph = _chain()
    edit = Inserter(graph)
    graph["nodes"][1]["inputs"] = [edit.cast([2, 0, 0], "float16")]
    with pytest.raises(ValueError, match="depends on its own output"):
        edit.apply()


def _emulated(sym, dtype):
    """The emulated graph of `sym` converted to `dtype`, its weights ones."""
    shapes = dict(zip(sym.list_arguments(), sym.infer_shape(data=(2, 3))[0]))
    params = {n: mx.nd.ones(s) for n, s in shapes.items() if n != "data"}
    sym, args, _ = mxamp.convert_model(sym, params, {}, target_dtype=dtype)
    codes = {n: to_code(a.dtype) for n, a in {"data": mx.nd.ones(1), **args}.items()}
    return graph_json(emulated(sym, codes))


def test_emulated_graph_computes_in_float32_between_plain_casts(dtype):
    """Each cast to low precision reads a plain copy (_plus_scalar 0); the
    low-precision FullyConnected reads float32 casts of its inputs and its
    output is cast back to low precision through a plain copy."""
    out = _emulated(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc"), dtype)
    low = f"amp_cast_{dtype}"
    expected = []
    for var in ("data", "fc_weight", "fc_bias"):
        expected += [("null", var), ("_plus_scalar", f"{var}_plain"),
                     ("amp_cast", f"{var}_{low}"), ("amp_cast", f"{var}_{low}_amp_cast_float32")]
    expected += [("FullyConnected", "fc"), ("_plus_scalar", "fc_plain"),
                 ("amp_cast", f"fc_plain_{low}"), ("amp_cast", "fc_amp_cast_float32")]
    assert [(op, name) for op, name, _ in _nodes(out)] == expected
    assert [e[0] for e in out["nodes"][12]["inputs"]] == [3, 7, 11]
    assert out["heads"] == [[15, 0, 0]]


def test_emulated_graph_casts_an_entry_read_by_two_operators_once(dtype):
    data = mx.sym.var("data")
    fc0, fc1 = (mx.sym.FullyConnected(data, num_hidden=4, name=f"fc{i}") for i in range(2))
    nodes = _emulated(fc0 + fc1, dtype)["nodes"]
    (cast,) = [i for i, n in enumerate(nodes)
               if n["name"] == f"data_amp_cast_{dtype}_amp_cast_float32"]
    assert [n["inputs"][0][0] for n in nodes if n["op"] == "FullyConnected"] == [cast, cast]


def test_internal_outputs_are_found_by_name_in_order():
    sym = to_symbol(_chain())
    names = sym.get_internals().list_outputs()
    found = mxamp.graph.internal_outputs(sym, [names[-1], names[1]])
    assert [s.list_outputs()[0] for s in found] == [names[-1], names[1]]
    with pytest.raises(ValueError, match="no single internal output named 'nothing'"):
        mxamp.graph.internal_outputs(sym, ["nothing"])


def _named_alike():
    """A split of three outputs and a BatchNorm of three, nodes named like
    others: an operator "x" after the variable "x", "a" and "a_b"."""
    x = mx.sym.var("x")
    parts = mx.sym.split(mx.sym.relu(x, name="x"), num_outputs=3, axis=1, name="a")
    bn = mx.sym.BatchNorm(parts[1], output_mean_var=True, name="a_b")
    return mx.sym.Group([parts[0], bn[0], bn[2], mx.sym.relu(parts[2], name="r")])


def _neighbours():
    """Two neighbouring operators "r" of one name."""
    return mx.sym.relu(mx.sym.relu(mx.sym.var("x"), name="r"), name="r")


@pytest.mark.parametrize("build, writes", [(lambda: to_symbol(_chain()), 0), (_named_alike, 0),
                                           (_neighbours, 1)])
def test_entries_are_the_internals_heads(build, writes, monkeypatch):
    """Graph.entries gives what the internals' JSON gives as heads, and
    writes that JSON only where an operator is followed by a node of its
    name."""
    sym = build()
    expected = [tuple(h[:2]) for h in graph_json(sym.get_internals())["heads"]]
    graph = mxamp.graph.Graph(sym)
    graph.json  # read before counting
    written = []
    tojson = mx.sym.Symbol.tojson
    monkeypatch.setattr(mx.sym.Symbol, "tojson",
                        lambda *a, **k: written.append(1) or tojson(*a, **k))
    assert graph.entries() == expected
    assert len(written) == writes


def test_a_mark_ending_in_a_backslash_is_checked_again(monkeypatch):
    """A graph checked for extension libraries is checked once; a marked copy
    again only where a mark ends in a backslash."""
    checks = []
    check = mxamp.graph.check_extension_json
    monkeypatch.setattr(mxamp.graph, "check_extension_json",
                        lambda *a, **k: checks.append(1) or check(*a, **k))
    graph = mxamp.graph.Graph(to_symbol(_chain()))
    graph.check_extension("a pass")
    graph.check_extension("a pass")
    graph.marked({1: {"__x__": "1"}}).check_extension("a pass")
    assert len(checks) == 1
    with pytest.raises(ValueError, match=r"ends in a backslash: \['1\\\\'\]"):
        graph.marked({1: {"__x__": "1\\"}}).check_extension("a pass")
    assert len(checks) == 2
