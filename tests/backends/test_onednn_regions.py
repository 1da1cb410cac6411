"""The backend forms its regions in its finishing pass (regions.h), in time
linear in the graph's size, and the graph it makes is the one MXNet's
partitioner made with the library's selector and review, then the pass
alone: every partitioning here runs both ways and compares their JSON
(subgraphs included) and the parameters the pass writes. Random graphs
(float32, converted to bfloat16, and with calibration marks on random
entries for INT8), a model converted and quantized whole, and the shapes
MXNet's grouping has rules for: a cycle through a node left outside, a
value read several times from outside, adjacent regions."""
import json
import os
import random

import mxnet as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mxamp
import mxamp.quantization as quantization
from graphs import tiny_net
from isa import require_onednn3
from mxamp.backends import onednn
from mxamp.graph import graph_json
from random_graphs import BINARY, SHAPE, UNARY, graphs

require_onednn3()

# The options MXNet's partitioner took; the pass took the others.
PARTITIONER_OPTIONS = ("compute", "rest_dtype", "bf16_nodes", "other_types")


def _through_mxnet(graph, options, args):
    """The final symbol as MXNet's partitioner and then the finishing pass
    made it, and the parameters the pass added to a copy of `args`."""
    own = {k: v for k, v in options.items() if k in PARTITIONER_OPTIONS}
    rest = {k: v for k, v in options.items()
            if k not in PARTITIONER_OPTIONS and k != "output_names"}
    part = graph.symbol.optimize_for(onednn.PARTITIONER, ctx=mx.cpu(), skip_infer=True, **own)
    args = None if args is None else dict(args)
    out = part.optimize_for(onednn.FINISH, args=args, aux=None if args is None else dict(args),
                            ctx=mx.cpu(), skip_infer=True, **rest)
    return out, args


def _mxnet_json(graph, options, args):
    """The JSON and parameters of _through_mxnet, or None where MXNet's
    partitioner made two regions that read each other (a cycle, which MXNet
    cannot write out or finish)."""
    try:
        made, made_args = _through_mxnet(graph, options, args)
        return made.tojson(remove_amp_cast=False), made_args
    except mx.base.MXNetError:
        return None, None


class _Compared(list):
    def __init__(self):
        super().__init__()
        self.untangled = []


@pytest.fixture
def compared(monkeypatch):
    """Every partitioning made both ways and compared; the number compared
    (and in `compared.untangled`, those where MXNet's made a cycle: the
    pass's result runs there)."""
    run = onednn._run_partitioner
    count = _Compared()

    def both(graph, options, args):
        expected, mxnet_args = _mxnet_json(graph, options, args)
        final = run(graph, options, args)
        if expected is None:
            count.untangled.append(final.tojson(remove_amp_cast=False))
            return final
        assert final.tojson(remove_amp_cast=False) == expected
        if args is not None:
            assert args.keys() == mxnet_args.keys()
            for k, v in args.items():
                np.testing.assert_array_equal(v.asnumpy(), mxnet_args[k].asnumpy())
        count.append(1)
        return final
    monkeypatch.setattr(onednn, "_run_partitioner", both)
    return count


def _params(sym, shapes):
    arg_shapes, _, aux_shapes = sym.infer_shape_partial(**shapes)
    rng = np.random.RandomState(0)
    args = {n: mx.nd.array(rng.uniform(-0.5, 0.5, s))
            for n, s in zip(sym.list_arguments(), arg_shapes) if n not in shapes}
    aux = {n: mx.nd.array(rng.uniform(0.5, 1.5, s))
           for n, s in zip(sym.list_auxiliary_states(), aux_shapes)}
    return args, aux


def _calibrated(sym, seed):
    """`sym` with calibration marks (as mxamp.quantization sets them) on
    about half its entries, some of them non-negative."""
    rng = random.Random(seed)
    marked = sym.__copy__()
    internals = marked.get_internals()
    for k in range(len(internals.list_outputs())):
        if rng.random() < 0.5:
            amax = rng.uniform(0.5, 4)
            internals[k]._set_attr(__mxamp_amax__=repr(amax),
                                   __mxamp_min__=repr(rng.choice([0.0, -amax])))
    return marked


