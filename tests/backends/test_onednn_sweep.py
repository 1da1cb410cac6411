"""Every operator the oneDNN backend claims, in every data type it computes
in, at the sizes bench runs (batch 1): the BERT-base encoder layer of
bench/benchlib.py and its parts (attention batch_dots and softmax over
12 x 128 x 128, LayerNorm and the gelu feed-forward over 128 x 768), and the
image-network layers (3x3 convolution with BatchNorm and ReLU, depthwise,
grouped and dilated convolutions, max / average / global pooling, residual
add, FullyConnected head), plus activations, scalars, views and transposes.

Each case goes through ``apply_backend`` with compute float32, bfloat16
(where oneDNN 3 has bfloat16 kernels, per mxamp.cpu) and int8 (calibrated
on the case's own data, so nothing clips): the whole case must be offloaded,
nothing may fall back, the region must run (no run-time failure), and the
output must match MXNet's float32 output by relative L2 error
||got - ref|| / ||ref||: float32 1e-5 (summation order, BatchNorm folding),
bfloat16 1e-2 (8 significant bits, rounding at each layer), int8 3e-2
(INT8 rounding of several layers; operators without INT8 kernels run
float32). CPU-sensitive: CI reruns it under ISA limits.
"""
import importlib.util
import json
import logging
from pathlib import Path

import mxnet as mx
import numpy as np
import pytest

import mxamp.backends
from isa import needs, require_onednn3
from mxamp.dtypes import as_numpy
from test_onednn_int8 import _annotate, _ranges

require_onednn3()

pytestmark = pytest.mark.cpu

TOL = {"float32": 1e-5, "bfloat16": 1e-2, "int8": 3e-2}
D, D2 = mx.sym.var("data"), mx.sym.var("data2")
HEADS, SEQ, UNITS, HIDDEN = 12, 128, 768, 3072


