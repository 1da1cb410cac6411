"""convert_model / convert_hybrid_block: numerics against float32, param dtypes,
and the caller's objects left untouched.

Tolerances: relative L2 error of the outputs against float32 — bfloat16 keeps 8
mantissa bits (eps 2**-8), so 3e-2 after a few layers; float16 keeps 11 (eps
2**-11), so 5e-3. Symbols converted for any device run through
mxamp.verify.run_emulated, so ops without a low-precision kernel on this CPU
(float16 Convolution / FullyConnected; bfloat16 ones too without AVX-512)
compute in float32 on rounded inputs and round their outputs. Blocks
converted for this CPU keep such ops in float32 (mxamp.probe).
"""
import mxnet as mx
import numpy as np
from mxnet.gluon import nn

import mxamp
from graphs import structure
from mxamp.convert import probe
from mxamp.dtypes import to_numpy
from mxamp.verify import run_emulated

TOL = {"bfloat16": 3e-2, "float16": 5e-3}


def cpu_has_conv_kernel(dtype):
    attrs = (("kernel", "(3, 3)"), ("num_filter", "8"))
    return probe.has_kernel("Convolution", attrs, (-1, -1, -1), dtype, mx.cpu())


def rel_err(a, b):
    a, b = a.astype("float32").asnumpy(), b.astype("float32").asnumpy()
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def cnn():
    net = nn.HybridSequential(prefix="cnn_")
    with net.name_scope():
        net.add(nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
                nn.MaxPool2D(2), nn.Conv2D(16, 3, padding=1), nn.BatchNorm(),
                nn.Activation("relu"), nn.GlobalAvgPool2D(), nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net.hybridize()
    return net


def batch():
    return mx.nd.random.uniform(-1, 1, shape=(4, 3, 16, 16))


def exported(net, x):
    net(x)
    _, sym = net._cached_graph
    params = {p.name: p.data() for p in net.collect_params().values()}
    aux = {n: params[n] for n in sym.list_auxiliary_states()}
    args = {n: params[n] for n in sym.list_arguments() if n in params}
    return sym, args, aux


def run(sym, args, aux, x):
    return run_emulated(sym, args, aux, {"data": x})[0]


def test_convert_model_matches_float32(dtype):
    x = batch()
    sym, args, aux = exported(cnn(), x)
    ref = run(sym, args, aux, x)
    csym, cargs, caux = mxamp.convert_model(sym, args, aux, target_dtype=dtype)
    out = run(csym, cargs, caux, x)
    assert out.dtype == np.float32
    assert np.isfinite(out.asnumpy()).all()
    assert rel_err(out, ref) < TOL[dtype]
    assert mxamp.summarize(csym).get(f"amp_cast:{dtype}", 0) > 0


def test_convert_model_returns_new_dicts_and_leaves_the_callers_alone(dtype):
    x = batch()
    sym, args, aux = exported(cnn(), x)
    before = {k: (v.dtype, v.asnumpy().copy()) for k, v in {**args, **aux}.items()}
    json_before = sym.tojson()
    _, cargs, caux = mxamp.convert_model(sym, args, aux, target_dtype=dtype,
                                         cast_optional_params=True)
    assert cargs is not args and caux is not aux
    assert sym.tojson() == json_before
    for k, v in {**args, **aux}.items():
        assert v.dtype == before[k][0]
        np.testing.assert_array_equal(v.asnumpy(), before[k][1])


def test_cast_optional_params_stores_weights_in_bfloat16():
    """Conv/Dense weights read only by bfloat16 ops are stored in bfloat16; the
    BatchNorm parameters and statistics stay float32; numerics still hold."""
    x = batch()
    sym, args, aux = exported(cnn(), x)
    csym, cargs, caux = mxamp.convert_model(sym, args, aux, target_dtype="bfloat16",
                                            cast_optional_params=True)
    low = sorted(k for k, v in cargs.items() if v.dtype != np.float32)
    assert low == sorted(k for k in args if k.endswith(("weight", "bias"))
                         and "batchnorm" not in k)
    assert all(v.dtype == np.float32 for v in caux.values())
    assert all(v.dtype == np.float32 for k, v in cargs.items() if "batchnorm" in k)
    assert "amp_cast:bfloat16" in mxamp.summarize(csym)
    assert rel_err(run(csym, cargs, caux, x), run(sym, args, aux, x)) < TOL["bfloat16"]


def test_convert_hybrid_block_matches_float32_and_keeps_the_block(dtype):
    net = cnn()
    x = batch()
    ref = net(x)
    weights = {k: v.data().asnumpy().copy() for k, v in net.collect_params().items()}
    converted = mxamp.convert_hybrid_block(net, target_dtype=dtype)
    assert isinstance(converted, mx.gluon.SymbolBlock)
    assert converted._active  # hybridized
    out = converted(x)
    assert rel_err(out, ref) < TOL[dtype]
    np.testing.assert_array_equal(net(x).asnumpy(), ref.asnumpy())
    for k, v in net.collect_params().items():
        assert v.data().dtype == np.float32
        np.testing.assert_array_equal(v.data().asnumpy(), weights[k])


def test_convert_hybrid_block_shares_no_array_with_the_block(dtype):
    """The conversion reads the block's own arrays (no copy first): the
    converted block still gets arrays of its own."""
    net = cnn()
    x = batch()
    net(x)
    converted = mxamp.convert_hybrid_block(net, target_dtype=dtype)
    before = converted(x).asnumpy()
    for param in net.collect_params().values():
        param.set_data(param.data() * 0)
    np.testing.assert_array_equal(converted(x).asnumpy(), before)


def test_convert_hybrid_block_param_dtypes_and_context():
    net = cnn()
    x = batch()
    net(x)
    converted = mxamp.convert_hybrid_block(net, target_dtype="bfloat16",
                                           cast_optional_params=True)
    params = converted.collect_params()
    conv_weight = next(p for k, p in params.items() if k.endswith("conv0_weight"))
    # stored in bfloat16 where this CPU has bfloat16 convolutions, else float32
    low = cpu_has_conv_kernel("bfloat16")
    assert (conv_weight.data().dtype == to_numpy(12)) is low
    assert all(p.data().dtype == np.float32 for k, p in params.items() if "batchnorm" in k)
    assert all(p.list_ctx() == [mx.cpu()] for p in params.values())
    assert rel_err(converted(x), net(x)) < TOL["bfloat16"]


def test_exported_block_reloads_with_default_export_arguments(dtype, tmp_path):
    """MXNet's default export drops amp_cast nodes; the converted block's export
    keeps them, so SymbolBlock.imports and Module both reload it."""
    net = cnn()
    x = batch()
    net(x)
    converted = mxamp.convert_hybrid_block(net, target_dtype=dtype, cast_optional_params=True)
    expected = converted(x)
    converted.export(str(tmp_path / "m"))
    reloaded = mx.gluon.SymbolBlock.imports(str(tmp_path / "m-symbol.json"), ["data"],
                                            str(tmp_path / "m-0000.params"))
    np.testing.assert_array_equal(reloaded(x).asnumpy(), expected.asnumpy())

    sym, args, aux = mx.model.load_checkpoint(str(tmp_path / "m"), 0)
    assert mxamp.summarize(sym) == mxamp.summarize(converted._cached_graph[1])
    mod = mx.mod.Module(sym, data_names=["data"], label_names=None)
    mod.bind([("data", x.shape)], for_training=False)
    mod.set_params(args, aux)
    mod.forward(mx.io.DataBatch([x]))
    # Module's executor may fuse ops differently from Gluon's CachedOp.
    assert rel_err(mod.get_outputs()[0], expected) < TOL[dtype]


def test_keep_io_types_false_takes_and_returns_low_precision():
    """Data goes straight into the first convolution, and the logits come out in
    bfloat16, with no casts at either end."""
    x = batch()
    sym, args, aux = exported(cnn(), x)
    ref = run(sym, args, aux, x)
    csym, cargs, caux = mxamp.convert_model(sym, args, aux, target_dtype="bfloat16",
                                            keep_io_types=False)
    out = run(csym, cargs, caux, mx.nd.amp_cast(x, dtype=to_numpy(12)))
    assert out.dtype == to_numpy(12)
    assert rel_err(out, ref) < TOL["bfloat16"]
    casts, ops, heads = structure(csym)
    assert ops["cnn_conv0_fwd"][0] == ("data", 0)
    assert heads == (("cnn_dense0_fwd", 0),)


def test_keep_io_types_true_is_the_default_and_casts_at_both_ends():
    net = cnn()
    net(batch())
    casts, ops, heads = structure(mxamp.convert_symbol(net._cached_graph[1],
                                                       target_dtype="bfloat16",
                                                       data_names=["data"]))
    assert ops["cnn_conv0_fwd"][0] == ("amp_cast", "bfloat16", ("data", 0))
    assert heads == (("amp_cast", "float32", ("cnn_dense0_fwd", 0)),)
