"""The oneDNN 3 bfloat16 backend: what it offloads, numerics against float32,
fallbacks to MXNet, export/reload and its errors, and convolutions computing
only the rows and columns their readers read (float regions).

Regions compute in bfloat16 (on CPUs with AVX512-BF16/AMX) or float32 (any
x86 CPU; the same oneDNN chains, so the graph handling is checked tightly
everywhere). Outputs are compared with MXNet's float32 with
|got - ref| <= tol * max|ref|: bfloat16 keeps 8 significant bits, so tol is
3e-2 for single ops and small regions and 6e-2 for whole networks, where
rounding accumulates over many layers; float32 differs from MXNet only in
summation order and BatchNorm folding, tol 1e-4.
"""
import collections
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import mxnet as mx

import mxamp
import mxamp.backends
import mxamp.gluon
import onednn_verbose as verbose
from isa import needs, require_onednn3
from mxamp import cpu, native as _lib
from mxamp.backends.onednn import THREAD_VARIABLES
from mxamp.errors import BackendError

require_onednn3()


@pytest.fixture(scope="module")
def onednn():
    """The backend module, looked up when the first test here runs: that loads
    its library, which registers its region operator with MXNet (the
    operator-list coverage test must not see it)."""
    return mxamp.backends.get("onednn")


RTOL = {"bfloat16": 3e-2, "float32": 1e-4}
NET_RTOL = {"bfloat16": 6e-2, "float32": 1e-4}


@pytest.fixture(params=["float32", pytest.param("bfloat16", marks=needs("bf16"))])
def compute(request):
    """The data type the regions compute in."""
    return request.param


def _params(sym, shapes, seed=0):
    """Random arguments and auxiliary states (positive variances) for sym."""
    rs = np.random.RandomState(seed)
    arg_shapes, _, aux_shapes = sym.infer_shape(**shapes)
    args = {n: mx.nd.array(rs.uniform(-0.5, 0.5, s))
            for n, s in zip(sym.list_arguments(), arg_shapes) if n not in shapes}
    aux = {n: mx.nd.array(rs.uniform(0.5, 1.5, s))
           for n, s in zip(sym.list_auxiliary_states(), aux_shapes)}
    data = {n: mx.nd.array(rs.uniform(-1, 1, s)) for n, s in shapes.items()}
    return args, aux, data


def _run(sym, args, aux, data):
    ex = sym.bind(mx.cpu(), {**args, **data}, aux_states={k: v.copy() for k, v in aux.items()},
                  grad_req="null")
    return [o.asnumpy() for o in ex.forward(is_train=False)]


def _close(got, ref, rtol):
    scale = max(float(np.abs(ref).max()), 1e-6)
    err = float(np.abs(got.astype(np.float32) - ref).max())
    assert err <= rtol * scale, f"max error {err} > {rtol} * {scale}"


D = mx.sym.var("data")


def _conv(x, name, **kw):
    return mx.sym.Convolution(x, kernel=(3, 3), pad=(1, 1), num_filter=8, name=name, **kw)


def _bn(x, name):
    return mx.sym.BatchNorm(x, fix_gamma=False, eps=1e-5, name=name)


