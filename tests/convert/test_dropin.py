"""mxamp as a drop-in for mxnet.contrib.amp: code written for the reference
keeps working (Module binding, exception types, user casts, the API's names
and parameters), and the defaults place operators where the reference does."""
import inspect
import logging

import mxnet as mx
import numpy as np
import pytest
from mxnet.contrib import amp as ref_amp
from mxnet.contrib.amp import amp as ref_module

import mxamp
from graphs import nodes_of
from mxamp import amp
from mxamp.dtypes import to_numpy
from mxamp.registry import canonical_op_names

BF16 = to_numpy(12)
DATA_SHAPE = (2, 3, 8, 8)


def small_model():
    """conv -> BatchNorm -> fc -> SoftmaxOutput, initialized through a Module."""
    data = mx.sym.var("data")
    conv = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), name="conv")
    bn = mx.sym.BatchNorm(conv, name="bn")
    out = mx.sym.SoftmaxOutput(mx.sym.FullyConnected(bn, num_hidden=5, name="fc"),
                               name="softmax")
    mod = mx.mod.Module(out, context=mx.cpu())
    mod.bind(data_shapes=[("data", DATA_SHAPE)], label_shapes=[("softmax_label", (2,))])
    mod.init_params()
    return (out, *mod.get_params())


@pytest.mark.parametrize("cast_optional_params", [False, True])
def test_module_binds_converted_model_with_data_shapes_only(dtype, cast_optional_params):
    """Every parameter carries __dtype__, so Module.bind and simple_bind infer
    each one's dtype: conv's weight and bias when stored low
    (cast_optional_params), and, as the reference gives them, those of the
    dtype-neutral fc after it, whose data arrives low, are in the target
    dtype; everything else float32."""
    sym, args, aux = small_model()
    conv, args_c, aux_c = mxamp.convert_model(sym, args, aux, target_dtype=dtype,
                                              target_dtype_ops=["Convolution"],
                                              cast_optional_params=cast_optional_params)
    low = np.dtype(to_numpy(12 if dtype == "bfloat16" else 2))
    expected = {n: low if n.startswith("fc") or cast_optional_params and n.startswith("conv")
                else np.float32 for n in args}
    _, ref_args, _ = ref_amp.convert_model(sym, dict(args), dict(aux), target_dtype=dtype,
                                           target_dtype_ops=["Convolution"],
                                           cast_optional_params=cast_optional_params)
    assert {n: np.dtype(a.dtype) for n, a in ref_args.items()} == expected
    mod = mx.mod.Module(conv, context=mx.cpu())
    mod.bind(data_shapes=[("data", DATA_SHAPE)], label_shapes=[("softmax_label", (2,))])
    mod.set_params(args_c, aux_c)
    assert {n: np.dtype(a.dtype) for n, a in mod._arg_params.items()} == expected
    assert {n: np.dtype(a.dtype) for n, a in mod._aux_params.items()} == \
        dict.fromkeys(aux, np.float32)
    exe = conv.simple_bind(mx.cpu(), data=DATA_SHAPE, grad_req="null")
    assert {n: np.dtype(a.dtype) for n, a in exe.arg_dict.items() if n in args} == expected
    assert {n: a["__dtype__"] for n, a in conv.attr_dict().items() if n in args} == \
        {n: "0" if d == np.float32 else str(12 if dtype == "bfloat16" else 2)
         for n, d in expected.items()}


