"""The backend's finishing pass (src/operator/onednn/finish.cc), which
makes a partitioned graph final, so that partitioning builds no graph from
JSON: most cases run the pass alone on a partitioned graph written out here,
with the entry types of the graph before partitioning given by node index,
and check the exact graph it makes."""
import copy
import json

import mxnet as mx
import pytest

import mxamp
import mxamp.backends
from graphs import count_graph_work
from isa import require_onednn3
from mxamp.backends.onednn import FINISH, REGION_OP
from mxamp.errors import BackendError

require_onednn3()


@pytest.fixture(scope="module")
def onednn():
    return mxamp.backends.get("onednn")


def _small_bf16_model():
    """Two convolutions whose outputs a Concat left on MXNet joins in
    bfloat16, then a FullyConnected: two regions, casts at each edge."""
    d = mx.sym.var("data")
    a = mx.sym.relu(mx.sym.Convolution(d, kernel=(3, 3), pad=(1, 1), num_filter=4, name="c1"))
    b = mx.sym.relu(mx.sym.Convolution(d, kernel=(3, 3), pad=(1, 1), num_filter=4, name="c2"))
    sym = mx.sym.FullyConnected(mx.sym.concat(a, b, dim=1), num_hidden=3, name="fc")
    shapes = dict(zip(sym.list_arguments(), sym.infer_shape(data=(2, 3, 6, 6))[0]))
    args = {n: mx.nd.ones(s) * 0.1 for n, s in shapes.items() if n != "data"}
    return mxamp.convert_model(sym, args, {}, target_dtype="bfloat16")


def test_partitioning_builds_no_graph_from_json(onednn, monkeypatch):
    """The pass's result is the final symbol: apply_backend reads the model
    once and builds no symbol from JSON; what the pass made (the regions
    logged) it reports, unread."""
    model = _small_bf16_model()
    calls = count_graph_work(monkeypatch)
    out, _, _ = onednn.apply_backend(*model, compute="float32")
    assert calls == {"tojson": 1, "loads": 1, "dumps": 0, "load_json": 0, "library": 0}
    monkeypatch.undo()
    assert len(onednn.regions(out)) == 2


# A partitioned graph: data x (float32), sin (bfloat16) and parameter w
# (bfloat16) read by a region computing fc; cos reads the region's output, an
# amp_multicast of cos and parameter p (both float32) feeds an add, and an
# amp_cast of the add to float32 and the region's output are the outputs.
PARTITIONED = {
    "nodes": [
        {"op": "null", "name": "x", "inputs": []},
        {"op": "sin", "name": "a", "inputs": [[0, 0, 0]]},
        {"op": "null", "name": "w", "inputs": []},
        {"op": REGION_OP, "name": "_op0", "attrs": {"compute": "float32"},
         "inputs": [[1, 0, 0], [2, 0, 0]],
         "subgraphs": [{
             "nodes": [{"op": "null", "name": "a0", "inputs": []},
                       {"op": "null", "name": "w0", "inputs": []},
                       {"op": "FullyConnected", "name": "fc",
                        "attrs": {"num_hidden": "2", "no_bias": "True"},
                        "inputs": [[0, 0, 0], [1, 0, 0]]}],
             "arg_nodes": [0, 1], "heads": [[2, 0, 0]]}]},
        {"op": "cos", "name": "cos", "inputs": [[3, 0, 0]]},
        {"op": "null", "name": "p", "inputs": []},
        {"op": "amp_multicast", "name": "mc", "attrs": {"num_outputs": "2"},
         "inputs": [[4, 0, 0], [5, 0, 0]]},
        {"op": "elemwise_add", "name": "add", "inputs": [[6, 0, 0], [6, 1, 0]]},
        {"op": "amp_cast", "name": "out", "attrs": {"dtype": "float32"}, "inputs": [[7, 0, 0]]},
    ],
    "arg_nodes": [0, 2, 5], "heads": [[8, 0, 0], [3, 0, 0]],
    "attrs": {"mxnet_version": ["int", 10901]}}
