"""Converting for the oneDNN backend: the nodes the backend takes run in what
it computes, whatever MXNet's own kernels for them cost.

MobileNet v2's 35 clips (ReLU6) have a slow bfloat16 kernel in MXNet 1.9.1:
converted for MXNet's kernels they stay float32 and split the backend into
36 regions. Planned for the backend, the model is one region."""
import json
import logging

import mxnet as mx
import numpy as np
import pytest

import mxamp
from graphs import structure
from isa import needs
from mxamp import cpu
from mxamp.backends import onednn
from mxamp.convert import probe
from mxamp.errors import OptionError
from mxamp.gluon import apply_backend_block, model_of
from mxamp.graph import CAST_OPS

SHAPE = (1, 3, 64, 64)
BF16_RTOL = 0.05  # relative L2 error against float32 of a random-weight network in bfloat16


@pytest.fixture
def every_kernel_slow(monkeypatch):
    """MXNet's low-precision kernels all 10x slower than float32: what the
    backend takes must not depend on them."""
    monkeypatch.setattr(probe, "slowdown", lambda *question, measure=False: 2 * probe.SLOWER)


@pytest.fixture(scope="module")
def mobilenet():
    from gluoncv import model_zoo
    net = model_zoo.get_model("mobilenetv2_1.0", pretrained=False)
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.hybridize()
    x = mx.nd.random.uniform(shape=SHAPE, ctx=mx.cpu())
    return net, x, net(x).asnumpy()


def nodes_outside(sym):
    return [n["op"] for n in json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
            if n["op"] not in ("null", onednn.REGION_OP)]


def relative_error(got, ref):
    return float(np.linalg.norm(mxamp.dtypes.as_numpy(got) - ref) / np.linalg.norm(ref))


def region_casts(sym):
    return sorted(n["attrs"]["dtype"] for node in json.loads(sym.tojson())["nodes"]
                  if node["op"] == onednn.REGION_OP
                  for n in node["subgraphs"][0]["nodes"] if n["op"] == "amp_cast")


@pytest.mark.cpu
def test_mobilenet_planned_for_the_backend_is_one_region(mobilenet, every_kernel_slow, caplog):
    net, x, ref = mobilenet
    block = mxamp.convert_hybrid_block(net, target_dtype="bfloat16", backend="onednn")
    out = block(x)
    sym = block._cached_graph[1]
    assert len(onednn.regions(sym)) == 1
    assert nodes_outside(sym) == []
    if cpu.features("onednn").bf16:
        assert "bfloat16" in region_casts(sym)
        assert relative_error(out, ref) < BF16_RTOL
    else:  # the backend's float32 regions hold the float32 model
        assert region_casts(sym) == []
        assert "oneDNN 3 has no bfloat16 instructions on this CPU" in caplog.text
        assert relative_error(out, ref) < 1e-5


@pytest.mark.cpu
def test_converted_for_mxnet_the_slow_clips_split_the_backend(mobilenet, every_kernel_slow):
    """The same model converted for MXNet's kernels, then partitioned as it
    is: the clips stay float32 outside the regions."""
    if not cpu.features("onednn").bf16:
        pytest.skip("no bfloat16 regions without bfloat16 in oneDNN 3")
    net, _, _ = mobilenet
    converted = mxamp.convert_hybrid_block(net, target_dtype="bfloat16")
    sym, args, aux, _ = model_of(converted, "partitioning it")
    out = onednn.apply_backend(sym, args, aux)[0]
    assert nodes_outside(out).count("clip") == 35
    assert len(onednn.regions(out)) >= 36  # split by the clips (and more: all kernels slow)


@pytest.mark.cpu
def test_apply_backend_block_plans_a_converted_block_again(mobilenet, every_kernel_slow):
    """The documented path, convert_hybrid_block then apply_backend_block,
    gives the planned model."""
    net, x, ref = mobilenet
    converted = mxamp.convert_hybrid_block(net, target_dtype="bfloat16")
    block = apply_backend_block(converted)
    planned = mxamp.convert_hybrid_block(net, target_dtype="bfloat16", backend="onednn")
    block(x)
    planned(x)
    assert block._cached_graph[1].tojson(remove_amp_cast=False) == \
        planned._cached_graph[1].tojson(remove_amp_cast=False)