def test_module_runs_converted_model_on_this_cpu():
    """A float16 Activation has a CPU kernel: the converted Module runs and
    matches float32 within float16's rounding (relative 1e-3). fc2 is listed
    float32: dtype-neutral, it would run in float16, which has no CPU kernel."""
    data = mx.sym.var("data")
    fc = mx.sym.FullyConnected(data, num_hidden=6, name="fc")
    sym = mx.sym.FullyConnected(mx.sym.Activation(fc, act_type="tanh", name="act"),
                                num_hidden=3, name="fc2")
    mod = mx.mod.Module(sym, label_names=None, context=mx.cpu())
    mod.bind(data_shapes=[("data", (4, 5))])
    mod.init_params()
    x = mx.io.DataBatch([mx.nd.random.uniform(shape=(4, 5))])
    mod.forward(x, is_train=False)
    ref = mod.get_outputs()[0].asnumpy()
    conv, args, aux = mxamp.convert_model(sym, *mod.get_params(), target_dtype="float16",
                                          target_dtype_ops=["Activation"],
                                          fp32_ops=["FullyConnected"],
                                          conditional_fp32_ops=[])
    low = mx.mod.Module(conv, label_names=None, context=mx.cpu())
    low.bind(data_shapes=[("data", (4, 5))])
    low.set_params(args, aux)
    low.forward(x, is_train=False)
    out = low.get_outputs()[0].asnumpy()
    assert out.dtype == np.float32
    assert np.abs(out - ref).max() <= 1e-3 * np.abs(ref).max()


@pytest.mark.parametrize("options", [
    dict(target_dtype_ops=["FullyConnected"], fp32_ops=["FullyConnected"]),
    dict(target_dtype_ops=["FullyConnected"], fp32_ops=["Activation"],
         conditional_fp32_ops=[("Activation", "act_type", ["selu"])]),
    dict(target_dtype="float64"),
])
def test_invalid_options_are_both_value_and_assertion_errors(options):
    """Code written for the reference catches AssertionError; mxamp's
    ValueError with a clear message is one too."""
    sym = mx.sym.FullyConnected(mx.sym.var("x"), num_hidden=3, name="fc")
    options = {"target_dtype": "bfloat16", **options}
    with pytest.raises(AssertionError):
        mxamp.convert_symbol(sym, **options)
    with pytest.raises(ValueError, match="cannot be in both|is not supported"):
        mxamp.convert_symbol(sym, **options)
    with pytest.raises(mxamp.OptionError):
        mxamp.convert_symbol(sym, **options)


def test_wrong_types_are_type_and_assertion_errors():
    with pytest.raises(TypeError, match="sym must be an mxnet.symbol.Symbol"):
        mxamp.convert_symbol("not a symbol")
    with pytest.raises(AssertionError):
        mxamp.convert_model(mx.sym.var("x") + 1, [], {})


def user_cast_graphs():
    """(graph, options, shapes, expected input dtypes) in the reference's
    semantics for a float32 model holding casts of its own."""
    data = mx.sym.var("data")
    to_low, to_fp32 = mx.sym.amp_cast(data, dtype=BF16), mx.sym.amp_cast(data, dtype="float32")
    params = dict(data_names=[], cast_optional_params=True)
    yield "cast to both dtypes", mx.sym.Group([to_low, to_fp32]), params, \
        {"data": np.float32}
    yield "cast low twice", mx.sym.Group([to_low, mx.sym.amp_cast(data, dtype=BF16)]), \
        params, {"data": BF16}
    f32, low = mx.sym.var("data", dtype="float32"), mx.sym.var("data2", dtype=BF16)
    yield "multicast of params", mx.sym.amp_multicast(f32, low, num_outputs=2), \
        dict(cast_optional_params=True), {"data": BF16, "data2": BF16}
    low3 = mx.sym.var("data3", dtype=BF16)
    yield "multicast of an op's output", mx.sym.amp_multicast(
        f32, mx.sym.elemwise_add(low, low3), num_outputs=2), \
        dict(target_dtype_ops=[], fp32_ops=[], cast_optional_params=True), \
        {"data": np.float32, "data2": BF16, "data3": BF16}
    yield "multicast and cast", mx.sym.Group([mx.sym.amp_multicast(f32, low, num_outputs=2),
                                              mx.sym.amp_cast(f32, dtype=BF16)]), \
        dict(target_dtype_ops=[], fp32_ops=[], cast_optional_params=True), \
        {"data": BF16, "data2": BF16}


@pytest.mark.parametrize("name, sym, options, expected",
                         list(user_cast_graphs()), ids=lambda v: v if isinstance(v, str) else "")