# The graph before partitioning, numbered as MXNet writes it (depth-first
# from the outputs): its nodes' output types (0 float32, 12 bfloat16).
ENTRY_TYPES = "\n".join(["0 null 0", "1 sin 12", "2 null 12", "3 FullyConnected 12", "4 cos 0",
                         "5 null 0", "6 amp_multicast 0 0", "7 elemwise_add 0",
                         "8 amp_cast 0"])


def _finished(entry_types=ENTRY_TYPES, data_inputs="0 null", partitioned=PARTITIONED):
    part = mx.sym.load_json(json.dumps(partitioned))
    return json.loads(part.optimize_for(FINISH, skip_infer=True, entry_types=entry_types,
                                        data_inputs=data_inputs).tojson(remove_amp_cast=False))


def _edges(graph):
    """(op, name, the names of what it reads) per operator node."""
    nodes = graph["nodes"]
    return [(n["op"], n["name"], [nodes[e[0]]["name"] for e in n["inputs"]])
            for n in nodes if n["op"] != "null"]


def test_the_pass_casts_region_edges_and_skips_copying_casts(onednn):
    """Around the region: sin's bfloat16 cast to float32 outside and back
    inside; w, read by the region only, stored in float32 (no cast, its
    __dtype__ float32); fc's output cast to float32 inside and back to
    bfloat16 for cos and the graph output. The multicast of two float32
    values is skipped (add reads cos and p); the output cast is kept."""
    graph = _finished()
    assert _edges(graph) == [
        ("sin", "a", ["x"]), ("amp_cast", "a_amp_cast_float32", ["a"]),
        (REGION_OP, "_op0", ["a_amp_cast_float32", "w"]),
        ("amp_cast", "_op0_amp_cast_bfloat16", ["_op0"]),
        ("cos", "cos", ["_op0_amp_cast_bfloat16"]), ("elemwise_add", "add", ["cos", "p"]),
        ("amp_cast", "out", ["add"])]
    assert [graph["nodes"][h[0]]["name"] for h in graph["heads"]] == [
        "out", "_op0_amp_cast_bfloat16"]
    (region,) = [n for n in graph["nodes"] if n["op"] == REGION_OP]
    inner = region["subgraphs"][0]
    assert _edges(inner) == [
        ("amp_cast", "a0_amp_cast_bfloat16", ["a0"]), ("amp_cast", "w0_amp_cast_bfloat16", ["w0"]),
        ("FullyConnected", "fc", ["a0_amp_cast_bfloat16", "w0_amp_cast_bfloat16"]),
        ("amp_cast", "fc_amp_cast_float32", ["fc"])]
    assert [inner["nodes"][h[0]]["name"] for h in inner["heads"]] == ["fc_amp_cast_float32"]
    (w,) = [n for n in graph["nodes"] if n["name"] == "w"]
    assert w["attrs"]["__dtype__"] == "0"
    assert onednn._library(onednn.load()).mxamp_onednn_widened().decode() == "2\n"


def test_the_pass_keeps_a_cast_of_a_data_input(onednn):
    """With p a data input (the caller may feed it in another type), the
    multicast reading it stays."""
    assert ("amp_multicast", "mc", ["cos", "p"]) in _edges(_finished(data_inputs="0 null\n5 null"))


def test_the_pass_refuses_options_it_cannot_read(onednn):
    """Types of another graph (a node's op differs), or lines of another
    shape, are one clear error."""
    with pytest.raises(mx.base.MXNetError, match="node 1 is a sin here but a cos in option "
                                                 "entry_types"):
        _finished(ENTRY_TYPES.replace("1 sin", "1 cos"))
    with pytest.raises(mx.base.MXNetError, match="option entry_types: '1 sin twelve' is not "
                                                 "'<index> <op> <code>...' of node 1"):
        _finished(ENTRY_TYPES.replace("1 sin 12", "1 sin twelve"))
    for line in ("0 x", "1 null", "9 null", "-5 null"):  # 1: sin; 9, -5: no node
        with pytest.raises(mx.base.MXNetError, match=f"option data_inputs: '{line}' is not "
                                                     "'<index> null' of a variable"):
            _finished(data_inputs=line)


