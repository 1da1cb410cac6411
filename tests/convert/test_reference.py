"""Same lists and options give the same cast placement as mxnet.contrib.amp.

Both converters get the reference's own lists (alias spellings dropped, since
mxamp resolves aliases to the operator they name), and mxamp also gets the
reference's widest-type list. Node names of casts may differ; the comparison
is on what each cast reads and which dtype it produces.
"""
import mxnet as mx
import numpy as np
import pytest
from gluoncv import model_zoo
from mxnet.contrib import amp as ref_amp
from mxnet.contrib.amp.amp import bfloat16 as ref_bf16

import mxamp
from graphs import structure
from mxamp.policy import defaults
from mxamp.registry import canonical_op_names
from mxamp.verify import run_emulated


def reference_lists(dtype):
    key = dtype if dtype == "float16" else ref_bf16
    canon = canonical_op_names()
    plain = lambda ops: [op for op in ops if canon.get(op, op) == op]  # noqa: E731
    return {"target_dtype_ops": plain(ref_amp.list_lp16_ops(key)),
            "fp32_ops": plain(ref_amp.list_fp32_ops(key)),
            "conditional_fp32_ops": ref_amp.list_conditional_fp32_ops(key)}, \
        plain(ref_amp.list_widest_type_cast(key))


def assert_same_as_reference(sym, dtype, **options):
    lists, widest = reference_lists(dtype)
    expected = ref_amp.convert_symbol(sym, target_dtype=dtype, **lists, **options)
    got = mxamp.convert_symbol(sym, target_dtype=dtype, widest_dtype_ops=widest, **lists,
                               **options)
    assert structure(got) == structure(expected)


def fc(x, name):
    return mx.sym.FullyConnected(x, num_hidden=4, name=name)


def small_graphs():
    data = mx.sym.var("data")
    conv = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), name="conv")
    bn = mx.sym.BatchNorm(conv, name="bn")
    relu = mx.sym.Activation(bn, act_type="relu", name="relu")
    exp = mx.sym.exp(relu, name="exp")
    add = mx.sym.elemwise_add(relu, exp, name="add")
    yield "conv_bn_relu_exp_add_fc", mx.sym.softmax(fc(add, "fc"), name="sm")
    yield "fan_out", mx.sym.Group([fc(relu, "a"), fc(relu, "b"), mx.sym.exp(relu, name="e")])
    yield "widest_unknown", mx.sym.broadcast_add(fc(data, "f"), mx.sym.var("bias2"), name="ba")
    soft = mx.sym.Activation(fc(data, "f1"), act_type="softrelu", name="soft")
    yield "conditional", fc(soft, "f2")
    yield "multi_output", mx.sym.Group([fc(data, "o1"), mx.sym.exp(data, name="o2"), data])


@pytest.mark.parametrize("name, sym", list(small_graphs()), ids=lambda v: v
                         if isinstance(v, str) else "")
def test_small_graphs(name, sym, dtype):
    assert_same_as_reference(sym, dtype)


def test_concat_of_mixed_dtypes_where_the_reference_fails():
    """The reference's bfloat16 lists leave Concat dtype-neutral, so a Concat of a
    bfloat16 and a float32 branch breaks its conversion (as on shufflenet_v2);
    mxamp runs that Concat in float32 instead."""
    data = mx.sym.var("data")
    sym = mx.sym.concat(fc(data, "c1"), mx.sym.exp(fc(data, "c2"), name="e2"), dim=1,
                        name="cat")
    lists, widest = reference_lists("bfloat16")
    with pytest.raises(mx.base.MXNetError, match="Non-uniform data type in Concat"):
        ref_amp.convert_symbol(sym, target_dtype="bfloat16", **lists)
    got = mxamp.convert_symbol(sym, target_dtype="bfloat16", widest_dtype_ops=widest, **lists)
    casts, ops, _ = structure(got)
    assert ops["cat"] == (("amp_cast", "float32", ("c1", 0)), ("e2", 0))
    shapes, _, _ = got.infer_shape(data=(2, 3))
    args = {n: mx.nd.random.uniform(shape=s) for n, s in zip(got.list_arguments(), shapes)}
    out = run_emulated(got, args, {}, {"data": args.pop("data")})[0].asnumpy()
    assert out.dtype == np.float32 and np.isfinite(out).all()


def test_excluded_names(dtype):
    sym = dict(small_graphs())["conv_bn_relu_exp_add_fc"]
    assert_same_as_reference(sym, dtype, excluded_sym_names=["conv", "relu"])


@pytest.mark.parametrize("model", ["resnet18_v1", "mobilenetv2_0.25", "densenet121"])
def test_zoo_networks(model, dtype):
    net = model_zoo.get_model(model, pretrained=False)
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 3, 224, 224)))
    assert_same_as_reference(net._cached_graph[1], dtype, data_names=["data"])
    casts, _, _ = structure(mxamp.convert_symbol(net._cached_graph[1], target_dtype=dtype))
    assert set(casts.values()) == {1}  # at most one cast per (entry, dtype)