def test_models_with_their_own_casts_convert(name, sym, options, expected):
    """The user's casts stay as they are; with cast_optional_params a
    parameter they cast to bfloat16 (or feed into an all-bfloat16
    amp_multicast) is stored in bfloat16, as in the reference."""
    user_casts = {n["name"]: n.get("attrs", {}).get("dtype")
                  for n in nodes_of(sym)["nodes"] if n["op"] in ("amp_cast", "amp_multicast")}
    out = mxamp.convert_symbol(sym, target_dtype="bfloat16", **options)
    kept = {n["name"]: n.get("attrs", {}).get("dtype") for n in nodes_of(out)["nodes"]}
    assert {n: kept.get(n, "missing") for n in user_casts} == user_casts
    exe = out.simple_bind(mx.cpu(), **dict.fromkeys(out.list_arguments(), (1, 2)))
    assert {n: np.dtype(a.dtype) for n, a in exe.arg_dict.items()} == \
        {n: np.dtype(d) for n, d in expected.items()}


def converted_bf16():
    """Converted for this CPU (so it runs here, whatever kernels it has)."""
    sym, args, aux = small_model()
    return mxamp.convert_model(sym, args, aux, target_dtype="bfloat16",
                               target_dtype_ops=["Convolution", "FullyConnected"],
                               ctx=mx.cpu())


def test_a_converted_model_is_refused_after_save_and_reload(tmp_path):
    """The marker lives on the input variables: it survives save /
    load_checkpoint and Gluon's export / SymbolBlock.imports."""
    sym, args, aux = converted_bf16()
    prefix = str(tmp_path / "m")
    mx.model.save_checkpoint(prefix, 0, sym, args, aux, remove_amp_cast=False)
    loaded, args2, aux2 = mx.model.load_checkpoint(prefix, 0)
    with pytest.raises(ValueError, match="already converted to bfloat16"):
        mxamp.convert_model(loaded, args2, aux2, target_dtype="float16")
    block = mx.gluon.SymbolBlock.imports(prefix + "-symbol.json", ["data", "softmax_label"],
                                         prefix + "-0000.params")
    block.hybridize()
    block(mx.nd.zeros(DATA_SHAPE), mx.nd.zeros((2,))).wait_to_read()
    with pytest.raises(ValueError, match="already converted to bfloat16"):
        mxamp.convert_hybrid_block(block, target_dtype="bfloat16")


def test_a_converted_model_without_casts_is_refused():
    """keep_io_types=False with every parameter stored low leaves no amp_cast
    at all; the marker still says it was converted."""
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc")
    args = {"fc_weight": mx.nd.ones((4, 3)), "fc_bias": mx.nd.zeros(4)}
    sym, args, aux = mxamp.convert_model(fc, args, {}, target_dtype="bfloat16",
                                         cast_optional_params=True, keep_io_types=False)
    assert [n for n in nodes_of(sym)["nodes"] if n["op"] == "amp_cast"] == []
    with pytest.raises(ValueError, match="already converted to bfloat16"):
        mxamp.convert_model(sym, args, aux, target_dtype="bfloat16")


def bucketing_module():
    """Buckets by sequence length over (batch, length, 3) inputs; the
    layers act per step, so every bucket shares the parameters."""
    def sym_gen(length):
        data = mx.sym.var("data")
        # tanh as its own op: MXNet's oneDNN fusion would pull an Activation
        # into the float32 FullyConnected and fail on its float16 output.
        hidden = mx.sym.tanh(mx.sym.FullyConnected(data, num_hidden=6, flatten=False,
                                                   name="fc"), name="act")
        out = mx.sym.FullyConnected(hidden, num_hidden=2, flatten=False, name="out")
        return out, ("data",), None
    mod = mx.mod.BucketingModule(sym_gen, default_bucket_key=4, context=mx.cpu())
    mod.bind(data_shapes=[("data", (2, 4, 3))], for_training=False)
    mod.init_params()
    mod.switch_bucket(8, data_shapes=[("data", (2, 8, 3))])
    return mod


def forward(mod, length, x):
    shape = (2, length, 3)
    mod.switch_bucket(length, data_shapes=[("data", shape)])
    mod.forward(mx.io.DataBatch([x], bucket_key=length,
                                provide_data=[mx.io.DataDesc("data", shape)]), is_train=False)
    return mod.get_outputs()[0].asnumpy()