def test_the_pass_refuses_channel_means_it_cannot_read(onednn):
    """data_means lines name a node of entry_types once, by index and op,
    with numbers."""
    for bad, lines in (("1 cos 0.5", "1 cos 0.5"), ("1 sin x", "1 sin x"),
                       ("9 sin 1", "9 sin 1"), ("1 sin 2", "1 sin 1\n1 sin 2")):
        part = mx.sym.load_json(json.dumps(PARTITIONED))
        with pytest.raises(mx.base.MXNetError, match=f"option data_means: '{bad}' is not "
                                                     "'<index> <op> <mean>...' of a node"):
            part.optimize_for(FINISH, skip_infer=True, entry_types=ENTRY_TYPES,
                              data_inputs="0 null", data_means=lines)


def _int8_partitioned():
    """PARTITIONED with its region computing fc in INT8 (its data
    calibrated), and the entry types with w float32 before partitioning, so
    that fc reads it uncast."""
    partitioned = json.loads(json.dumps(PARTITIONED))
    partitioned["nodes"][3]["attrs"].update(compute="int8", input_ranges="1,0;")
    return (mx.sym.load_json(json.dumps(partitioned)),
            {"skip_infer": True, "entry_types": ENTRY_TYPES.replace("2 null 12", "2 null 0"),
             "data_inputs": "0 null"})


@pytest.mark.parametrize("shape, dtype, message", [
    ((2, 3), "int32",
     "parameter w has dtype int32: s8 weights are made from float32 or float64 weights"),
    ((6,), "float32",
     r"weights w of fc have shape \[6\]: s8 weights need 2 axes or more and an output channel"),
], ids=["int32", "one-axis"])
def test_the_pass_refuses_int8_weights_it_cannot_quantize(onednn, shape, dtype, message):
    """An INT8 layer whose weights MXNet hands the pass in integers, or in a
    shape with no rows of output channels: a clear error naming the
    parameter, not a crash."""
    part, options = _int8_partitioned()
    with pytest.raises(mx.base.MXNetError, match=f"mxamp_onednn_finish: {message}"):
        part.optimize_for(FINISH, args={"w": mx.nd.ones(shape, dtype=dtype)}, **options)


@pytest.mark.parametrize("weights, why", [
    (None, "the finishing pass got no tensor for its parameters: they are no parameter of the "
           "model, or their name holds a quote"),
    (float("nan"), "its weights or bias hold NaN or Inf, which no int8 value stands for"),
    (float("-inf"), "its weights or bias hold NaN or Inf, which no int8 value stands for"),
], ids=["no tensor", "NaN", "Inf"])
def test_an_int8_layer_whose_weights_the_pass_cannot_write_keeps_them(onednn, weights, why,
                                                                     monkeypatch):
    """No tensor for w (a parameter the caller did not give, or one whose
    name MXNet's extension API does not read back), or weights holding NaN
    or Inf (no s8 value stands for them): fc reads w as it did, and the
    region quantizes it when it first runs (its exact float32 plan where
    a value is not finite); the pass adds no s8 weights but its reason,
    which the library reports for the layer (for every region of a model
    at once). Float weights it has are packed as the region's other float
    parameters are."""
    part, options = _int8_partitioned()
    args = {"p": mx.nd.ones((2,))}
    if weights is not None:
        args["w"] = mx.nd.array([[0.5, weights, 1], [1, 2, 3]])
    out = json.loads(part.optimize_for(FINISH, args=args, **options).tojson())
    (region,) = [n for n in out["nodes"] if n["op"] == REGION_OP]
    inner = region["subgraphs"][0]["nodes"]
    (fc,) = [n for n in inner if n["op"] == "FullyConnected"]
    read = inner[fc["inputs"][1][0]]
    w = "w" if weights is None else "_op0_params_3"
    assert out["nodes"][region["inputs"][1][0]]["name"] == w
    assert read["name"] == "w0" if weights is None else (
        read["op"] == "_split_v2" and inner[read["inputs"][0][0]]["name"] == w)
    assert [n["name"] for n in inner if n["op"] == "null"] == ["a0", "w0" if weights is None else w]
    assert [n["name"] for n in out["nodes"] if n["op"] == "null"] == ["x", w, "p"]
    (kept,) = onednn.float32_weight_layers(out).items()
    assert kept[0] == "fc" and kept[1].startswith(why)
    two = _with_a_second_region(out, region)
    calls = count_graph_work(monkeypatch)
    assert onednn.float32_weight_layers(two) == {"fc": kept[1], "fc_b": kept[1]}
    assert (calls["dumps"], calls["library"]) == (1, 1)  # the regions answered at once