def test_shufflenet_v2_converts_where_the_reference_fails():
    """The reference's bfloat16 conversion of shufflenet_v2 raises a Concat dtype
    mismatch; mxamp converts it and the result matches float32 (relative L2
    error of the logits below 3e-2, bfloat16's tolerance in test_api)."""
    net = model_zoo.get_model("shufflenet_v2", pretrained=False)
    net.initialize()
    net.hybridize()
    x = mx.nd.random.uniform(shape=(1, 3, 224, 224))
    ref = net(x).asnumpy()
    with pytest.raises(mx.base.MXNetError, match="Concat"):
        ref_amp.convert_hybrid_block(net, target_dtype="bfloat16", ctx=mx.cpu())
    out = mxamp.convert_hybrid_block(net, target_dtype="bfloat16")(x).asnumpy()
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < 3e-2


def upstream_models():
    """The models of MXNet v1.9.x's AMP tests (tests/python/mkl and gpu
    test_contrib_amp.py), initialized through a Module as there: (sym,
    arg_params, aux_params)."""
    def initialized(sym, shape):
        mod = mx.mod.Module(sym, data_names=["data"], label_names=None, context=mx.cpu())
        mod.bind(data_shapes=[("data", shape)])
        mod.init_params()
        return (sym, *mod.get_params())

    data = mx.sym.var("data")
    conv = mx.sym.Convolution(data, num_filter=10, kernel=(2, 3), name="conv")
    bn = mx.sym.BatchNorm(conv, eps=0.001, fix_gamma=False, name="conv0_batchnorm")
    yield "conv_bn_fc", initialized(mx.sym.FullyConnected(bn, num_hidden=10,
                                                          name="fullyconnected"), (1, 3, 16, 16))
    yield "conv", initialized(mx.sym.Convolution(data, kernel=(3, 3), num_filter=8, pad=(1, 1),
                                                 no_bias=True, name="conv2d"), (3, 4, 8, 8))
    yield "fc", initialized(mx.sym.FullyConnected(data, num_hidden=10, name="fc"), (4, 32))


def zoo_models():
    for name in ["resnet18_v1", "mobilenetv2_0.25", "densenet121"]:
        net = model_zoo.get_model(name, pretrained=False)
        net.initialize()
        net.hybridize()
        net(mx.nd.zeros((1, 3, 224, 224)))
        yield name, mxamp.gluon.model_of(net, "comparing it")[:3]


LISTS = {"default lists": {}, "Convolution only": {"target_dtype_ops": ["Convolution"]},
         "FullyConnected only, sin float32": {"target_dtype_ops": ["FullyConnected"],
                                              "fp32_ops": ["sin"]},
         "empty lists": {"target_dtype_ops": [], "fp32_ops": [], "conditional_fp32_ops": []}}


@pytest.fixture(scope="module")
def models():
    return {**dict(upstream_models()), **dict(zoo_models())}


@pytest.fixture
def reference_placement(monkeypatch):
    """The default lists without mxamp's deliberate differences
    (OWN_PLACEMENT): the reference's placement of every operator it lists."""
    monkeypatch.setattr(defaults, "OWN_PLACEMENT", {})
    defaults._placed.cache_clear()
    yield
    monkeypatch.undo()
    defaults._placed.cache_clear()


@pytest.mark.parametrize("cast_optional_params", [False, True])
@pytest.mark.parametrize("lists", sorted(LISTS))
def test_parameter_dtypes_are_the_references(models, dtype, cast_optional_params, lists,
                                              reference_placement):
    """convert_model returns every parameter in the dtype
    mxnet.contrib.amp.convert_model returns, for each model and option
    combination the reference converts (its bfloat16 conversion fails on some
    graphs: those are left out; the upstream model and ResNet-18 always
    convert). Placement as the reference's: mxamp's bfloat16 Flatten
    (OWN_PLACEMENT) runs a densenet121's classifier low where the
    reference's float32 Flatten keeps it float32."""
    options = dict(target_dtype=dtype, cast_optional_params=cast_optional_params, **LISTS[lists])
    compared = []
    for name, (sym, args, aux) in models.items():
        try:  # the reference writes into the dicts it is given
            expected = ref_amp.convert_model(sym, dict(args), dict(aux), **options)
        except (mx.base.MXNetError, AssertionError):
            continue
        got = mxamp.convert_model(sym, args, aux, **options)
        for ours, theirs in zip(got[1:], expected[1:]):
            assert {n: np.dtype(a.dtype) for n, a in ours.items()} == \
                {n: np.dtype(a.dtype) for n, a in theirs.items()}, name
        compared.append(name)
    assert "conv_bn_fc" in compared and "resnet18_v1" in compared, compared