def test_convert_bucketing_module_converts_every_bucket():
    """Both bound buckets are converted (float16 tanh: one cast in, one back
    to float32 for the float32 out layer); a bucket made later is converted
    too. The module runs on this CPU and matches float32 to 1e-3."""
    mod = bucketing_module()
    before = {k: m.symbol.tojson() for k, m in mod._buckets.items()}
    converted = mxamp.convert_bucketing_module(mod, target_dtype="float16",
                                               target_dtype_ops=["tanh"],
                                               fp32_ops=["FullyConnected"])
    converted.bind(data_shapes=[("data", (2, 4, 3))], for_training=False)
    assert {k: m.symbol.tojson() for k, m in mod._buckets.items()} == before
    assert sorted(converted._buckets) == [4, 8]
    for module in converted._buckets.values():
        assert mxamp.summarize(module.symbol) == {"amp_cast:float16": 1, "amp_cast:float32": 1}
    x = mx.nd.random.uniform(shape=(2, 4, 3))
    assert np.allclose(forward(converted, 4, x), forward(mod, 4, x), rtol=1e-3, atol=1e-3)
    x = mx.nd.random.uniform(shape=(2, 12, 3))
    low = forward(converted, 12, x)
    assert mxamp.summarize(converted._buckets[12].symbol) == \
        {"amp_cast:float16": 1, "amp_cast:float32": 1}
    assert np.allclose(low, forward(mod, 12, x), rtol=1e-3, atol=1e-3)


def test_convert_bucketing_module_refuses_other_objects():
    with pytest.raises(TypeError, match="must be an mxnet.module.BucketingModule"):
        mxamp.convert_bucketing_module(mx.mod.Module(mx.sym.var("data") + 1))


def test_init_trainer_with_an_optimizer_is_refused_as_by_the_reference():
    """The reference raises TypeError for a bare Optimizer (its loss scaling
    needs a Trainer's step); so does mxamp, saying how to wrap it."""
    optimizer = mx.optimizer.SGD(learning_rate=0.1)
    with pytest.raises(TypeError, match=r"wrap it: gluon.Trainer\(params, optimizer\)"):
        amp.init_trainer(optimizer_or_trainer=optimizer)


# Where mxamp's signature differs from the reference's on purpose, and why.
INTENDED_DIFFERENCES = {
    # The reference places parameters on gpu(0) by default; mxamp keeps the
    # block's own context, so the call works on a CPU-only machine.
    ("convert_hybrid_block", "ctx"): None,
}


def public_functions():
    names = set(ref_module.__all__) | {"convert_bucketing_module"}
    return sorted(n for n in names if inspect.isfunction(getattr(ref_module, n)))


@pytest.mark.parametrize("name", public_functions())
def test_every_reference_function_exists_with_compatible_parameters(name):
    """The reference's parameters come first, in its order, with its
    defaults; mxamp's extra parameters all have defaults."""
    for where in (mxamp, amp):
        ours = inspect.signature(getattr(where, name)).parameters
        theirs = inspect.signature(getattr(ref_module, name)).parameters
        assert list(ours)[:len(theirs)] == list(theirs)
        for param in theirs.values():
            default = INTENDED_DIFFERENCES.get((name, param.name), param.default)
            assert ours[param.name].default == default, param.name
        assert all(p.default is not p.empty for p in list(ours.values())[len(theirs):])


def test_reference_module_layout():
    """`from mxamp import amp` mirrors `from mxnet.contrib.amp import amp`."""
    assert set(ref_module.__all__) <= set(amp.__all__)
    assert amp.bfloat16 == ref_module.bfloat16
    assert set(mxamp.list_lp16_ops("bfloat16")) >= set(ref_amp.list_lp16_ops(ref_module.bfloat16))
    assert mxamp.list_lp16_use_fp32_params("float16") is None
    assert mxamp.list_lp16_use_fp32_params("bfloat16") == {
        op: names for op, names in ref_amp.list_lp16_use_fp32_params(ref_module.bfloat16).items()
        if op in canonical_op_names()}