def _with_a_second_region(graph, region):
    """`graph` with a copy of its `region` node as a further output, reading
    what it reads; the copy's FullyConnected named fc_b."""
    twin = copy.deepcopy(region)
    for node in twin["subgraphs"][0]["nodes"]:
        if node["op"] == "FullyConnected":
            node["name"] = "fc_b"
    twin["name"] += "_b"
    nodes = graph["nodes"] + [twin]
    return {**graph, "nodes": nodes, "heads": graph["heads"] + [[len(nodes) - 1, 0, 0]]}


def test_the_pass_refuses_a_region_whose_inputs_its_subgraph_lacks(onednn):
    """A region node that reads fewer entries than its subgraph has
    variables (not one the partitioner makes) is an error, not a crash."""
    partitioned = json.loads(json.dumps(PARTITIONED))
    partitioned["nodes"][3]["inputs"].pop()
    with pytest.raises(mx.base.MXNetError, match="region _op0 has 1 inputs but its subgraph 2 "
                                                 "variables"):
        _finished(partitioned=partitioned)


def test_a_failing_finish_is_a_backend_error(onednn, monkeypatch):
    """apply_backend raises the pass's failure as a BackendError with its
    one line."""
    monkeypatch.setattr(onednn, "_entry_type_lines", lambda graph, types: "0 null 0")
    with pytest.raises(BackendError, match="^oneDNN backend: mxamp_onednn_finish: option "
                                           "entry_types has 1 nodes, the graph before "
                                           r"partitioning \d+$"):
        onednn.apply_backend(*_small_bf16_model(), compute="float32")


def _variable(name):
    return {"op": "null", "name": name, "inputs": []}


def _region(name, inputs, inner_nodes, heads):
    """A float32 region node reading `inputs` (outer entries) whose
    subgraph's variables come first in `inner_nodes`."""
    arg_nodes = [i for i, n in enumerate(inner_nodes) if n["op"] == "null"]
    return {"op": REGION_OP, "name": name, "attrs": {"compute": "float32"}, "inputs": inputs,
            "subgraphs": [{"nodes": inner_nodes, "arg_nodes": arg_nodes, "heads": heads}]}


def _fc(name, inputs):
    return {"op": "FullyConnected", "name": name, "attrs": {"num_hidden": "2", "no_bias": "True"},
            "inputs": inputs}


def _graph(nodes, heads):
    return {"nodes": nodes, "heads": heads, "attrs": {"mxnet_version": ["int", 10901]},
            "arg_nodes": [i for i, n in enumerate(nodes) if n["op"] == "null"]}


def _with(edit):
    """PARTITIONED changed by `edit` (of a copy)."""
    graph = json.loads(json.dumps(PARTITIONED))
    edit(graph)
    return graph