# name -> (symbol, data shape, ops the backend region holds, sorted)
CASES = {
    "conv_bn_relu": (
        mx.sym.Activation(_bn(_conv(D, "c"), "bn"), act_type="relu"), (2, 4, 9, 9),
        ["Activation", "BatchNorm", "Convolution"]),
    "conv_stride_dilate_group_nobias": (
        _conv(D, "c", stride=(2, 2), dilate=(2, 2), num_group=2, no_bias=True), (2, 4, 11, 11),
        ["Convolution"]),
    "residual_add_relu": (
        mx.sym.Activation(mx.sym.elemwise_add(_bn(_conv(_conv(D, "c1"), "c2"), "bn"),
                                              _conv(D, "c3")), act_type="relu"),
        (2, 4, 8, 8), ["Activation", "BatchNorm", "Convolution", "Convolution", "Convolution",
                       "elemwise_add"]),
    "pooling_max_avg_global": (
        mx.sym.elemwise_add(
            mx.sym.Pooling(mx.sym.Pooling(_conv(D, "c"), kernel=(3, 3), stride=(2, 2),
                                          pad=(1, 1), pool_type="max"),
                           kernel=(2, 2), pool_type="avg", global_pool=True),
            mx.sym.Pooling(mx.sym.Pooling(_conv(D, "c2"), kernel=(3, 3), stride=(2, 2),
                                          pool_type="avg", count_include_pad=False,
                                          pooling_convention="full", pad=(1, 1)),
                           kernel=(2, 2), pool_type="max", global_pool=True)),
        (2, 4, 9, 9), ["Convolution", "Convolution", "Pooling", "Pooling", "Pooling", "Pooling",
                       "elemwise_add"]),
    "flatten_fc_activations": (
        mx.sym.clip(mx.sym.Activation(mx.sym.FullyConnected(
            mx.sym.Flatten(mx.sym.Activation(_conv(D, "c"), act_type="sigmoid")),
            num_hidden=10, name="fc"), act_type="tanh"), 0, 0.5),
        (2, 4, 5, 5), ["Activation", "Activation", "Convolution", "Flatten", "FullyConnected",
                       "clip"]),
    "layernorm_softmax": (
        mx.sym.softmax(mx.sym.LayerNorm(mx.sym.FullyConnected(
            D, num_hidden=16, flatten=False, name="fc"), name="ln")),
        (2, 3, 8), ["FullyConnected", "LayerNorm", "softmax"]),
    "attention_batch_dot": (
        mx.sym.batch_dot(mx.sym.softmax(mx.sym.batch_dot(
            mx.sym.FullyConnected(D, num_hidden=8, flatten=False, name="q"),
            mx.sym.FullyConnected(D, num_hidden=8, flatten=False, name="k"),
            transpose_b=True) / 4), D * 0.5),
        (2, 5, 8), ["FullyConnected", "FullyConnected", "_div_scalar", "_mul_scalar",
                    "batch_dot", "batch_dot", "softmax"]),
    "attention_heads_reshape_transpose": (
        mx.sym.reshape(mx.sym.transpose(mx.sym.reshape(
            mx.sym.FullyConnected(D, num_hidden=8, flatten=False, name="fc"),
            shape=(0, 0, 2, -1)), axes=(0, 2, 1, 3)), shape=(-1, 5, 4)) * 2,
        (3, 5, 8), ["FullyConnected", "Reshape", "Reshape", "_mul_scalar", "transpose"]),
    "batch_dot_transpose_a": (
        mx.sym.batch_dot(mx.sym.Activation(D, act_type="relu"), D, transpose_a=True),
        (2, 4, 3), ["Activation", "batch_dot"]),
    "fc_3d_gelu_residual": (
        mx.sym.elemwise_add(mx.sym.LeakyReLU(mx.sym.FullyConnected(
            D, num_hidden=16, flatten=False, name="fc"), act_type="gelu"), D),
        (2, 3, 16), ["FullyConnected", "LeakyReLU", "elemwise_add"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_region_matches_float32(case, compute, onednn):
    sym, shape, ops = CASES[case]
    args, aux, data = _params(sym, {"data": shape})
    ref = _run(sym, args, aux, data)[0]
    out, out_args, out_aux = onednn.apply_backend(sym, args, aux, compute=compute)
    assert onednn.regions(out) == [ops]
    got = _run(out, out_args, out_aux, data)[0]
    assert got.dtype == np.float32 and got.shape == ref.shape
    _close(got, ref, RTOL[compute])


def _resblock(x, name):
    y = mx.sym.Activation(_bn(_conv(x, name + "c1"), name + "bn1"), act_type="relu")
    return mx.sym.Activation(_bn(_conv(y, name + "c2"), name + "bn2") + x, act_type="relu")


def _symbol_block(sym, args, aux):
    """A hybridized SymbolBlock of sym holding copies of args and aux."""
    block = mx.gluon.SymbolBlock(sym, [mx.sym.var("data")])
    block.collect_params().load_dict({**{f"arg:{k}": v.copy() for k, v in args.items()},
                                      **{f"aux:{k}": v.copy() for k, v in aux.items()}})
    block.hybridize()
    return block


def _small_resnet():
    x = mx.sym.Activation(_bn(_conv(D, "stem"), "stembn"), act_type="relu")
    x = _resblock(_resblock(x, "b1"), "b2")
    x = mx.sym.Pooling(x, kernel=(1, 1), global_pool=True, pool_type="avg")
    return mx.sym.FullyConnected(mx.sym.Flatten(x), num_hidden=10, name="fc")


@pytest.mark.parametrize("cast_optional_params", [False, True])
def test_converted_model_runs_as_one_region(cast_optional_params, compute, onednn):
    """A bfloat16-converted model (casts absorbed, bfloat16 parameters kept
    as exact float32 copies for the region) matches float32 within bfloat16
    tolerance (the conversion may round parameters); the caller's symbol and
    dicts are untouched."""
    sym = _small_resnet()
    args, aux, data = _params(sym, {"data": (2, 8, 8, 8)})
    ref = _run(sym, args, aux, data)[0]
    conv = mxamp.convert_model(sym, args, aux, target_dtype="bfloat16",
                               cast_optional_params=cast_optional_params)
    before = (conv[0].tojson(remove_amp_cast=False), dict(conv[1]), dict(conv[2]))
    out, out_args, out_aux = onednn.apply_backend(*conv, compute=compute)
    assert before == (conv[0].tojson(remove_amp_cast=False), conv[1], conv[2])
    (region,) = onednn.regions(out)
    assert region.count("Convolution") == 5 and region.count("BatchNorm") == 5
    assert "amp_cast" in region
    assert all(v.dtype == np.float32 for v in {**out_args, **out_aux}.values())
    assert [n["op"] for n in json.loads(out.tojson(remove_amp_cast=False))["nodes"]
            if n["op"] != "null"] == [onednn.REGION_OP]
    _close(_run(out, out_args, out_aux, data)[0], ref, RTOL["bfloat16"])


def test_bfloat16_edges_get_casts_around_regions(compute, onednn):
    """An operator MXNet runs in bfloat16 between two regions (Concat): the
    regions read and write float32 and casts restore bfloat16 around them."""
    a = mx.sym.Activation(_conv(D, "c1"), act_type="relu")
    b = mx.sym.Activation(_conv(D, "c2"), act_type="relu")
    sym = mx.sym.FullyConnected(mx.sym.concat(a, b, dim=1), num_hidden=4, name="fc")
    args, aux, data = _params(sym, {"data": (2, 4, 6, 6)})
    ref = _run(sym, args, aux, data)[0]
    out, out_args, out_aux = onednn.apply_backend(
        *mxamp.convert_model(sym, args, aux, target_dtype="bfloat16"), compute=compute)
    assert [[op for op in r if op != "amp_cast"] for r in onednn.regions(out)] == [
        ["Activation", "Activation", "Convolution", "Convolution"], ["FullyConnected"]]
    outer = [(n["op"], n.get("attrs", {}).get("dtype"))
             for n in json.loads(out.tojson(remove_amp_cast=False))["nodes"] if n["op"] != "null"]
    assert outer == [(onednn.REGION_OP, None), ("amp_cast", "bfloat16"), ("amp_cast", "bfloat16"),
                     ("Concat", None), ("amp_cast", "float32"), (onednn.REGION_OP, None)]
    _, out_types, _ = out.infer_type(data="float32", **{k: v.dtype for k, v in out_args.items()})
    assert out_types == [np.float32]
    _close(_run(out, out_args, out_aux, data)[0], ref, RTOL["bfloat16"])


def test_region_reads_the_float32_cast_the_conversion_made(compute, onednn):
    """A bfloat16 Concat read by a region and, through the conversion's own
    float32 cast, by softmax: the region reads that cast too (one cast per
    entry and dtype, so no second cast of the same name); every cast is
    named <entry>_amp_cast_<dtype> (<node>_<output> past the first output)."""
    a = mx.sym.Activation(_conv(D, "c1"), act_type="relu")
    b = mx.sym.Activation(_conv(D, "c2"), act_type="relu")
    cat = mx.sym.concat(a, b, dim=1, name="cat")
    sym = mx.sym.Group([mx.sym.FullyConnected(cat, num_hidden=4, name="fc"),
                        mx.sym.softmax(cat, axis=1, name="sm")])
    args, aux, data = _params(sym, {"data": (2, 4, 6, 6)})
    refs = _run(sym, args, aux, data)
    out, out_args, out_aux = onednn.apply_backend(
        *mxamp.convert_model(sym, args, aux, target_dtype="bfloat16"), compute=compute)
    nodes = json.loads(out.tojson(remove_amp_cast=False))["nodes"]
    region = [n["name"] for n in nodes if n["op"] == onednn.REGION_OP]
    assert [(n["op"], n["name"]) for n in nodes if n["op"] != "null"] == [
        (onednn.REGION_OP, region[0]), ("amp_cast", f"{region[0]}_amp_cast_bfloat16"),
        ("amp_cast", f"{region[0]}_1_amp_cast_bfloat16"), ("Concat", "cat"),
        ("amp_cast", "cat_amp_cast_float32"), (onednn.REGION_OP, region[1]), ("softmax", "sm")]
    (cast,) = [i for i, n in enumerate(nodes) if n["name"] == "cat_amp_cast_float32"]
    readers = [n["name"] for n in nodes if [cast, 0, 0] in n["inputs"]]
    assert readers == [region[1], "sm"]
    for got, ref in zip(_run(out, out_args, out_aux, data), refs):
        _close(got, ref, RTOL["bfloat16"])


def test_casts_left_on_mxnet_that_copy_their_input_are_skipped(compute, onednn):
    """BERT's embedding: the conversion puts an amp_multicast of two float32
    entries (Embedding's output and the position table) before the
    broadcast_add, as the reference does. Both stay on MXNet, where that
    multicast would copy both on every call: the broadcast_add reads them
    directly. A graph output that is such a cast keeps it (and its name), and
    so does a cast of a data input (the caller may feed another type)."""
    tokens, position = mx.sym.var("tokens"), mx.sym.var("position")
    added = mx.sym.broadcast_add(mx.sym.Embedding(tokens, input_dim=20, output_dim=8, name="embed"),
                                 position, name="add")
    fc = mx.sym.FullyConnected(added, num_hidden=4, flatten=False, name="fc")
    island = mx.sym.sin(mx.sym.amp_cast(tokens, dtype="float32", name="tokens32"), name="island")
    sym = mx.sym.Group([fc, mx.sym.amp_multicast(position, position, num_outputs=2,
                                                 name="out")[0], island])
    args, aux, data = _params(sym, {"tokens": (2, 3), "position": (1, 3, 8)})
    args["position"] = data.pop("position")
    data["tokens"] = mx.nd.array([[1, 5, 19], [0, 7, 3]])
    refs = _run(sym, args, aux, data)
    conv = mxamp.convert_model(sym, args, aux, target_dtype="bfloat16")
    converted = json.loads(conv[0].tojson(remove_amp_cast=False))["nodes"]
    assert ("amp_multicast", "add_amp_multicast") in [(n["op"], n["name"]) for n in converted]
    out, out_args, out_aux = onednn.apply_backend(*conv, compute=compute)
    nodes = json.loads(out.tojson(remove_amp_cast=False))["nodes"]
    assert [n["name"] for n in nodes if n["op"] not in ("null", onednn.REGION_OP)] == [
        "embed", "add", "out", "tokens32", "island"]
    (add,) = [n for n in nodes if n["name"] == "add"]
    assert [nodes[e[0]]["name"] for e in add["inputs"]] == ["embed", "position"]
    assert out.list_outputs()[1] == "out_output0"
    for got, ref in zip(_run(out, out_args, out_aux, data), refs):
        _close(got, ref, RTOL[compute])


def _zoo_net(name, shape):
    """A gluoncv model (random weights), an input, its float32 output and
    its bfloat16 conversion for this CPU."""
    from gluoncv.model_zoo import get_model
    net = get_model(name, pretrained=False)
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.hybridize()
    x = mx.nd.random.uniform(shape=shape)
    return x, net(x).asnumpy(), mxamp.convert_hybrid_block(net, target_dtype="bfloat16")


@pytest.mark.parametrize("name, convolutions", [("resnet18_v1", 20), ("resnet50_v1", 53)])
def test_resnet_converted_block_agrees_with_float32(name, convolutions, compute, onednn):
    """At 72x72 ResNet's stages have 18, 9, 5 and 3 rows: ResNet-50's last
    block of each stage computes every other (odd counts round up)."""
    x, ref, converted = _zoo_net(name, (4, 3, 72, 72))
    block = mxamp.gluon.apply_backend_block(converted, compute=compute)
    (region,) = onednn.regions(block._cached_graph[1])
    assert region.count("Convolution") == convolutions and region.count("FullyConnected") == 1
    got = block(x).asnumpy()
    _close(got, ref, NET_RTOL["bfloat16"])
    assert (got.argmax(1) == ref.argmax(1)).all()


def test_unsupported_configurations_stay_on_mxnet(compute, onednn):
    """1-d convolutions, lp pooling and a BatchNorm without a convolution to
    fold into are left to MXNet; the rest is offloaded."""
    x = mx.sym.Activation(_conv(_bn(D, "lonely_bn"), "c"), act_type="relu")
    x = mx.sym.Pooling(x, kernel=(2, 2), pool_type="lp", p_value=2)
    flat = mx.sym.reshape(x, shape=(0, 8, -1))
    sym = mx.sym.Convolution(flat, kernel=(3,), num_filter=4, name="conv1d")
    args, aux, data = _params(sym, {"data": (2, 4, 8, 8)})
    ref = _run(sym, args, aux, data)[0]
    out, out_args, out_aux = onednn.apply_backend(sym, args, aux, compute=compute)
    assert onednn.regions(out) == [["Activation", "Convolution"]]
    ops = [n["op"] for n in json.loads(out.tojson())["nodes"]]
    assert ops.count("Convolution") == 1 and "BatchNorm" in ops and "Pooling" in ops
    _close(_run(out, out_args, out_aux, data)[0], ref, RTOL[compute])


# A small convolution model (sym, args, x) for the scripts below.
PRELUDE = (
    "import json, numpy as np, mxnet as mx\n"
    "import mxamp.backends; onednn = mxamp.backends.get('onednn')\n"
    "from mxamp.errors import mxnet_message\n"
    "sym = mx.sym.Activation(mx.sym.Convolution(mx.sym.var('data'), kernel=(3, 3),\n"
    "                        num_filter=4, name='c'), act_type='relu')\n"
    "rs = np.random.RandomState(0)\n"
    "args = {'c_weight': mx.nd.array(rs.randn(4, 3, 3, 3)),\n"
    "        'c_bias': mx.nd.array(rs.randn(4))}\n"
    "x = mx.nd.array(rs.randn(2, 3, 6, 6))\n")


def _environment(**env):
    """A fresh Python's environment: mxamp's variables and `env`, one thread."""
    return {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HOME": str(Path.home()),
            **{k: v for k, v in os.environ.items() if k.startswith("MXAMP_")}, **env}


def _script(body, **env):
    """Runs `body` (after PRELUDE) in a fresh Python with extra environment
    `env`; returns its standard output as lines."""
    result = subprocess.run([sys.executable, "-c", PRELUDE + body], env=_environment(**env),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.parametrize("isa", ["AVX2", "AVX512_CORE"])
def test_cpu_without_bfloat16_keeps_everything_on_mxnet(isa):
    assert _script("""
out, out_args, _ = onednn.apply_backend(sym, args, {})
run = lambda s, a: s.bind(mx.cpu(), {**a, "data": x}).forward()[0].asnumpy()
print(json.dumps({"regions": onednn.regions(out),
                  "equal": bool((run(out, out_args) == run(sym, args)).all())}))
""", ONEDNN_MAX_CPU_ISA=isa)[-1] == json.dumps({"regions": [], "equal": True})


def test_bfloat16_region_on_cpu_without_bfloat16_is_a_clear_error():
    """A model saved with bfloat16 regions (here: a float32 region relabelled)
    run where the CPU has no bfloat16 instructions fails with a message."""
    message = _script("""
out, out_args, _ = onednn.apply_backend(sym, args, {}, compute="float32")
graph = json.loads(out.tojson())
for node in graph["nodes"]:
    if node["op"] == onednn.REGION_OP:
        node["attrs"]["compute"] = "bfloat16"
relabelled = mx.sym.load_json(json.dumps(graph))
try:
    relabelled.bind(mx.cpu(), {**out_args, "data": x}).forward()[0].asnumpy()
    print(json.dumps("ran"))
except mx.base.MXNetError as err:
    print(json.dumps(mxnet_message(err)))
""", ONEDNN_MAX_CPU_ISA="AVX2")[-1]
    assert json.loads(message) == (
        "mxamp_onednn region failed: this region computes in bfloat16 but the CPU (or "
        "ONEDNN_MAX_CPU_ISA) offers no AVX512-BF16/AMX; apply the backend to the model without "
        "regions on this machine")


def _third_call(setup):
    """The oneDNN primitives (ONEDNN_VERBOSE lines, split at commas) the
    third call of the executor `ex` that `setup` (after PRELUDE) binds
    runs: by then (MXNet bumps auxiliary states' versions on each call, the
    region then compares them by content) a call runs only the region's
    primitives."""
    script = PRELUDE + setup + "import onednn_verbose; onednn_verbose.call(ex, 3, 'third call')\n"
    return verbose.run(["-c", script], env=_environment())["third call"]


def _kinds(primitives):
    return dict(collections.Counter(verbose.kind(p) for p in primitives))


def test_weights_are_packed_once():
    """No weight reorders on a call, at most one reorder per region input
    and output."""
    counts = _kinds(_third_call("""
sym = mx.sym.BatchNorm(sym, fix_gamma=False, name="bn")
aux = {"bn_moving_mean": mx.nd.array(rs.randn(4)), "bn_moving_var": mx.nd.ones(4)}
args.update({"bn_gamma": mx.nd.ones(4), "bn_beta": mx.nd.zeros(4)})
out, out_args, out_aux = onednn.apply_backend(sym, args, aux, compute="float32")
ex = out.bind(mx.cpu(), {**out_args, "data": x}, aux_states=out_aux)
"""))
    assert counts["convolution"] == 1 and counts.get("reorder", 0) <= 2, counts
    assert set(counts) <= {"convolution", "reorder"}, counts


# An embedding sum (an add of two inputs) and its LayerNorm, then two
# post-norm transformer sublayers, FullyConnected, the residual add and
# LayerNorm (net, args, aux): the residual stream.
RESIDUAL = """
net = mx.sym.LayerNorm(mx.sym.var("data") + mx.sym.var("position"), name="ln_in")
for i in range(2):
    fc = mx.sym.FullyConnected(net, num_hidden=32, flatten=False, name="fc%d" % i)
    net = mx.sym.LayerNorm(fc + net, name="ln%d" % i)
shapes = net.infer_shape(data=(4, 8, 32))[0]
args = {n: mx.nd.array(rs.uniform(-1, 1, s)) for n, s in zip(net.list_arguments(), shapes)}
aux = {}
"""


@pytest.mark.cpu
@needs("bf16")
def test_bfloat16_regions_keep_the_residual_stream_float32(onednn):
    """In a bfloat16 region the operators whose row says f32_in_bf16
    (LayerNorm) write float32, and so does what they read: the add of two
    inputs, and each FullyConnected, reading bfloat16, summing into the
    residual (a sum post-op) in float32, as MXNet's own bfloat16 graph keeps
    the residual stream."""
    assert [op for op, row in onednn.operator_table().items() if row.f32_in_bf16] == \
        ["LayerNorm"]
    primitives = _third_call(RESIDUAL + """
import mxamp
out, out_args, out_aux = mxamp.convert_model(net, args, aux, target_dtype="bfloat16",
                                             backend="onednn", backend_compute="bfloat16")
assert len(onednn.regions(out)) == 1
ex = out.bind(mx.cpu(), {**out_args, "data": args["data"]}, aux_states=out_aux)
""")
    def types(kind):
        return [verbose.types(p) for p in primitives if verbose.kind(p) == kind]

    assert [t["dst"] for t in types("layer_normalization")] == ["f32"] * 3
    assert [t["dst"] for t in types("binary")] == ["f32"]
    assert [(t["src"], t["wei"], t["dst"]) for t in types("inner_product")] == \
        [("bf16", "bf16", "f32")] * 2


# MobileNet v2's stem (net, args, aux): a three-channel convolution, a
# depthwise one and a 1x1 one, with BatchNorm and ReLU6.
STEM = """
def conv(x, name, **kw):
    x = mx.sym.Convolution(x, name=name, **kw)
    return mx.sym.clip(mx.sym.BatchNorm(x, fix_gamma=False, name=name + "_bn"), 0, 6)
net = conv(mx.sym.var("data"), "c1", kernel=(3, 3), stride=(2, 2), pad=(1, 1), num_filter=32)
net = conv(net, "dw", kernel=(3, 3), pad=(1, 1), num_filter=32, num_group=32)
net = mx.sym.Convolution(net, kernel=(1, 1), num_filter=16, name="pw")
shapes = {"data": (8, 3, 56, 56)}
arg_shapes, _, aux_shapes = net.infer_shape(**shapes)
args = {n: mx.nd.array(rs.uniform(0.5, 1.5, s)) for n, s in zip(net.list_arguments(), arg_shapes)}
aux = {n: mx.nd.array(rs.uniform(0.5, 1.5, s)) for n, s in zip(net.list_auxiliary_states(),
                                                                 aux_shapes)}
"""


@pytest.mark.cpu
@pytest.mark.parametrize("compute", ["float32", pytest.param("bfloat16", marks=needs("bf16"))])
def test_convolutions_hand_on_their_layout(compute):
    """MobileNet v2's stem: a three-channel convolution (whose kernel prefers
    a blocked output on AVX-512), then a depthwise and a 1x1 convolution
    (channels-last there). Each convolution writes the layout its reader
    reads: the only reorders a call runs are the region's input and
    output."""
    primitives = _third_call(STEM + """
out, out_args, out_aux = onednn.apply_backend(net, args, aux, compute=%r)
assert len(onednn.regions(out)) == 1
ex = out.bind(mx.cpu(), {**out_args, "data": args["data"]}, aux_states=out_aux)
""" % compute)
    def at_an_edge(p):  # field 6: the memory descriptors, 9: the problem's dims
        return (p[9] == "8x3x56x56" and "src_f32::blocked:abcd:" in p[6] or
                p[9] == "8x16x28x28" and "dst_f32::blocked:abcd:" in p[6])

    reorders = [p for p in primitives if verbose.kind(p) == "reorder"]
    assert _kinds(primitives) == {"convolution": 3, "reorder": len(reorders)}, primitives
    assert [p for p in reorders if not at_an_edge(p)] == [] and len(reorders) <= 2, [",".join(p[3:]) for p in primitives]


@pytest.mark.cpu
@needs("bf16")
def test_where_bfloat16_is_slower_the_default_path_runs_the_float32_primitives():
    """The documented path (convert to bfloat16, then the backend with its
    own choice of compute type) on a CPU whose bfloat16 dot products are
    slower: a call runs exactly the primitives the float32 model runs on the
    float32 backend (kinds, kernels, types, layouts, post-ops, shapes), so
    it is that row's speed; only the timing field may differ."""
    def primitives(setup):
        return _third_call(STEM + setup + """
assert len(onednn.regions(out)) == 1
ex = out.bind(mx.cpu(), {**out_args, "data": args["data"]}, aux_states=out_aux)
""")
    default = primitives("""
import mxamp
onednn.bf16_speed = lambda measure=False: onednn.Bf16Speed(2.4, "a slower CPU")
low, low_args, low_aux = mxamp.convert_model(net, args, aux, target_dtype="bfloat16")
assert '"amp_cast"' in low.tojson()  # bfloat16 casts, which the region plans away
out, out_args, out_aux = onednn.apply_backend(low, low_args, low_aux)
""")
    float32 = primitives("""
out, out_args, out_aux = onednn.apply_backend(net, args, aux, compute="float32")
""")
    assert _kinds(default)["convolution"] == 3
    assert [p[3:-1] for p in default] == [p[3:-1] for p in float32]


def test_exported_backend_block_reloads(tmp_path, compute, onednn):
    sym = _small_resnet()
    args, aux, data = _params(sym, {"data": (2, 8, 8, 8)})
    block = _symbol_block(sym, args, aux)
    backend = mxamp.gluon.apply_backend_block(
        mxamp.convert_hybrid_block(block, target_dtype="bfloat16"), compute=compute)
    expected = backend(data["data"]).asnumpy()
    backend.export(str(tmp_path / "model"))
    saved = json.loads((tmp_path / "model-symbol.json").read_text())
    (region,) = [n for n in saved["nodes"] if n["op"] == onednn.REGION_OP]
    assert region["attrs"]["compute"] == compute
    reloaded = mx.gluon.SymbolBlock.imports(str(tmp_path / "model-symbol.json"), ["data"],
                                            str(tmp_path / "model-0000.params"))
    np.testing.assert_array_equal(reloaded(data["data"]).asnumpy(), expected)


def test_changed_weights_are_repacked(compute, onednn):
    """Weights are packed into the primitives once, but a parameter set
    after the first call is seen: the next call packs it again and matches a
    model run from the changed parameters. The region reads its parameters
    packed per row shape: the convolutions' weights of one shape, and every
    vector (biases, BatchNorm's statistics)."""
    sym = _small_resnet()
    args, aux, data = _params(sym, {"data": (2, 8, 8, 8)})
    out, out_args, out_aux = onednn.apply_backend(sym, args, aux, compute=compute)
    (vectors,) = [n for n, a in out_args.items() if "_params" in n and a.ndim == 1]
    weights = sorted(n for n, a in out_args.items() if "_params" in n and a.ndim > 1)[0]
    assert out_aux == {}  # the statistics are packed too
    block = _symbol_block(out, out_args, out_aux)
    for _ in range(3):  # past the call where parameters are first packed
        block(data["data"]).wait_to_read()
    # (the variances stay positive)
    changed = {**out_args, weights: out_args[weights] * -2, vectors: out_args[vectors] + 1}
    for name in (weights, vectors):
        block.collect_params()[name].set_data(changed[name])
    _close(block(data["data"]).asnumpy(), _run(out, changed, {}, data)[0], 1e-6)
    assert not np.allclose(_run(out, changed, {}, data)[0], _run(out, out_args, {}, data)[0])


def test_bad_arguments_are_clear_errors(onednn):
    sym = _small_resnet()
    args, aux, _ = _params(sym, {"data": (1, 8, 4, 4)})
    with pytest.raises(TypeError, match="sym must be an mxnet.symbol.Symbol, got str"):
        onednn.apply_backend("net", args, aux)
    with pytest.raises(TypeError, match="arg_params must be a dict of str"):
        onednn.apply_backend(sym, [], aux)
    with pytest.raises(ValueError, match="bfloat16, float32, int8, got 'int4'"):
        onednn.apply_backend(sym, args, aux, compute="int4")
    with pytest.raises(TypeError, match="block must be a gluon HybridBlock, got Symbol"):
        mxamp.gluon.apply_backend_block(sym)
    fp16 = mxamp.convert_model(sym, args, aux, target_dtype="float16")
    with pytest.raises(ValueError, match="runs bfloat16 models; this one holds float16"):
        onednn.apply_backend(*fp16)


def test_applying_twice_is_an_error(compute, onednn):
    sym = _small_resnet()
    args, aux, _ = _params(sym, {"data": (1, 8, 4, 4)})
    once = onednn.apply_backend(sym, args, aux, compute=compute)
    with pytest.raises(ValueError, match="already has oneDNN backend regions"):
        onednn.apply_backend(*once)


def test_missing_onednn_names_the_packages(tmp_path, monkeypatch, onednn):
    monkeypatch.setattr(_lib, "ONEDNN_PREFIXES", (str(tmp_path),))
    monkeypatch.setattr(_lib, "_loaded", {})
    message = r"oneDNN 3 .* not found .*pip install onednn-cpu-gomp==2023.2.0 " \
              r"onednn-devel-cpu-gomp==2023.2.0 \(or the extra mxamp\[onednn\]\)"
    with pytest.raises(RuntimeError, match=message):
        _lib.build(lib=_lib.ONEDNN)
    with pytest.raises(RuntimeError, match=message):
        onednn.load()
    assert _lib.library_path().name.startswith("libmxamp_")  # the graph pass does not need it


def test_backend_library_is_cached_apart_from_the_pass():
    assert _lib.library_path(lib=_lib.ONEDNN).name.startswith("libmxamp_onednn_")
    assert _lib.library_path(lib=_lib.ONEDNN).parent == _lib.library_path().parent
    assert _lib.build(lib=_lib.ONEDNN) == _lib.library_path(lib=_lib.ONEDNN)


def test_computed_weight_stays_outside_the_region(compute, onednn):
    """weight = w * 2 feeding a convolution: the _mul_scalar stays on MXNet
    (a region reads parameters as its inputs), the convolution runs."""
    weight = mx.sym.var("w") * 2
    sym = mx.sym.Activation(mx.sym.Convolution(D, weight=weight, kernel=(3, 3), num_filter=4,
                                               no_bias=True, name="c"), act_type="relu")
    args, aux, data = _params(sym, {"data": (2, 3, 6, 6)})
    out, out_args, out_aux = onednn.apply_backend(sym, args, aux, compute=compute)
    assert onednn.regions(out) == [["Activation", "Convolution"]]
    assert [n["op"] for n in json.loads(out.tojson())["nodes"]
            if n["op"] not in ("null", onednn.REGION_OP)] == ["_mul_scalar"]
    _close(_run(out, out_args, out_aux, data)[0], _run(sym, args, aux, data)[0], RTOL[compute])


@pytest.mark.parametrize("pad", [0, 1])
def test_full_average_pooling_past_the_edge_matches_mxnet(pad, onednn):
    """8x8 input, kernel 3, stride 2, 'full', count_include_pad: the last
    window runs past the edge and MXNet divides by its part inside input +
    pad. Without pad the backend divides the same way; with pad it cannot,
    and the pooling stays on MXNet."""
    sym = mx.sym.Pooling(D, kernel=(3, 3), stride=(2, 2), pad=(pad, pad), pool_type="avg",
                         pooling_convention="full", count_include_pad=True)
    data = {"data": mx.nd.arange(64).reshape((1, 1, 8, 8))}
    out, _, _ = onednn.apply_backend(sym, {}, {}, compute="float32")
    assert onednn.regions(out) == ([["Pooling"]] if pad == 0 else [])
    ref = _run(sym, {}, {}, data)[0]
    # MXNet's own: (54 + 55 + 62 + 63) / 4 without pad; with pad 63 / 4 (the
    # window's 2 x 2 inside input + pad), where oneDNN gives 63 / 9 or 63.
    assert ref[0, 0, -1, -1] == (58.5 if pad == 0 else 15.75)
    np.testing.assert_allclose(_run(out, {}, {}, data)[0], ref, rtol=1e-6)


def test_operator_onednn_cannot_create_stays_on_mxnet_with_a_warning(onednn, caplog):
    """clip with a_min > a_max is valid MXNet but oneDNN refuses the eltwise:
    checked when partitioning, left to MXNet, named in a WARNING."""
    sym = mx.sym.clip(mx.sym.relu(D), a_min=1, a_max=0, name="reversed_clip")
    data = {"data": mx.nd.array(np.linspace(-2, 2, 12).reshape(3, 4))}
    out, _, _ = onednn.apply_backend(sym, {}, {}, compute="float32")
    assert onednn.regions(out) == [["relu"]]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "oneDNN backend: reversed_clip (clip) stays on MXNet: could not create a primitive "
        "descriptor for an eltwise forward propagation primitive in float32"]
    np.testing.assert_array_equal(_run(out, {}, {}, data)[0], _run(sym, {}, {}, data)[0])


@pytest.mark.cpu
def test_threads_with_different_compute_types_get_their_own(onednn):
    """apply_backend from several threads at once, each with its compute
    type: every result has its region computing in the type it asked for."""
    have = cpu.features("onednn")  # oneDNN's optimised INT8 kernels start at AVX2
    computes = ["float32"] + ["int8"] * have.avx2 + ["bfloat16"] * have.bf16
    sym = _small_resnet()
    args, aux, _ = _params(sym, {"data": (1, 8, 4, 4)})
    asked = [computes[i % len(computes)] for i in range(24)]
    got = [None] * len(asked)

    def work(i):
        out, _, _ = onednn.apply_backend(sym, args, aux, compute=asked[i])
        got[i] = [n["attrs"]["compute"] for n in json.loads(out.tojson())["nodes"]
                  if n["op"] == onednn.REGION_OP]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(asked))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [[c] for c in asked]


@pytest.mark.cpu
@pytest.mark.parametrize("isa", [None, "AVX2", "AVX512_CORE", "AVX512_CORE_VNNI"])
def test_cpu_features_agree_with_the_backend_library(isa):
    """mxamp.cpu.features('onednn') is what the backend library itself finds
    (oneDNN's effective ISA), with and without ISA limits."""
    env = cpu.limited(isa) if isa else {}
    mine, library = json.loads(_script("""
from mxamp import cpu
print(json.dumps([cpu.features("onednn").names(), onednn.cpu_features()]))
""", **env)[-1])
    assert mine == library


def test_operators_on_other_types_stay_on_mxnet(onednn):
    """Regions read and write float32: a relu on float64 data and a scalar
    multiply of int32 data stay on MXNet (they failed at run time with
    'region inputs must be float32'); the float32 relu after the cast runs."""
    wide = mx.sym.var("wide", dtype="float64")
    whole = mx.sym.var("whole", dtype="int32")
    sym = mx.sym.Group([mx.sym.relu(wide, name="relu64"),
                        mx.sym.relu(mx.sym.cast(whole * 2, "float32"), name="relu32")])
    out, _, _ = onednn.apply_backend(sym, {}, {}, compute="float32")
    assert onednn.regions(out) == [["relu"]]
    data = {"wide": mx.nd.array([-1.5, 2.5], dtype="float64"),
            "whole": mx.nd.array([-3, 4], dtype="int32")}
    got = [o.asnumpy() for o in out.bind(mx.cpu(), data).forward()]
    np.testing.assert_array_equal(got[0], [0, 2.5])
    np.testing.assert_array_equal(got[1], [0, 8])
    assert got[0].dtype == np.float64


def test_partitioning_error_is_one_line(onednn):
    """A calibration attribute that is not a number fails partitioning with
    a BackendError naming the node and value, not MXNet's traceback."""
    sym = mx.sym.relu(mx.sym.var("x", attr={"__mxamp_amax__": "lots"}))
    with pytest.raises(BackendError) as err:
        onednn.apply_backend(sym, {}, {}, compute="int8")
    assert str(err.value) == ("oneDNN backend: mxamp_onednn: selecting nodes failed: node x: "
                              "attribute __mxamp_amax__ = 'lots' is not a number")


def test_region_reads_the_second_output_of_an_earlier_region(compute, onednn):
    """c1 -> c2 and c1 -> sin (stays on MXNet) -> c3, then c3 + c2: the
    second region reads the first region's second output past the MXNet
    island. Partitioning skips shape inference, and MXNet's empty shape list
    on the first region node made it throw std::out_of_range
    ('basic_string::substr') for that output index."""
    c1 = _conv(D, "c1")
    sym = mx.sym.elemwise_add(_conv(mx.sym.sin(c1, name="island"), "c3"), _conv(c1, "c2"))
    args, aux, data = _params(sym, {"data": (2, 4, 6, 6)})
    out, out_args, out_aux = onednn.apply_backend(sym, args, aux, compute=compute)
    assert onednn.regions(out) == [["Convolution", "Convolution"],
                                   ["Convolution", "elemwise_add"]]
    assert [n["op"] for n in json.loads(out.tojson())["nodes"]
            if n["op"] not in ("null", onednn.REGION_OP)] == ["sin"]
    _close(_run(out, out_args, out_aux, data)[0], _run(sym, args, aux, data)[0], RTOL[compute])


@needs("bf16", "onednn")
def test_mobilenet_with_float32_clips_agrees_with_float32(onednn):
    """MobileNet v2 converted for MXNet's kernels on this CPU keeps its clips
    float32, so its bfloat16 regions read each other's later outputs across
    them (the case above, at network scale). apply_backend alone:
    apply_backend_block would plan the conversion for the backend again."""
    x, ref, converted = _zoo_net("mobilenetv2_0.25", (2, 3, 32, 32))
    sym, args, aux, _ = mxamp.gluon.model_of(converted, "partitioning it")
    out, out_args, out_aux = onednn.apply_backend(sym, args, aux, compute="bfloat16")
    assert sum(n["op"] == "clip" for n in json.loads(out.tojson())["nodes"]) == 35
    assert len(onednn.regions(out)) == 36  # split by the clips
    _close(_run(out, out_args, out_aux, {"data": x})[0], ref, NET_RTOL["bfloat16"])


@pytest.mark.cpu
def test_threads_with_different_options_get_their_own_partitioning(onednn, caplog):
    """apply_backend from many threads at once, each with other options: a
    float32 model, a converted (bfloat16-typed) one naming its bfloat16 nodes,
    INT8 with two different calibrations, and a model with a node oneDNN
    refuses. Each result is the graph the same call gives alone, and each
    refused node is reported once per call (the library keeps what a
    partitioning learns with its thread, not in shared state)."""
    from test_onednn_int8 import _annotate, _ranges
    sym = _small_resnet()
    args, aux, data = _params(sym, {"data": (1, 8, 4, 4)})
    ranges = _ranges(sym, args, aux, data)
    doubled = {name: (amax * 2, low * 2) for name, (amax, low) in ranges.items()}
    refused = mx.sym.clip(mx.sym.relu(D), a_min=1, a_max=0, name="reversed_clip")
    jobs = [(sym, args, aux, "float32"),
            (*mxamp.convert_model(sym, args, aux, target_dtype="bfloat16"), "float32"),
            (refused, {}, {}, "float32")]
    if cpu.features("onednn").avx2:  # oneDNN's optimised INT8 kernels
        jobs += [(_annotate(sym, ranges), args, aux, "int8"),
                 (_annotate(sym, doubled), args, aux, "int8")]

    def partition(job):
        return onednn.apply_backend(*job[:3], compute=job[3])[0].tojson()

    alone = [partition(job) for job in jobs]
    assert len(set(alone)) == len(jobs)  # the options make a difference
    caplog.clear()
    asked = [i % len(jobs) for i in range(4 * len(jobs))]
    got = [None] * len(asked)

    def work(i):
        got[i] = partition(jobs[asked[i]])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(asked))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [alone[i] for i in asked]
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == asked.count(2) and all("reversed_clip" in w for w in warnings)


def test_node_numbering_that_does_not_match_is_a_clear_error(onednn):
    """The partitioner names nodes by index and checks each one's operator:
    an option from another graph is refused, naming the line (in the
    library's error: MXNet keeps only its own for a failing selector)."""
    sym = mx.sym.relu(D, name="r")
    with pytest.raises(mx.base.MXNetError, match="Error calling supported_ops"):
        sym.optimize_for(onednn.PARTITIONER, ctx=mx.cpu(), skip_infer=True, compute="float32",
                         bf16_nodes="1 sigmoid")
    assert onednn._library(onednn.load()).mxamp_onednn_error().decode() == (
        "mxamp_onednn: selecting nodes failed: option bf16_nodes: '1 sigmoid' is not "
        "'<index> <op>' of an operator node of this graph (2 nodes)")
    out = sym.optimize_for(onednn.PARTITIONER, ctx=mx.cpu(), skip_infer=True,
                           compute="float32", bf16_nodes="1 relu")
    assert onednn.regions(out) == [["relu"]]


@pytest.mark.cpu
def test_mxnet_queries_on_regions_report_their_inputs():
    """Asking MXNet about a symbol holding region nodes (what apply_backend
    and mxamp.quantization return: float32, converted and INT8 regions) never
    crashes the process, and reports the region's arguments (its packed
    parameters: BatchNorm's statistics packed are no auxiliary states any
    more) and shapes (an INT8 model's: its int8 weights and scales): for the symbol,
    its JSON reloaded, its internals and a group of it. In a fresh process: a crash there must not take the test run down."""
    lines = _script("""
import mxamp, mxamp.cpu
from mxamp.quantization.api import AMAX, MIN
bn = mx.sym.BatchNorm(mx.sym.Convolution(mx.sym.var('data'), kernel=(3, 3), num_filter=4,
                                         name='c'), fix_gamma=False, name='bn')
net = mx.sym.FullyConnected(mx.sym.relu(bn), num_hidden=3, name='fc')
shapes = {'data': (1, 3, 8, 8)}
a_s, _, x_s = net.infer_shape(**shapes)
params = {n: mx.nd.ones(s) for n, s in zip(net.list_arguments(), a_s) if n != 'data'}
aux = {n: mx.nd.ones(s) for n, s in zip(net.list_auxiliary_states(), x_s)}
graph = json.loads(net.tojson())
for node in graph['nodes']:
    node.setdefault('attrs', {}).update({AMAX: '4.0', MIN: '-1.0'})
calibrated = mx.sym.load_json(json.dumps(graph))
models = {'float32': onednn.apply_backend(net, params, aux, compute='float32')[0],
          'converted': onednn.apply_backend(
              *mxamp.convert_model(net, params, aux, target_dtype='bfloat16'),
              compute='float32')[0]}
if mxamp.cpu.features('onednn').avx2:
    models['int8'] = onednn.apply_backend(calibrated, params, aux, compute='int8')[0]
# The region reads its parameters packed per row shape: c's weights, the
# vectors (c's bias, bn's four, fc's bias: 23 values) and fc's weights.
float_args = ['data', '_op0_params_3x3x3', '_op0_params', '_op0_params_144']
float_shapes = [(1, 3, 8, 8), (4, 3, 3, 3), (23,), (3, 144)]
# INT8 layers read int8 weights (packed per row shape) and their scales
# (packed per weight rank); BatchNorm is folded into c (its bias packed too);
# fc's bias is a float parameter.
int8_args = ['data', '_op0_weight_s8_3x3x3', '_op0_weight_scales_4d', '_op0_bias_folded',
             '_op0_weight_s8_144', '_op0_weight_scales_2d', '_op0_params']
int8_shapes = [(1, 3, 8, 8), (4, 3, 3, 3), (4, 1, 1, 1), (4,), (3, 144), (3, 1), (3,)]
for name, out in models.items():
    args, shapes_in = (int8_args, int8_shapes) if name == 'int8' else (float_args, float_shapes)
    expected = [args, [], (shapes_in, [(1, 3)], [])]
    assert any(n['op'] == onednn.REGION_OP for n in json.loads(out.tojson())['nodes'])
    for sym in (out, mx.sym.load_json(out.tojson()), mx.sym.Group([out, out * 2])):
        got = [sym.list_arguments(), sym.list_auxiliary_states(), sym.infer_shape(**shapes)]
        assert got[:2] == expected[:2] and got[2][0] == expected[2][0], (name, got)
        assert got[2][2] == expected[2][2] and got[2][1][0] == expected[2][1][0], (name, got)
        sym.infer_type(data='float32')
    internals = out.get_internals()
    assert set(internals.list_arguments()) == set(expected[0]), name
    assert set(internals.list_auxiliary_states()) == set(expected[1]), name
    print(name, 'ok')
""")
    want = ["float32 ok", "converted ok"] + ["int8 ok"] * cpu.features("onednn").avx2
    assert [line for line in lines if line.endswith(" ok")] == want


# ---- convolutions computing only the rows and columns their readers read

# A stem and two ResNet v1 bottleneck blocks: an identity block (s1), whose
# output only the transition block's (s2) stride-2 1x1 convolutions read,
# on a 9x9 input (odd: the subsampled rows are ceil(9 / 2) = 5). With
# ALSO_OUTPUT, s1's output is the network's second output too.
STAGES = """
def conv(x, name, kernel, filters, stride=1):
    x = mx.sym.Convolution(x, kernel=(kernel, kernel), stride=(stride, stride),
                           pad=((kernel - 1) // 2,) * 2, num_filter=filters, name=name)
    return mx.sym.BatchNorm(x, fix_gamma=False, name=name + "_bn")
relu = lambda x: mx.sym.Activation(x, act_type="relu")
def block(x, name, filters, stride=1, downsample=False):
    y = relu(conv(x, name + "a", 1, filters // 4, stride))
    y = relu(conv(y, name + "b", 3, filters // 4))
    y = conv(y, name + "c", 1, filters)
    return relu(y + (conv(x, name + "d", 1, filters, stride) if downsample else x))
s1 = block(relu(conv(mx.sym.var("data"), "stem", 3, 16)), "s1", 16)
net = mx.sym.FullyConnected(mx.sym.Flatten(mx.sym.Pooling(
    block(s1, "s2", 32, 2, True), kernel=(1, 1), global_pool=True, pool_type="avg")),
    num_hidden=10, name="fc")
if ALSO_OUTPUT:
    net = mx.sym.Group([net, s1])
rs = np.random.RandomState(0)
arg_shapes, _, aux_shapes = net.infer_shape(data=(2, 8, 9, 9))
args = {n: mx.nd.array(rs.uniform(-0.5, 0.5, s))
        for n, s in zip(net.list_arguments(), arg_shapes)}
aux = {n: mx.nd.array(rs.uniform(0.5, 1.5, s))
       for n, s in zip(net.list_auxiliary_states(), aux_shapes)}
"""


@pytest.mark.parametrize("also_output", [False, True])
def test_stage_transition_matches_float32(also_output, compute, onednn):
    space = {"mx": mx, "np": np, "ALSO_OUTPUT": also_output}
    exec(STAGES, space)
    net, args, aux = space["net"], space["args"], space["aux"]
    refs = _run(net, args, aux, {})
    out, out_args, out_aux = onednn.apply_backend(net, args, aux, compute=compute)
    assert len(onednn.regions(out)) == 1
    gots = _run(out, out_args, out_aux, {})
    assert [g.shape for g in gots] == [r.shape for r in refs]
    for got, ref in zip(gots, refs):
        _close(got, ref, NET_RTOL[compute])


def _stage_primitives(compute, also_output):
    """(ic, oc, ih, oh, kh, sh) of each convolution and (ih, oh, kh, sh) of
    each pooling a call of STAGES runs."""
    primitives = _third_call(f"ALSO_OUTPUT = {also_output}\n" + STAGES + f"""
out, out_args, out_aux = onednn.apply_backend(net, args, aux, compute={compute!r})
ex = out.bind(mx.cpu(), out_args, aux_states=out_aux, grad_req="null")
""")
    found = {"convolution": [], "pooling": []}
    names = {"convolution": ("ic", "oc", "ih", "oh", "kh", "sh"),
             "pooling": ("ih", "oh", "kh", "sh")}
    for p in primitives:
        if verbose.kind(p) in found:  # the problem: 'mb2_ic8oc16_ih9oh9kh3sh1...'
            sizes = dict(re.findall(r"([a-z]+)(\d+)", p[-2]))
            found[verbose.kind(p)].append(tuple(int(sizes[n]) for n in names[verbose.kind(p)]))
    return {kind: sorted(found[kind]) for kind in found}


@pytest.mark.cpu
@pytest.mark.parametrize("compute", ["float32", pytest.param("bfloat16", marks=needs("bf16"))])
def test_last_block_of_a_stage_computes_what_the_next_stage_reads(compute):
    """s1's 3x3 convolution strides by 2 (9 -> 5 rows) and its 1x1 one
    runs on 5 rows; the stem's output, s1's residual operand, is pooled
    1x1 by 2 once; s2's 1x1 convolutions stride by 1 on 5 rows."""
    assert _stage_primitives(compute, also_output=False) == {
        "convolution": sorted([
            (8, 16, 9, 9, 3, 1),                                           # stem
            (16, 4, 9, 9, 1, 1), (4, 4, 9, 5, 3, 2), (4, 16, 5, 5, 1, 1),  # s1 a, b, c
            (16, 8, 5, 5, 1, 1), (8, 8, 5, 5, 3, 1), (8, 32, 5, 5, 1, 1),  # s2 a, b, c
            (16, 32, 5, 5, 1, 1)]),                                        # s2 d
        "pooling": [(5, 1, 5, 1), (9, 5, 1, 2)]}


@pytest.mark.cpu
def test_a_block_output_read_in_full_is_computed_in_full():
    """With s1's output a network output too, s1 computes every row and
    s2's 1x1 convolutions stride by 2 themselves; no subsampling pooling."""
    assert _stage_primitives("float32", also_output=True) == {
        "convolution": sorted([
            (8, 16, 9, 9, 3, 1),
            (16, 4, 9, 9, 1, 1), (4, 4, 9, 9, 3, 1), (4, 16, 9, 9, 1, 1),
            (16, 8, 9, 5, 1, 2), (8, 8, 5, 5, 3, 1), (8, 32, 5, 5, 1, 1),
            (16, 32, 9, 5, 1, 2)]),
        "pooling": [(5, 1, 5, 1)]}


# The child: MXNet's engine threads started (its arrays made by operators,
# which run there), then work on the main thread, which may add no thread.
# mxamp is imported after `before` is counted: loading the backend
# partitions a probe graph, where a team used to start. A team stays; the
# thread that relays MXNet's log (mxamp.errors) has been joined, but its
# OS thread may still be exiting, so the count gets a second to settle.
NO_TEAM_CHILD = """
import os, time
import mxnet as mx
x = mx.sym.var("data")
{setup}
mx.nd.waitall()
before = len(os.listdir("/proc/self/task"))
{work}
for _ in range(100):
    after = len(os.listdir("/proc/self/task"))
    if after == before:
        break
    time.sleep(0.01)
assert after == before, (before, after)
"""
NO_TEAM_WORK = {
    # Partitioning checks each node by making (and packing) its primitives.
    "partitioning": ("""
sym = mx.sym.Activation(mx.sym.Convolution(x, kernel=(3, 3), num_filter=8, name="c"),
                        act_type="relu")
args = {"c_weight": mx.nd.ones((8, 3, 3, 3)), "c_bias": mx.nd.zeros((8,))}
""", """
from mxamp.backends import onednn
onednn.apply_backend(sym, args, {}, compute="float32")
"""),
    # Quantization reads every tensor and weight and writes new weights;
    # MXNet's copies (asnumpy, mx.nd.array) of arrays this large (over
    # 200,000 values) run on a team.
    "quantization": ("""
y = mx.sym.Activation(mx.sym.Convolution(x, kernel=(1, 1), num_filter=128, name="c"),
                      act_type="relu")
sym = mx.sym.FullyConnected(mx.sym.Pooling(y, kernel=(8, 8), stride=(8, 8), pool_type="avg"),
                            num_hidden=64, name="fc")
args = {"c_weight": mx.nd.random.normal(0, 0.1, (128, 16, 1, 1)), "c_bias": mx.nd.zeros((128,)),
        "fc_weight": mx.nd.random.normal(0, 0.1, (64, 8192)), "fc_bias": mx.nd.zeros((64,))}
calib = mx.io.NDArrayIter(mx.nd.random.uniform(shape=(8, 16, 64, 64)), batch_size=4)
""", """
from mxamp import quantization
for mode in ("naive", "entropy"):
    quantization.quantize_model(sym, args, {}, label_names=(), calib_mode=mode, calib_data=calib)
    calib.reset()
"""),
    # Conversion checks that each float32 parameter fits the target dtype.
    "conversion": ("""
sym = mx.sym.FullyConnected(x, num_hidden=512, name="fc")
args = {"fc_weight": mx.nd.random.normal(0, 0.1, (512, 1024)), "fc_bias": mx.nd.zeros((512,))}
""", """
import mxamp
for dtype in ("float16", "bfloat16"):
    mxamp.convert_model(sym, args, {}, target_dtype=dtype)
"""),
}


@pytest.mark.cpu
@pytest.mark.parametrize("work", sorted(NO_TEAM_WORK))
def test_work_on_the_calling_thread_starts_no_openmp_team_there(work):
    """Partitioning, quantization and conversion run on the caller's thread. A team of
    two started there would stay, and with the team of MXNet's engine
    thread that runs the regions libgomp would manage more threads than
    there are CPUs and put idle ones to sleep at once, so that every
    primitive waits to wake them (docs/onednn.md, "Threads")."""
    setup, job = NO_TEAM_WORK[work]
    child = subprocess.run([sys.executable, "-c", NO_TEAM_CHILD.format(setup=setup, work=job)],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert child.returncode == 0, child.stderr


def _cores():
    """The cores this process may run on: distinct sysfs sibling lists."""
    return len({Path(f"/sys/devices/system/cpu/cpu{n}/topology/thread_siblings_list").read_text()
                for n in os.sched_getaffinity(0)})


# The child: MXNet's engine thread started, then a batch-1 region run on it;
# prints region_threads(), the threads the run started and the backend's log.
TEAM_CHILD = PRELUDE + """
import logging, os, sys
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
(mx.nd.ones((2, 2)) + 1).wait_to_read()
before = len(os.listdir("/proc/self/task"))
sym = mx.sym.Convolution(mx.sym.var("data"), kernel=(3, 3), num_filter=64, name="c")
args = {"c_weight": mx.nd.ones((64, 64, 3, 3)), "c_bias": mx.nd.zeros((64,))}
out, out_args, _ = onednn.apply_backend(sym, args, {}, compute="float32")
out.bind(mx.cpu(), {**out_args, "data": mx.nd.ones((1, 64, 56, 56))}).forward()[0].wait_to_read()
print(json.dumps([onednn.region_threads(), len(os.listdir("/proc/self/task")) - before]))
"""


# A value of each variable that keeps MXNet's count (THREAD_VARIABLES).
THREAD_SETTINGS = {"OMP_NUM_THREADS": "1", "MXNET_OMP_MAX_THREADS": "1", "OMP_PROC_BIND": "true",
                   "OMP_PLACES": "cores", "GOMP_CPU_AFFINITY": "0"}


@pytest.mark.cpu
@pytest.mark.parametrize("env", [{}] + [{k: v} for k, v in THREAD_SETTINGS.items()])
def test_regions_run_on_one_thread_per_core(env):
    """MXNet runs its operators on half the CPUs on x86 (to leave out
    hyper-threads), so on a VM whose every CPU is a core half the cores sat
    idle; a region takes one thread per core, unless a variable sets the
    count or places threads (OMP_PROC_BIND): MXNet's count stays."""
    environment = {k: v for k, v in _environment().items() if k != "OMP_NUM_THREADS"}
    lines = subprocess.run([sys.executable, "-c", TEAM_CHILD], env={**environment, **env},
                           capture_output=True, text=True, timeout=120, check=True
                           ).stdout.splitlines()
    cores = _cores()
    # MXNet's count on x86 (half the CPUs): the child's first operator
    # started that team on the engine thread; the region adds the rest.
    mxnet_count = max(len(os.sched_getaffinity(0)) // 2, 1)
    threads, started = json.loads(lines[-1])
    assert set(THREAD_SETTINGS) == set(THREAD_VARIABLES)
    if env:
        assert (threads, started) == (None, 0)
        [(name, value)] = env.items()
        assert any(f"each run on MXNet's OpenMP threads ({name}={value})" in line
                   for line in lines)
    else:
        assert (threads, started) == (cores, max(cores - mxnet_count, 0))
        assert any(f"each run on {cores} thread" in line for line in lines)