def test_convert_model_plans_for_the_backend(every_kernel_slow):
    """A Dense -> clip -> Dense model: clip runs in the backend's region."""
    data = mx.sym.var("data")
    fc1 = mx.sym.FullyConnected(data, num_hidden=8, name="fc1")
    sym = mx.sym.FullyConnected(mx.sym.clip(fc1, 0, 6, name="relu6"), num_hidden=4, name="fc2")
    args = {"fc1_weight": mx.nd.ones((8, 8)) / 8, "fc1_bias": mx.nd.zeros((8,)),
            "fc2_weight": mx.nd.ones((4, 8)) / 8, "fc2_bias": mx.nd.zeros((4,))}
    out, out_args, _ = mxamp.convert_model(sym, args, {}, target_dtype="bfloat16",
                                           backend="onednn")
    assert len(onednn.regions(out)) == 1 and nodes_outside(out) == []
    assert args["fc1_weight"].dtype == np.float32  # the caller's dicts are untouched
    if cpu.mxnet_has_bfloat16():  # for MXNet's kernels the clip stays float32
        without = mxamp.convert_model(sym, args, {}, target_dtype="bfloat16", ctx=mx.cpu())[0]
        assert structure(without)[1]["relu6"] == (("amp_cast", "float32", ("fc1", 0)),)


def test_the_backend_runs_bfloat16_models_only():
    data = mx.sym.var("data")
    sym = mx.sym.FullyConnected(data, num_hidden=4, name="fc")
    args = {"fc_weight": mx.nd.ones((4, 4)), "fc_bias": mx.nd.zeros((4,))}
    with pytest.raises(OptionError, match="backend 'onednn' runs bfloat16 models; got "
                                          "target_dtype='float16'"):
        mxamp.convert_model(sym, args, {}, target_dtype="float16", backend="onednn")


def attention():
    """One self-attention block with its residual and LayerNorm: operators
    the default bfloat16 lists keep float32 (Reshape, transpose, scalar
    arithmetic, softmax, LayerNorm) that the backend computes from bfloat16."""
    data = mx.sym.var("data")  # (batch, 8, 16)
    qkv = mx.sym.FullyConnected(data, num_hidden=16, flatten=False, name="proj")
    heads = mx.sym.transpose(mx.sym.Reshape(qkv, shape=(0, 0, 2, 8), name="split"),
                             axes=(0, 2, 1, 3), name="heads")
    flat = mx.sym.Reshape(heads, shape=(-1, 8, 8), name="flat")
    scores = mx.sym.softmax(mx.sym.batch_dot(flat, flat, transpose_b=True, name="qk") * 0.35,
                            axis=-1, name="attn")
    mixed = mx.sym.Reshape(mx.sym.batch_dot(scores, flat, name="av"), shape=(-1, 2, 8, 8),
                           name="unflat")
    merged = mx.sym.Reshape(mx.sym.transpose(mixed, axes=(0, 2, 1, 3), name="merge"),
                            shape=(0, 0, 16), name="concat")
    out = mx.sym.FullyConnected(merged, num_hidden=16, flatten=False, name="out")
    return mx.sym.LayerNorm(out + data, name="norm")


def attention_params():
    rs = np.random.RandomState(0)
    args = {n: mx.nd.array(rs.normal(0, 0.25, s)) for n, s in
            (("proj_weight", (16, 16)), ("proj_bias", (16,)), ("out_weight", (16, 16)),
             ("out_bias", (16,)))}
    args.update(norm_gamma=mx.nd.ones((16,)), norm_beta=mx.nd.zeros((16,)))
    return args


@pytest.mark.cpu
def test_what_the_backend_computes_in_bfloat16_is_converted_so():
    """Default float32 operators the backend runs become bfloat16 (one
    region, nothing on MXNet); the caller's own float32 list and excluded
    names still hold (those nodes stay on MXNet, in float32)."""
    if not cpu.features("onednn").bf16:
        pytest.skip("no bfloat16 regions without bfloat16 in oneDNN 3")
    sym, args = attention(), attention_params()
    x = {"data": mx.nd.random.uniform(-1, 1, shape=(2, 8, 16))}
    ref = sym.bind(mx.cpu(), {**args, **x}).forward()[0].asnumpy()
    out, out_args, _ = mxamp.convert_model(sym, args, {}, target_dtype="bfloat16",
                                           backend="onednn")
    assert len(onednn.regions(out)) == 1 and nodes_outside(out) == []
    got = out.bind(mx.cpu(), {**out_args, **x}).forward()[0]
    assert relative_error(got, ref) < BF16_RTOL
    # LayerNorm, which the backend computes in float32 (f32_in_bf16), stays
    # float32: its data is cast to float32 inside the region.
    assert onednn.operator_table()["LayerNorm"].f32_in_bf16
    (region,) = [n for n in json.loads(out.tojson())["nodes"] if n["op"] == onednn.REGION_OP]
    inner = region["subgraphs"][0]["nodes"]
    (norm,) = [n for n in inner if n["op"] == "LayerNorm"]
    cast = inner[norm["inputs"][0][0]]
    assert (cast["op"], cast["attrs"]["dtype"]) == ("amp_cast", "float32")
    kept = mxamp.convert_model(sym, args, {}, target_dtype="bfloat16", backend="onednn",
                               fp32_ops=["transpose"], excluded_sym_names=["qk"])[0]
    # +1 Reshape: between the float32 transpose and batch_dot, alone it computes
    # nothing, so the backend leaves it to MXNet.
    assert sorted(op for op in nodes_outside(kept) if op not in CAST_OPS) == \
        ["Reshape", "batch_dot", "transpose", "transpose"]