def test_lists_module_mirrors_the_references():
    """mxamp.amp.lists (mxamp.lists) has the modules of mxnet.contrib.amp.lists
    and nothing else, each with the reference's list names holding the
    default lists (the accessors' values)."""
    import pkgutil
    from mxnet.contrib.amp import lists as reference
    assert mxamp.lists is amp.lists
    modules = sorted(m.name for m in pkgutil.iter_modules(amp.lists.__path__))
    assert modules == sorted(m.name for m in pkgutil.iter_modules(reference.__path__))
    for name in modules:
        ours, theirs = getattr(amp.lists, name), getattr(reference, name)
        dtype = "bfloat16" if name.endswith("bf16") else "float16"
        names = sorted(n for n in dir(theirs) if n.isupper())
        assert sorted(n for n in dir(ours) if n.isupper()) == names
        low = "BF16" if dtype == "bfloat16" else "FP16"
        assert getattr(ours, f"{low}_FUNCS") == mxamp.list_lp16_ops(dtype)
        assert getattr(ours, f"{low}_FP32_FUNCS") == mxamp.list_lp16_fp32_ops(dtype)
        assert ours.FP32_FUNCS == mxamp.list_fp32_ops(dtype)
        assert ours.CONDITIONAL_FP32_FUNCS == mxamp.list_conditional_fp32_ops(dtype)
        with pytest.raises(AttributeError, match="have no 'FUNCS'"):
            ours.FUNCS


WIDEST_BATCH_DOT = dict(target_dtype_ops=[], fp32_ops=[], widest_dtype_ops=["batch_dot"],
                        keep_io_types=False)


def test_conversion_for_this_cpu_runs_here_and_says_what_it_kept(dtype, caplog):
    """batch_dot as a widest op (as the reference's float16 lists have it):
    with its inputs arriving low (keep_io_types=False) it would run low,
    where MXNet's CPU dot has no kernel. Converting for the CPU checks every
    operator that would run low with its real attributes: here batch_dot
    stays float32, the result runs, and one WARNING names what was kept and
    how to get the full graph."""
    sym = mx.sym.batch_dot(mx.sym.var("a"), mx.sym.var("b"), transpose_b=True, name="bd")
    feeds = {n: mx.nd.random.normal(shape=(2, 3, 4)) for n in "ab"}
    ref = sym.bind(mx.cpu(), feeds).forward()[0].asnumpy()
    with caplog.at_level(logging.WARNING, logger="mxamp"):
        conv = mxamp.convert_symbol(sym, target_dtype=dtype, ctx=mx.cpu(), **WIDEST_BATCH_DOT)
    low = {n: mx.nd.amp_cast(a, dtype=to_numpy(12 if dtype == "bfloat16" else 2))
           for n, a in feeds.items()}
    out = conv.bind(mx.cpu(), low).forward()[0].asnumpy()
    assert np.abs(out - ref).max() <= 2e-2 * np.abs(ref).max()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "batch_dot x1" in warnings[0]
    assert "target_device='any'" in warnings[0]
    full = mxamp.convert_symbol(sym, target_dtype=dtype, **WIDEST_BATCH_DOT)
    assert mxamp.summarize(full) == {}  # for any device batch_dot reads the low inputs


def test_target_device_any_gives_the_full_graph(dtype):
    """convert_hybrid_block(target_device='any') converts for any device:
    every Dense runs low whatever this CPU has, parameters stay on the CPU."""
    net = mx.gluon.nn.HybridSequential()
    net.add(mx.gluon.nn.Dense(8, activation="relu"), mx.gluon.nn.Dense(3))
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((2, 4)))
    full = mxamp.convert_hybrid_block(net, target_dtype=dtype, target_device="any")
    casts = mxamp.summarize(full._cached_graph[1])
    # +1 data, +4 weights and biases (relu runs in its input's dtype)
    assert casts[f"amp_cast:{dtype}"] == 5
    assert all(p.list_ctx() == [mx.cpu()] for p in full.collect_params().values())
    with pytest.raises(ValueError, match="target_device must be None, 'any' or an mxnet"):
        mxamp.convert_hybrid_block(net, target_dtype=dtype, target_device="gpu")


