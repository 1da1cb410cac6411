"""Quantization reads the model's graph once and calibrates as the model runs:
the serializations one quantization call makes, and calibration
that reads each tensor as it is made, never holding every intermediate at
once, with the thresholds of all tensors computed together."""
import re

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon import nn

import mxamp
import mxamp.quantization as quantization
from mxamp import native
from mxamp.quantization import calibrate

import nets
from graphs import count_graph_work

REGION = "_mxamp_onednn_region"


SHAPE = (4, 3, 12, 12)


def batches(n=3, seed=1):
    rng = np.random.RandomState(seed)
    return [mx.nd.array(rng.normal(0, scale, SHAPE)) for scale in (1.0, 3.0, 0.5)[:n]]


@pytest.fixture
def counted(monkeypatch):
    """:func:`graphs.count_graph_work` (the backend library loaded first:
    loading checks its partitioner once per process)."""
    try:
        native.onednn_prefix()
    except RuntimeError:
        pytest.skip("oneDNN 3 packages not installed")
    mxamp.backends.get("onednn").load()
    return count_graph_work(monkeypatch)


def regions_net(regions):
    """`regions` conv-bn-relu blocks, each an INT8 region of its own: a sin
    (an operator the backend does not run) between blocks."""
    with mx.name.NameManager():
        x = mx.sym.var("data")
        for k in range(regions):
            x = mx.sym.Convolution(x, kernel=(3, 3), pad=(1, 1), num_filter=3, name=f"c{k}")
            x = mx.sym.relu(mx.sym.BatchNorm(x, name=f"bn{k}"), name=f"r{k}")
            x = mx.sym.sin(x, name=f"s{k}") if k < regions - 1 else x
        return mx.sym.FullyConnected(x, num_hidden=10, name="fc")  # in the last region


# The model read once (its JSON text, parsed) and that text handed to the
# backend's library once (which tensors calibration averages). The rest is
# the libraries': the partitioner's pass reports what it made.
MOST = 4
COUNTS = {"tojson": 1, "loads": 1, "library": 1, "dumps": 0, "load_json": 0}


@pytest.mark.parametrize("regions", [1, 3])
@pytest.mark.parametrize("calib_mode", ["naive", "entropy"])
def test_quantize_model_reads_the_graph_once(counted, calib_mode, regions):
    """Every whole-graph serialization and parse mxamp makes (as
    count_graph_work counts them: Symbol.tojson, mx.sym.load_json, json.dumps
    or json.loads of a graph's JSON form, graph text handed to the backend's
    library), the same however many INT8 regions there are. Not counted:
    what MXNet does itself inside ``Symbol.optimize_for`` (it writes the
    graph for the backend's pass and reads back the pass's result)."""
    sym = regions_net(regions)
    arg_params, aux_params = nets.random_params(sym, SHAPE)
    qsym, _, _ = quantization.quantize_model(sym, arg_params, aux_params, label_names=(),
                                             calib_mode=calib_mode, calib_data=batches(),
                                             excluded_sym_names=["c0"])
    assert sum(counted.values()) <= MOST, counted
    assert counted == COUNTS  # as in MOST's comment
    found = [n for n in mxamp.graph.graph_json(qsym)["nodes"] if n["op"] != "null"]
    assert [n["op"] for n in found if n["op"] != "sin"] == [REGION] * regions
    marks = {n["name"]: n.get("attrs", {}) for n in found[0]["subgraphs"][0]["nodes"]}
    assert marks["c0"][quantization.api.FLOAT] == "1"  # excluded: float32 in the region
    assert quantization.api.AMAX in marks["r0"] and quantization.api.FLOAT not in marks["r0"]


def test_quantize_net_reads_the_graph_once(counted):
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.Conv2D(8, 3, padding=1), nn.Activation("relu"), nn.Dense(10))
    net.initialize(mx.init.Xavier())
    data = batches()
    net(data[0])
    counted.update(dict.fromkeys(counted, 0))
    block = quantization.quantize_net(net, calib_data=data, calib_mode="naive",
                                      exclude_layers_match=["dense"])
    assert sum(counted.values()) <= MOST, counted
    expected = net(data[0]).asnumpy()
    out = block(data[0]).asnumpy()
    assert np.linalg.norm(out - expected) / np.linalg.norm(expected) < 0.05


def test_streamed_thresholds_are_those_of_all_tensors_at_once():
    """Naive ranges exactly; entropy thresholds from numpy's histogram of all
    values over the collector's final range, to within a bin (float32
    rounding at bin edges may move a value by one bin)."""
    sym = nets.small_net()
    arg_params, aux_params = nets.random_params(sym, SHAPE)
    names = list(calibrate.tensor_names(sym, ["data"]))
    values = nets.tensors_over(sym, arg_params, aux_params, names, batches())
    naive = calibrate.collect(sym, arg_params, aux_params, names, batches(), ["data"], "naive")
    for name in names:
        assert (naive[name].min, naive[name].max) == (values[name].min(), values[name].max())
    tool = calibrate.Collector(sym, arg_params, aux_params, names, ["data"], "entropy")
    tool.run(batches())
    for name, found in tool.stats().items():
        _, edges = tool.histogram(name)
        hist = np.histogram(values[name], len(edges) - 1, (edges[0], edges[-1]))[0]
        expected = min(calibrate.entropy_threshold(hist, edges),
                       calibrate.naive_threshold(found.min, found.max))
        assert found.threshold == pytest.approx(expected, abs=edges[1] - edges[0]), name