def small_net():
    """A convolution, BatchNorm, ReLU, pooling and Dense head that has run
    forward once, its input and float32 output."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Conv2D(8, 3, padding=1), mx.gluon.nn.BatchNorm(),
            mx.gluon.nn.Activation("relu"), mx.gluon.nn.GlobalAvgPool2D(), mx.gluon.nn.Dense(4))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    x = mx.nd.random.uniform(shape=(1, 3, 8, 8))
    return net, x, net(x).asnumpy()


def region_computes(sym):
    """The compute type each region node of `sym` (a Symbol or its JSON) records."""
    graph = sym if isinstance(sym, dict) else json.loads(sym.tojson())
    return [n["attrs"]["compute"] for n in graph["nodes"] if n["op"] == onednn.REGION_OP]


# The ways to ask for bfloat16 on the backend, each from the block it takes.
BFLOAT16_ON_THE_BACKEND = {
    "convert_hybrid_block(backend)": (
        lambda net, x: net,
        lambda block: mxamp.convert_hybrid_block(block, target_dtype="bfloat16",
                                                 backend="onednn")),
    "apply_backend_block(converted)": (
        lambda net, x: converted_for_mxnet(net, x),
        apply_backend_block),
    "apply_backend_block(float32)": (lambda net, x: net, apply_backend_block),
}


def converted_for_mxnet(net, x):
    block = mxamp.convert_hybrid_block(net, target_dtype="bfloat16")
    block(x)
    return block


@pytest.fixture(params=[0.5, 2.4], ids=["bf16 faster", "bf16 slower"])
def bf16_slowdown(request, monkeypatch):
    """This CPU's bfloat16 dot products as measured: twice float32's speed
    (AMD Zen 4) or 2.4x its time (an Intel Xeon without AMX), for a CPU the
    shipped data does not hold."""
    monkeypatch.setattr(onednn, "speed_data", lambda: {"cpus": {}})
    monkeypatch.setattr(onednn, "_measured",
                        lambda: onednn.Bf16Speed(request.param, "measured here"))
    return request.param


def slower_line(slowdown):
    """The start of the one WARNING saying bfloat16 regions compute in float32."""
    return (f"oneDNN backend: bfloat16 dot products take {slowdown:.2f}x the time of float32 "
            f"ones on this CPU ({cpu.model()}; measured here), so regions planned in bfloat16 "
            f"compute in float32 ")


@pytest.mark.cpu
@pytest.mark.parametrize("way", sorted(BFLOAT16_ON_THE_BACKEND))
def test_bfloat16_regions_only_where_onednn_has_bfloat16(way, bf16_slowdown, caplog):
    """On a CPU whose oneDNN 3 has no bfloat16 instructions (CI's
    AVX2 and AVX512_CORE_VNNI reruns) no region computes in bfloat16, the
    output is float32's, and the call logs one WARNING saying why (whatever
    a measurement would say); where oneDNN has them the regions compute in
    bfloat16 and nothing warns, unless its bfloat16 dot products are slower
    than float32's: then they compute in float32 (recorded on the region
    node), the output is float32's, and one WARNING gives the rate."""
    net, x, ref = small_net()
    source, ask = BFLOAT16_ON_THE_BACKEND[way]
    block = source(net, x)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        fast = ask(block)
        out = fast(x)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    computes = region_computes(fast._cached_graph[1])
    if cpu.features("onednn").bf16 and bf16_slowdown < 1:
        assert computes == ["bfloat16"] and warnings == []
        assert relative_error(out, ref) < BF16_RTOL
    elif cpu.features("onednn").bf16:
        assert computes == ["float32"]
        assert len(warnings) == 1 and warnings[0].startswith(slower_line(bf16_slowdown)), warnings
        assert warnings[0].endswith("compute='bfloat16' keeps bfloat16")
        # float32 weights (cast in the graph, a no-op in a float32 region): float32's output
        assert relative_error(out, ref) < 1e-5
    else:
        assert "bfloat16" not in computes
        assert len(warnings) == 1, warnings
        assert warnings[0].startswith(f"oneDNN 3 has no bfloat16 instructions on this CPU "
                                      f"({cpu.describe()}; AVX512-BF16 or AMX needed): ")
        assert relative_error(out, ref) < 1e-5