@pytest.mark.parametrize("model", ["resnet18_v1", "mobilenetv2_0.25"])
def test_zoo_networks_converted_for_this_cpu_run_natively(model, dtype):
    """Converted for the CPU at hand, the network runs there in both dtypes
    (whatever kernels it lacks stay float32) and stays close to float32."""
    from gluoncv import model_zoo
    net = model_zoo.get_model(model, pretrained=False)
    net.initialize(mx.init.Xavier(magnitude=2))
    net.hybridize()
    x = mx.nd.random.uniform(shape=(1, 3, 224, 224))
    ref = net(x).asnumpy()
    out = mxamp.convert_hybrid_block(net, target_dtype=dtype, ctx=mx.cpu())(x).asnumpy()
    tolerance = 3e-2 if dtype == "bfloat16" else 5e-3
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < tolerance


@pytest.mark.parametrize("option", [
    {"target_dtype_ops": ["elemwise_add"]}, {"fp32_ops": ["elemwise_add"]},
    {"conditional_fp32_ops": [("elemwise_add", "act_type", ["relu"])]},
    {"fp32_ops": ["Convolution", "broadcast_add"]}])
def test_user_lists_naming_a_widest_type_op_are_refused_as_by_the_reference(dtype, option):
    """mxnet.contrib.amp asserts that a user list names only ops of its
    low-precision, float32, neutral or conditional lists; mxamp raises the
    same class (OptionError is an AssertionError), naming the op."""
    sym = mx.sym.elemwise_add(mx.sym.var("a"), mx.sym.var("b"))
    with pytest.raises(AssertionError):
        ref_amp.convert_symbol(sym, target_dtype=dtype, **option)
    what = next(iter(option))
    with pytest.raises(mxamp.OptionError, match=rf"{what} names \['(elemwise|broadcast)_add'\], "
                       "in none of mxnet.contrib.amp's or mxamp's"):
        mxamp.convert_symbol(sym, target_dtype=dtype, **option)


@pytest.mark.parametrize("cast_optional_params", [False, True])
def test_neutral_fully_connected_after_a_low_convolution_pulls_its_parameters_low(
        dtype, cast_optional_params):
    """With only Convolution in the target list, the dtype-neutral
    FullyConnected after it receives low data: the reference runs the fc low
    and so does mxamp, its weight and bias stored low (__dtype__ 2 / 12) and
    read without a cast whatever cast_optional_params, as the reference's type
    inference gives them. Graph inputs and outputs stay float32."""
    data = mx.sym.var("data")
    conv = mx.sym.Convolution(data, kernel=(3, 3), num_filter=4, name="conv")
    sym = mx.sym.FullyConnected(conv, num_hidden=3, name="fc")
    shapes = dict(zip(sym.list_arguments(), sym.infer_shape(data=(1, 2, 6, 6))[0]))
    args = {n: mx.nd.random.uniform(shape=s) for n, s in shapes.items() if n != "data"}
    low = "12" if dtype == "bfloat16" else "2"
    converted, args_c, _ = mxamp.convert_model(sym, args, {}, target_dtype=dtype,
                                               target_dtype_ops=["Convolution"],
                                               cast_optional_params=cast_optional_params)
    stored = {n: converted.attr_dict()[n]["__dtype__"] for n in args}
    expected = {n: low if cast_optional_params or n.startswith("fc") else "0" for n in args}
    assert stored == expected
    assert {n: np.dtype(a.dtype) for n, a in args_c.items()} == \
        {n: np.dtype(to_numpy(int(code))) for n, code in expected.items()}
    in_types, out_types, _ = converted.infer_type(data="float32")
    assert out_types == [np.float32]
    # +1 data to conv; without stored params, +2 conv's parameters (fc's are stored low)
    expected_casts = 1 + (0 if cast_optional_params else 2)
    assert mxamp.summarize(converted) == {f"amp_cast:{dtype}": expected_casts,
                                          "amp_cast:float32": 1}