def deep_net(layers):
    x = mx.sym.var("data")
    for i in range(layers):
        x = mx.sym.Convolution(x, kernel=(3, 3), pad=(1, 1), num_filter=16, name=f"c{i}")
        x = mx.sym.relu(x, name=f"r{i}")
    return x


def test_calibration_never_holds_every_intermediate(monkeypatch):
    """A 12-layer network whose 24 calibrated intermediates take 1 MB each:
    the executor calibration binds plans at most 3 MB (MXNet reuses the
    memory of a tensor once read); one holding them all would plan 24 MB."""
    shape = (4, 16, 64, 64)  # float32: 1 MB a tensor
    sym = deep_net(12)
    arg_params, aux_params = nets.random_params(sym, shape)
    names = list(calibrate.tensor_names(sym, ["data"]))
    assert len(names) == 25
    planned = []
    bind = mx.sym.Symbol.simple_bind

    def recorded(*args, **kwargs):
        exe = bind(*args, **kwargs)
        planned.append(int(re.search(r"Total (\d+) MB allocated", exe.debug_str()).group(1)))
        return exe
    monkeypatch.setattr(mx.sym.Symbol, "simple_bind", recorded)
    rng = np.random.RandomState(0)
    calib = [mx.nd.array(rng.normal(0, 1, shape)) for _ in range(2)]
    stats = calibrate.collect(sym, arg_params, aux_params, names, calib, ["data"], "entropy")
    assert len(stats) == 25 and len(planned) == 1
    assert planned[0] <= 3, planned


def shared_input_net():
    """Inputs read by several nodes, in an order unlike their creation's."""
    a, b, w = mx.sym.var("a"), mx.sym.var("b"), mx.sym.var("w")
    x = mx.sym.FullyConnected(b, weight=w, num_hidden=4, no_bias=True, name="fc1")
    y = mx.sym.FullyConnected(a, weight=w, num_hidden=4, no_bias=True, name="fc2")
    return mx.sym.Group([mx.sym.BatchNorm(y + x, name="bn"), x * a])


@pytest.mark.parametrize("build", [nets.small_net, shared_input_net, lambda: deep_net(3)])
def test_input_names_are_list_inputs_without_a_symbol(build):
    sym = build()
    assert mxamp.graph.input_names(mxamp.graph.graph_json(sym)) == sym.list_inputs()


def test_a_marked_graph_is_a_copy():
    sym = nets.small_net()
    before = sym.tojson()
    graph = mxamp.graph.Graph(sym)
    names = [n["name"] for n in graph.nodes]
    marked = graph.marked({names.index("data"): {"__x__": "1"},
                           names.index("bn1"): {"__x__": "2"}})
    assert sym.tojson() == before and mxamp.graph.graph_json(graph.symbol) == graph.json
    assert mxamp.graph.graph_json(marked.symbol) == marked.json  # symbol and JSON agree
    assert marked.symbol.attr_dict()["data"]["__x__"] == "1"
    assert marked.symbol.attr_dict()["bn1"]["__x__"] == "2"
    assert sum("__x__" in n.get("attrs", {}) for n in marked.nodes) == 2
    assert graph.outputs()["bn1_output"] == names.index("bn1")
    assert graph.outputs()["data"] == names.index("data")


def test_a_batch_runs_in_slices_of_the_same_statistics(monkeypatch):
    """With rows=3, batches of 4 run as 2 + 2 examples (one executor shape);
    the ranges equal those of whole batches (to float32 summation order).
    Entropy thresholds move a little: the histogram's range grows from a
    smaller first slice, so its bins may be a third as wide, and on 12
    examples the divergence's minimum is flat (up to 7% here)."""
    sym = nets.small_net()
    arg_params, aux_params = nets.random_params(sym, SHAPE)
    names = list(calibrate.tensor_names(sym, ["data"]))
    binds = []
    bind = mx.sym.Symbol.simple_bind
    monkeypatch.setattr(mx.sym.Symbol, "simple_bind",
                        lambda *a, **k: binds.append(k.get("data")) or bind(*a, **k))
    found = {}
    for rows in (4, 3):
        for mode in calibrate.MODES:
            tool = calibrate.Collector(sym, arg_params, aux_params, names, ["data"], mode,
                                       rows=rows)
            assert tool.run(batches()) == 12
            found[rows, mode] = tool.stats()
    assert binds == [SHAPE] * 2 + [(2,) + SHAPE[1:]] * 2
    # Equal but for float32 summation order: a 2-row slice may take another GEMM
    # blocking than 4 rows (seen under DNNL_MAX_CPU_ISA=AVX2: 1 ulp in fc_output).
    assert found[3, "naive"].keys() == found[4, "naive"].keys()
    for name, whole in found[4, "naive"].items():
        sliced = found[3, "naive"][name]
        assert sliced.signed == whole.signed, name
        for field in ("min", "max", "threshold"):
            assert getattr(sliced, field) == pytest.approx(getattr(whole, field), rel=1e-6), name
    for name, whole in found[4, "entropy"].items():
        assert found[3, "entropy"][name].threshold == pytest.approx(whole.threshold,
                                                                    rel=0.1), name


@pytest.mark.parametrize("rows", [0, 2.0, True])
def test_rows_must_be_a_positive_int(rows):
    sym = nets.small_net()
    with pytest.raises(mxamp.errors.OptionError, match=f"rows must be an int >= 1, got {rows}"):
        calibrate.Collector(sym, *nets.random_params(sym, SHAPE), ["fc_output"], rows=rows)