def _benchlib():
    path = Path(__file__).resolve().parents[2] / "bench" / "benchlib.py"
    spec = importlib.util.spec_from_file_location("benchlib", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _encoder_layer():
    """bench's BERT-base encoder layer as a symbol with its parameters."""
    layer = _benchlib().EncoderLayer(UNITS, HEADS, HIDDEN, SEQ, prefix="enc_")
    layer.initialize(mx.init.Xavier())
    layer(mx.nd.zeros(TOKENS))  # shapes its parameters
    sym = layer(D)
    params = {n: p.data() for n, p in layer.collect_params().items()}
    return sym, params


def _conv(x, filters, groups=1, dilate=1, stride=1, name="c"):
    return mx.sym.Convolution(x, kernel=(3, 3), num_filter=filters, num_group=groups,
                              dilate=(dilate, dilate), pad=(dilate, dilate),
                              stride=(stride, stride), name=name)


def _fc(x, hidden, name, flatten=False):
    return mx.sym.FullyConnected(x, num_hidden=hidden, flatten=flatten, name=name)


TOKENS = (1, SEQ, UNITS)
# name -> (symbol or builder of (symbol, parameters), input shapes)
CASES = {
    "attention_scores": (mx.sym.batch_dot(D, D2 * 0.125, transpose_b=True),
                         {"data": (HEADS, SEQ, 64), "data2": (HEADS, SEQ, 64)}),
    "attention_softmax_context": (
        mx.sym.batch_dot(mx.sym.softmax(D, axis=-1), D2),
        {"data": (HEADS, SEQ, SEQ), "data2": (HEADS, SEQ, 64)}),
    "softmax_4d": (mx.sym.softmax(D / 8.0), {"data": (1, HEADS, SEQ, SEQ)}),
    "layernorm_residual": (mx.sym.LayerNorm(D + _fc(D, UNITS, "proj"), name="ln"),
                           {"data": TOKENS}),
    "ffn_gelu": (_fc(mx.sym.LeakyReLU(_fc(D, HIDDEN, "ffn1"), act_type="gelu"), UNITS, "ffn2"),
                 {"data": TOKENS}),
    "heads_split": (mx.sym.reshape(mx.sym.transpose(mx.sym.reshape(
        _fc(D, UNITS, "q"), shape=(0, 0, HEADS, -1)), axes=(0, 2, 1, 3)), shape=(-1, SEQ, 64)),
        {"data": TOKENS}),
    "activations_and_scalars": (
        mx.sym.clip(mx.sym.Activation(mx.sym.LeakyReLU(mx.sym.Activation(
            _fc(D, UNITS, "fc"), act_type="tanh"), act_type="leaky", slope=0.1),
            act_type="softrelu") * 1.5 / 2.0, -1, 1) + mx.sym.sigmoid(D),
        {"data": TOKENS}),
    "encoder_layer": (_encoder_layer, {"data": TOKENS}),
    "conv_bn_relu_maxpool": (
        mx.sym.Pooling(mx.sym.Activation(mx.sym.BatchNorm(_conv(D, 64), fix_gamma=False,
                                                          name="bn"), act_type="relu"),
                       kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max"),
        {"data": (1, 64, 56, 56)}),
    "depthwise": (mx.sym.relu(_conv(D, 32, groups=32)), {"data": (1, 32, 112, 112)}),
    "grouped_residual": (mx.sym.relu(_conv(D, 128, groups=32) + D), {"data": (1, 128, 28, 28)}),
    "dilated": (_conv(D, 64, dilate=2), {"data": (1, 64, 28, 28)}),
    "strided_avgpool_full": (
        mx.sym.Pooling(_conv(D, 32, stride=2), kernel=(3, 3), stride=(2, 2), pool_type="avg",
                       pooling_convention="full"), {"data": (1, 32, 16, 16)}),
    # the stem's three-channel convolution writes the layout its depthwise
    # reader reads (channels-last on AVX-512), not the blocked one it prefers
    "mobilenet_stem": (mx.sym.Convolution(mx.sym.clip(_conv(mx.sym.clip(mx.sym.BatchNorm(
        _conv(D, 32, stride=2, name="stem"), fix_gamma=False, name="stem_bn"), 0, 6), 32,
        groups=32, name="dw"), 0, 6), kernel=(1, 1), num_filter=16, name="pw"),
        {"data": (2, 3, 56, 56)}),
    "global_pool_head": (
        _fc(mx.sym.Flatten(mx.sym.Pooling(D, kernel=(7, 7), global_pool=True, pool_type="avg")),
            1000, "head", flatten=True), {"data": (1, 2048, 7, 7)}),
}


def _case(name):
    """The case's symbol, parameters, auxiliary states and inputs."""
    sym, shapes = CASES[name]
    params = {}
    if not isinstance(sym, mx.sym.Symbol):
        sym, params = sym()
    rs = np.random.RandomState(0)
    arg_shapes, _, aux_shapes = sym.infer_shape(**shapes)
    args = {n: params.get(n, mx.nd.array(rs.uniform(-0.1, 0.1, s)))
            for n, s in zip(sym.list_arguments(), arg_shapes) if n not in shapes}
    aux = {n: mx.nd.array(rs.uniform(0.5, 1.5, s))
           for n, s in zip(sym.list_auxiliary_states(), aux_shapes)}
    data = {n: mx.nd.array(rs.uniform(-1, 1, s)) for n, s in shapes.items()}
    return sym, args, aux, data


def _run(sym, args, aux, data):
    ex = sym.bind(mx.cpu(), {**args, **data}, aux_states={k: v.copy() for k, v in aux.items()},
                  grad_req="null")
    return ex.forward(is_train=False)[0].asnumpy()


@pytest.mark.parametrize("compute", ["float32", pytest.param("bfloat16", marks=needs("bf16")),
                                     pytest.param("int8", marks=needs("avx2"))])
@pytest.mark.parametrize("name", sorted(CASES))
def test_case_runs_whole_in_the_backend_and_matches_float32(name, compute, caplog):
    onednn = mxamp.backends.get("onednn")
    sym, args, aux, data = _case(name)
    ref = _run(sym, args, aux, data)
    source = _annotate(sym, _ranges(sym, args, aux, data)) if compute == "int8" else sym
    with caplog.at_level(logging.WARNING, logger="mxamp.backends.onednn"):
        out, out_args, out_aux = onednn.apply_backend(source, args, aux, compute=compute)
    assert not caplog.records, "operators fell back to MXNet: " + caplog.text
    nodes = json.loads(out.tojson())["nodes"]
    assert [n["op"] for n in nodes if n["op"] not in ("null", onednn.REGION_OP)] == []
    got = _run(out, out_args, out_aux, data)
    assert got.dtype == np.float32 and got.shape == ref.shape
    error = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    assert error <= TOL[compute], f"relative L2 error {error} in {compute}"


@needs("bf16")
def test_converted_encoder_runs_on_the_backend():
    """The documented path on bench's BERT-base-sized encoder (one layer,
    batch 1): convert_hybrid_block to bfloat16, then apply_backend_block.
    Nothing falls back (softmax's first forward once failed with 'could not
    create a primitive descriptor'), and it agrees with float32 to 2e-2
    (relative L2)."""
    net = _benchlib().Encoder(1, SEQ, vocab=1000)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    tokens = mx.nd.array(np.random.RandomState(0).randint(0, 1000, (1, SEQ)))
    ref = net(tokens).asnumpy()
    converted = mxamp.convert_hybrid_block(net, target_dtype="bfloat16")
    converted(tokens)
    fast = mxamp.gluon.apply_backend_block(converted, compute="bfloat16")
    onednn = mxamp.backends.get("onednn")
    assert "softmax" in sum(onednn.regions(fast._cached_graph[1]), [])
    got = as_numpy(fast(tokens))
    assert float(np.linalg.norm(got - ref) / np.linalg.norm(ref)) < 2e-2


@pytest.mark.parametrize("kind, problem, macs", [
    # ResNet-50's stem and MobileNet v2's layers as oneDNN 3.2 prints them
    ("convolution", "mb1_ic3oc64_ih224oh112kh7sh2dh0ph3_iw224ow112kw7sw2dw0pw3",
     112 * 112 * 64 * 3 * 7 * 7),
    ("convolution", "mb16_ic64oc256_ih56oh56kh1sh1dh0ph0_iw56ow56kw1sw1dw0pw0",
     16 * 56 * 56 * 256 * 64),
    # depthwise: 32 groups of 1 input and 1 output channel
    ("convolution", "g32mb1_ic32oc32_ih112oh112kh3sh1dh0ph1_iw112ow112kw3sw1dw0pw1",
     112 * 112 * 32 * 3 * 3),
    ("convolution", "g4mb2_ic64oc128_ih8oh4kh3sh2dh1ph2_iw8ow4kw3sw2dw1pw2",
     2 * 4 * 4 * 128 * 16 * 3 * 3),
    ("convolution", "mb1_ic8oc16_id4od4kd3sd1dd0pd1_ih5oh5kh3sh1dh0ph1_iw6ow6kw3sw1dw0pw1",
     4 * 5 * 6 * 16 * 8 * 27),
    ("inner_product", "mb1ic2048oc1000", 2048 * 1000),
    ("inner_product", "mb8ic512ih7iw7oc10", 8 * 512 * 49 * 10),
    ("matmul", "4160x3420:3420x1280", 4160 * 3420 * 1280),
    ("matmul", "12x128x64:12x64x128:12x128x128", 12 * 128 * 64 * 128),
    # the weights broadcast over the source's batch dims
    ("matmul", "8x12x128x64:1x1x64x128", 8 * 12 * 128 * 64 * 128),
    ("matmul", "*x128x64:*x64x128", None),
    ("reorder", "1x64x56x56", None),
    ("pooling", "mb1ic64_ih112oh56kh3sh2dh0ph1_iw112ow56kw3sw2dw0pw1", None),
])
def test_bench_counts_the_multiply_accumulates_of_a_verbose_problem(kind, problem, macs):
    assert _benchlib().work_macs(kind, problem) == macs


def test_bench_times_each_primitive_at_its_fastest_run():
    """Primitives are matched across runs by their place among the same
    kind, implementation, types and problem, so a spike in one run drops out
    and identical layers keep one time each; one missing from a run is left
    out rather than matched with another."""
    conv = ("convolution", "brgconv", "u8,s8->u8", "mb1_ic64oc64")
    reorder = ("reorder", "jit:uni", "f32->u8", "1x64")
    runs = [(16.0, [(*conv, 4.4), (*reorder, 0.1), (*conv, 0.3)]),
            (15.0, [(*conv, 0.35), (*conv, 0.32), (*reorder, 0.2)]),
            (17.0, [(*conv, 0.34), (*conv, 4.0)])]
    fastest = _benchlib().fastest_primitives(runs)
    assert fastest == {conv + (0,): (0.34, 0.35), conv + (1,): (0.3, 0.32)}