@settings(max_examples=int(os.environ.get("MXAMP_FUZZ_EXAMPLES", "100")), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(graphs(), st.integers(0, 2**16))
def test_random_graphs_partition_as_mxnet_did(compared, graph, seed):
    sym, excluded = graph
    before = len(compared)
    data = {n: s for n, s in {"x0": SHAPE, "x1": SHAPE, "idx": (2,)}.items()
            if n in sym.list_arguments()}
    args, aux = _params(sym, data)
    onednn.apply_backend(sym, args, aux, compute="float32")
    converted = mxamp.convert_model(sym, args, aux, target_dtype="bfloat16",
                                    excluded_sym_names=excluded,
                                    cast_optional_params=bool(seed % 2))
    onednn.apply_backend(*converted, compute="float32")
    rests = ["float32"]  # what INT8 regions compute in elsewhere
    if mxamp.cpu.features("onednn").bf16:
        onednn.apply_backend(*converted, compute="bfloat16")
        rests.append("bfloat16")
    onednn.apply_backend(_calibrated(sym, seed), args, aux, compute="int8",
                         rest_dtype=random.Random(seed).choice(rests))
    assert len(compared) > before + 1


def test_a_model_converted_and_quantized_partitions_as_mxnet_did(compared):
    net = tiny_net()
    x = mx.nd.random.uniform(shape=(1, 3, 8, 8))
    mxamp.convert_hybrid_block(net, target_dtype="bfloat16", backend="onednn")
    quantization.quantize_net(net, calib_data=[x], calib_mode="naive")
    quantization.quantize_net(tiny_net(), calib_data=[x], calib_mode="naive",
                              exclude_layers_match=["dense"])
    assert len(compared) == 4  # the conversion partitions to plan, then its result


def _dense(x, name):
    return mx.sym.FullyConnected(x, num_hidden=8, name=name)


def _region_names(graph):
    """The names of the operators of each region of a graph's JSON dict."""
    table = onednn.operator_table()  # not the nodes that cut its packed parameters
    return [[n["name"] for n in node["subgraphs"][0]["nodes"] if n["op"] in table]
            for node in graph["nodes"] if node["op"] == onednn.REGION_OP]


def _regions(sym):
    """The names of the operators of each region, after apply_backend."""
    args, aux = _params(sym, {"data": (2, 8)})
    out, _, _ = onednn.apply_backend(sym, args, aux, compute="float32")
    return _region_names(graph_json(out))


def test_a_node_left_outside_between_region_nodes_breaks_the_region(compared):
    """fc1 -> sin (left on MXNet) -> add, which also reads fc1: one region of
    fc1 and add would read its own output through sin. MXNet excludes the
    add (the largest node index of the cycle) and starts it again later."""
    fc1 = _dense(mx.sym.var("data"), "fc1")
    out = _dense(mx.sym.elemwise_add(fc1, mx.sym.sin(fc1, name="sin"), name="add"), "fc2")
    assert _regions(out) == [["fc1"], ["add", "fc2"]]


def test_values_read_several_times_from_outside(compared):
    """fc1's output read by two nodes outside and as a graph output, data
    read twice inside: an input and an output of the region for each read."""
    data = mx.sym.var("data")
    fc1 = _dense(mx.sym.elemwise_add(data, data, name="twice"), "fc1")
    sym = mx.sym.Group([fc1, mx.sym.sin(fc1, name="s"), mx.sym.cos(fc1, name="c")])
    assert _regions(sym) == [["twice", "fc1"]]
    assert len(compared) == 1


def test_adjacent_regions_and_one_read_by_another(compared):
    """Two regions apart from a node left outside, the second reading the
    first's output directly too, and a BatchNorm inside."""
    data = mx.sym.var("data")
    fc1 = mx.sym.relu(_dense(data, "fc1"), name="r1")
    mid = mx.sym.sin(fc1, name="sin")
    bn = mx.sym.BatchNorm(mx.sym.reshape(_dense(mid, "fc2"), (2, 8, 1, 1)), name="bn")
    out = mx.sym.elemwise_add(mx.sym.reshape(bn, (2, 8)), fc1, name="add")
    assert len(_regions(out)) >= 1
    assert len(compared) == 1


def _ladder(steps, outside=("sin",), data=None):
    """Each step (dense, relu, add) reads the last directly and through the
    nodes `outside`, left on MXNet; the first reads `data`."""
    x = mx.sym.var("data") if data is None else data
    for i in range(steps):
        step = mx.sym.relu(_dense(x, f"fc{i}"), name=f"r{i}")
        around = x
        for op in outside:
            around = getattr(mx.sym, op)(around, name=f"{op}{i}")
        x = mx.sym.elemwise_add(step, around, name=f"a{i}")
    return x


def test_a_ladder_of_cycles_partitions_as_mxnet_did(compared):
    """Each step reads the last through a node left outside (sin) and
    directly: every group MXNet starts excludes one node per step before
    it holds no cycle (the search that repeats, regions.h)."""
    assert len(_regions(_ladder(12))) == 12
    assert len(_regions(_ladder(12, ("sin", "cos")))) == 12
    assert len(compared) == 2


def _two_cycles(data):
    """y reads a and, through a sin, u; x reads u and, through a sin, y; r
    reads x and a. The group started at a holds all five, with a cycle
    closed at y (through u's sin) and one at x (through y's sin). MXNet
    excludes x alone, the larger, which leaves u out of the group and the
    cycle at y with it; then r (y's sin reaches it through x): [a, y]; then
    [u] (its sin reaches x through y) and [x, r]. Excluding y and x at once
    leaves y out too: [a], [u], [y], [x, r]."""
    a, u = _dense(data, "a"), _dense(data, "u")
    y = mx.sym.elemwise_add(a, mx.sym.sin(u, name="su"), name="y")
    x = mx.sym.elemwise_add(u, mx.sym.sin(y, name="sy"), name="x")
    return mx.sym.Group([y, mx.sym.elemwise_add(x, a, name="r")])


TWO_CYCLES = {"a", "y", "u", "x", "r"}


def _split(regions):
    """The regions of _two_cycles, sorted, and the others."""
    return (sorted(r for r in regions if set(r) <= TWO_CYCLES),
            [r for r in regions if not set(r) <= TWO_CYCLES])


def test_exclusions_made_one_at_a_time_as_mxnet_makes_them(compared):
    """A ladder of 23 steps excludes 253 nodes (22 + 21 + ... + 1 over its
    groups), the two cycles after it 3 more: 256, groups.cc's
    kExactExclusions, each search excluding one, as MXNet's does."""
    data = mx.sym.var("data")
    regions = _regions(mx.sym.Group([_ladder(23, data=data), _two_cycles(data)]))
    assert _split(regions)[0] == [["a", "y"], ["u"], ["x", "r"]]
    assert len(regions) == 23 + 3
    assert len(compared) == 1


def test_past_the_exact_exclusions_a_search_excludes_every_candidate(monkeypatch):
    """A ladder of 24 steps excludes 276 nodes; past 256 (groups.cc's
    kExactExclusions) each search excludes every node MXNet's would weigh,
    not only the largest. The ladder's steps still group as MXNet's do
    (excluding every later step's add at once leaves what excluding them one
    by one does); the two cycles after it group as [a], [u], [x, r], [y]
    where MXNet makes [a, y], [u], [x, r]; the result runs as the float32
    graph does."""
    made = []  # MXNet's partitioner's graph, then the pass's

    run = onednn._run_partitioner

    def both(graph, options, args):
        made.append(json.loads(_mxnet_json(graph, options, args)[0]))
        final = run(graph, options, args)
        made.append(graph_json(final))
        return final
    monkeypatch.setattr(onednn, "_run_partitioner", both)
    data = mx.sym.var("data")
    sym = mx.sym.Group([_ladder(24, data=data), _two_cycles(data)])
    args, aux = _params(sym, {"data": (2, 8)})
    out, out_args, out_aux = onednn.apply_backend(sym, args, aux, compute="float32")
    (mxnet_cycles, mxnet_ladder), (cycles, ladder) = map(_split, map(_region_names, made))
    assert mxnet_cycles == [["a", "y"], ["u"], ["x", "r"]]
    assert cycles == [["a"], ["u"], ["x", "r"], ["y"]]
    assert ladder == mxnet_ladder and len(ladder) == 24
    feeds = {"data": mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (2, 8)))}

    def run_graph(s, a, x):
        return [o.asnumpy() for o in s.bind(mx.cpu(), {**a, **feeds}, aux_states=x,
                                            grad_req="null").forward()]
    for got, want in zip(run_graph(out, out_args, out_aux), run_graph(sym, args, aux)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def _tangled_graph():
    """100 random steps over two inputs (dense, activations, softmax,
    LayerNorm, clip and adds on the backend; sin, cos and negative left
    outside) where MXNet's partitioner makes two regions that read each
    other."""
    rng = random.Random(1)
    entries = [mx.sym.var("x0"), mx.sym.var("x1")]
    chosen = ["dense", "relu", "sigmoid", "tanh", "softmax", "layernorm", "act_relu", "clip"]
    for i in range(100):
        def pick():
            return entries[-1 - min(int(rng.expovariate(0.3)), len(entries) - 1)]
        r = rng.random()
        if r < 0.2:
            entries.append(UNARY[rng.choice(["sin", "cos", "negative"])](pick(), f"n{i}"))
        elif r < 0.7:
            entries.append(UNARY[rng.choice(chosen)](pick(), f"n{i}"))
        else:
            entries.append(BINARY["add"](pick(), pick(), f"n{i}"))
    return entries[-1]


def test_regions_that_mxnet_would_make_read_each_other_run_apart(compared):
    """MXNet's rules check for a cycle through the nodes left outside a
    group, not through the groups formed before it: here two of its regions
    read each other (its graph cannot be written out: "_Map_base::at", which
    apply_backend raised). The pass runs the later group's nodes each alone
    and gives MXNet's float32 results."""
    sym = _tangled_graph()
    data = {n: SHAPE for n in sym.list_arguments() if n in ("x0", "x1")}
    args, aux = _params(sym, data)
    out, out_args, out_aux = onednn.apply_backend(sym, args, aux, compute="float32")
    assert len(compared.untangled) == 1
    feeds = {n: mx.nd.array(np.random.RandomState(0).uniform(-1, 1, s)) for n, s in data.items()}

    def run(s, a, x):
        return s.bind(mx.cpu(), {**a, **feeds}, aux_states=x, grad_req="null").forward()[0]
    np.testing.assert_allclose(run(out, out_args, out_aux).asnumpy(),
                               run(sym, args, aux).asnumpy(), rtol=1e-4, atol=1e-4)