def _widened(onednn):
    return onednn._library(onednn.load()).mxamp_onednn_widened().decode()


def test_one_region_feeding_another_needs_no_cast_between_them(onednn):
    """Region _op0's bfloat16 fc feeds region _op1: each region casts inside
    (both compute float32 at their edges), and nothing is cast between
    them; only _op1's output, a graph output, is cast back to bfloat16."""
    partitioned = _graph([
        _variable("x"), {"op": "sin", "name": "a", "inputs": [[0, 0, 0]]}, _variable("w"),
        _region("_op0", [[1, 0, 0], [2, 0, 0]],
                [_variable("a0"), _variable("w0"), _fc("fc", [[0, 0, 0], [1, 0, 0]])],
                [[2, 0, 0]]),
        _variable("v"),
        _region("_op1", [[3, 0, 0], [4, 0, 0]],
                [_variable("b0"), _variable("v0"), _fc("fc2", [[0, 0, 0], [1, 0, 0]])],
                [[2, 0, 0]])], [[5, 0, 0]])
    types = "\n".join(["0 null 0", "1 sin 12", "2 null 12", "3 FullyConnected 12", "4 null 12",
                       "5 FullyConnected 12"])
    graph = _finished(types, partitioned=partitioned)
    assert _edges(graph) == [
        ("sin", "a", ["x"]), ("amp_cast", "a_amp_cast_float32", ["a"]),
        (REGION_OP, "_op0", ["a_amp_cast_float32", "w"]), (REGION_OP, "_op1", ["_op0", "v"]),
        ("amp_cast", "_op1_amp_cast_bfloat16", ["_op1"])]
    inner = [_edges(n["subgraphs"][0]) for n in graph["nodes"] if n["op"] == REGION_OP]
    assert inner[1] == [
        ("amp_cast", "b0_amp_cast_bfloat16", ["b0"]), ("amp_cast", "v0_amp_cast_bfloat16", ["v0"]),
        ("FullyConnected", "fc2", ["b0_amp_cast_bfloat16", "v0_amp_cast_bfloat16"]),
        ("amp_cast", "fc2_amp_cast_float32", ["fc2"])]
    assert inner[0][-1] == ("amp_cast", "fc_amp_cast_float32", ["fc"])
    assert _widened(onednn) == "2\n4\n"


def test_each_bfloat16_output_of_a_region_is_cast_back_by_its_index(onednn):
    """A region with two bfloat16 outputs: each is cast to float32 inside
    and back outside, output 1's cast named with its index."""
    partitioned = _graph([
        _variable("x"), {"op": "sin", "name": "a", "inputs": [[0, 0, 0]]}, _variable("w"),
        _region("_op0", [[1, 0, 0], [2, 0, 0]],
                [_variable("a0"), _variable("w0"), _fc("f1", [[0, 0, 0], [1, 0, 0]]),
                 _fc("f2", [[0, 0, 0], [1, 0, 0]])], [[2, 0, 0], [3, 0, 0]]),
        {"op": "cos", "name": "cos", "inputs": [[3, 0, 0]]}], [[4, 0, 0], [3, 1, 0]])
    types = "\n".join(["0 null 0", "1 sin 12", "2 null 12", "3 FullyConnected 12",
                       "4 cos 12", "5 FullyConnected 12"])
    graph = _finished(types, partitioned=partitioned)
    assert _edges(graph)[2:] == [
        (REGION_OP, "_op0", ["a_amp_cast_float32", "w"]),
        ("amp_cast", "_op0_amp_cast_bfloat16", ["_op0"]),
        ("cos", "cos", ["_op0_amp_cast_bfloat16"]),
        ("amp_cast", "_op0_1_amp_cast_bfloat16", ["_op0"])]
    heads = [(graph["nodes"][h[0]]["name"], h[1]) for h in graph["heads"]]
    assert heads == [("cos", 0), ("_op0_1_amp_cast_bfloat16", 0)]
    (region,) = [n for n in graph["nodes"] if n["op"] == REGION_OP]
    inner = region["subgraphs"][0]
    assert [inner["nodes"][h[0]]["name"] for h in inner["heads"]] == [
        "f1_amp_cast_float32", "f2_amp_cast_float32"]
    assert graph["nodes"][[n["name"] for n in graph["nodes"]].index("_op0_1_amp_cast_bfloat16")][
        "inputs"] == [[[n["name"] for n in graph["nodes"]].index("_op0"), 1, 0]]