@needs("bf16")
@pytest.mark.parametrize("way", ["apply_backend_block(converted)", "apply_backend_block(float32)"])
def test_compute_bfloat16_keeps_bfloat16_where_it_is_slower(way, monkeypatch, caplog):
    """compute='bfloat16' asks for bfloat16 regions whatever this CPU's
    bfloat16 dot products cost (the default's speed rule does not
    apply): no measurement is asked for, nothing warns."""
    monkeypatch.setattr(onednn, "bf16_speed", lambda measure=False: pytest.fail("asked"))
    net, x, ref = small_net()
    block = BFLOAT16_ON_THE_BACKEND[way][0](net, x)
    with caplog.at_level(logging.WARNING):
        fast = apply_backend_block(block, compute="bfloat16")
        out = fast(x)
    assert region_computes(fast._cached_graph[1]) == ["bfloat16"]
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert 1e-5 < relative_error(out, ref) < BF16_RTOL  # bfloat16's error, not float32's


@needs("bf16")
def test_where_bfloat16_is_slower_only_the_regions_compute_type_changes(monkeypatch):
    """The graph converted for the backend is the same whichever type its
    regions compute in (the conversion plans bfloat16 either way): the two
    partitioned graphs differ only in the region node's compute attribute."""
    net, x, _ = small_net()
    graphs = {}
    for slowdown in (0.5, 2.4):
        monkeypatch.setattr(onednn, "bf16_speed",
                            lambda measure=False, s=slowdown: onednn.Bf16Speed(s, "test"))
        fast = mxamp.convert_hybrid_block(net, target_dtype="bfloat16", backend="onednn")
        graphs[slowdown] = json.loads(fast._cached_graph[1].tojson(remove_amp_cast=False))
    assert region_computes(graphs[0.5]) == ["bfloat16"]
    assert region_computes(graphs[2.4]) == ["float32"]
    for graph in graphs.values():
        for node in graph["nodes"]:
            node.get("attrs", {}).pop("compute", None)
    assert graphs[0.5] == graphs[2.4]


@pytest.mark.parametrize("options, message", [
    (dict(backend="onednn", backend_compute="int8"),
     r"backend_compute must be one of \(None, 'bfloat16', 'float32'\), got 'int8'"),
    (dict(backend_compute="float32"),
     r"backend_compute is what a backend's regions compute in: it needs backend='onednn'"),
])
def test_backend_compute_checked(options, message):
    net, _, _ = small_net()
    with pytest.raises(OptionError, match=message):
        mxamp.convert_hybrid_block(net, target_dtype="bfloat16", **options)


def test_float32_regions_keep_the_models_own_nodes_float32_and_warn_of_nothing(recwarn):
    """Regions computing in float32 keep the nodes they take float32: those
    of the model, not the nodes partitioning adds to a region (the splits of
    its packed weights), which the model's graph does not have."""
    net, x, expected = small_net()
    sym, arg_params, aux_params, _ = model_of(net, "testing")
    part = onednn.apply_backend(sym, arg_params, aux_params, compute="float32")[0]
    own = {n["name"] for n in json.loads(sym.tojson())["nodes"]}
    added = {n["name"] for node in json.loads(part.tojson())["nodes"]
             if node["op"] == onednn.REGION_OP
             for n in node["subgraphs"][0]["nodes"] if n["op"] != "null"} - own
    assert added  # what a plan must not take for the model's nodes
    fast = mxamp.convert_hybrid_block(net, target_dtype="bfloat16", backend="onednn",
                                      backend_compute="float32")
    assert [str(w.message) for w in recwarn] == []
    assert region_computes(fast._cached_graph[1]) == ["float32"]
    np.testing.assert_allclose(fast(x).asnumpy(), expected, rtol=1e-4, atol=1e-5)