def test_a_cast_the_graph_holds_serves_a_region_edge(onednn):
    """The graph already casts sin's output to float32 (a32, an output):
    the region reads that cast; no second one is made."""
    def edit(graph):
        graph["nodes"].append({"op": "amp_cast", "name": "a32", "attrs": {"dtype": "float32"},
                               "inputs": [[1, 0, 0]]})
        graph["heads"].append([9, 0, 0])
    types = ENTRY_TYPES + "\n9 amp_cast 0"
    edges = _edges(_finished(types, partitioned=_with(edit)))
    assert (REGION_OP, "_op0", ["a32", "w"]) in edges
    assert [e for e in edges if e[0] == "amp_cast" and e[2] == ["a"]] == [
        ("amp_cast", "a32", ["a"])]


@pytest.mark.parametrize("read_by", ["an operator on MXNet", "the graph's outputs"])
def test_a_parameter_not_only_regions_read_stays_bfloat16(onednn, read_by):
    """w, also read by tan on MXNet or an output of the graph, keeps its
    bfloat16 (its other reader needs it): the region reads a float32 cast
    of it, and no parameter is reported widened."""
    def edit(graph):
        if read_by == "an operator on MXNet":
            graph["nodes"].append({"op": "tan", "name": "tan", "inputs": [[2, 0, 0]]})
            graph["heads"].append([9, 0, 0])
        else:
            graph["heads"].append([2, 0, 0])
    types = ENTRY_TYPES + ("\n9 tan 12" if read_by == "an operator on MXNet" else "")
    graph = _finished(types, partitioned=_with(edit))
    assert (REGION_OP, "_op0", ["a_amp_cast_float32", "w_amp_cast_float32"]) in _edges(graph)
    (w,) = [n for n in graph["nodes"] if n["name"] == "w"]
    assert "__dtype__" not in w.get("attrs", {})
    assert _widened(onednn) == ""


def test_a_multicast_of_a_float32_region_output_is_skipped(onednn):
    """A multicast reading a region's float32 output and float32 p copies
    its inputs: add reads the region and p."""
    def edit(graph):
        graph["nodes"][6]["inputs"][0] = [3, 0, 0]
    types = ENTRY_TYPES.replace("3 FullyConnected 12", "3 FullyConnected 0").replace(
        "4 cos 0\n5 null 0", "4 null 0").replace("6 amp_multicast", "5 amp_multicast").replace(
        "7 elemwise_add", "6 elemwise_add").replace("8 amp_cast", "7 amp_cast")
    graph = _finished(types, partitioned=_with(edit))
    assert ("elemwise_add", "add", ["_op0", "p"]) in _edges(graph)
    assert "amp_multicast" not in [n["op"] for n in graph["nodes"]]


def test_the_pass_gets_dense_cpu_copies_of_sparse_parameters():
    """The extension API hands a pass an array's memory as if it were dense
    and on the CPU: a sparse parameter reaches it as a dense copy, with its
    values, and the caller's array stays sparse."""
    values = mx.nd.array([[0, 0, 0], [1, 2, 3], [0, 0, 0], [4, 5, 6]])
    sparse = values.tostype("row_sparse")
    passed = mxamp.backends.onednn._pass_params({"w": sparse})
    assert passed["w"].stype == "default" and sparse.stype == "row_sparse"
    assert (passed["w"].asnumpy() == values.asnumpy()).all()
