"""Every entry point converts a Gluon network whose weights MXNet's own
kernels have run on.

After a forward pass, MXNet's oneDNN kernels leave the weights of grouped
and depthwise convolutions in a blocked layout, in the user's own arrays, and
MXNet's amp_cast cannot reorder such an array into bfloat16 ("could not create
a primitive descriptor for a reorder primitive"). mxamp reads parameters
through plain-layout copies, as the reference converts such models. The
networks: mobilenet0.25 (depthwise convolutions) and shufflenet_v1 (1x1
convolutions in 3 groups), random weights (mxamp.tools.zoo.random_network),
small inputs. Their parameters are taken the way MXNet documents it,
``net(mx.sym.var("data"))`` and ``net.collect_params()``: the user's arrays
themselves, which must come out of every call unchanged. Outputs are compared
with the float32 network by relative L2 error (bfloat16 3e-2, float16 5e-3 as
in test_api; INT8 0.1).
"""
import mxnet as mx
import numpy as np
import pytest
from mxnet.contrib import amp as ref_amp

import mxamp
from mxamp.dtypes import as_numpy
from mxamp.tools.zoo import random_network
from mxamp.verify import no_graph_fusion, run_emulated

NETS = {"depthwise": ("mobilenet0.25", (1, 3, 32, 32)),
        "grouped": ("shufflenet_v1", (1, 3, 64, 64))}
TOL = {"bfloat16": 3e-2, "float16": 5e-3, "int8": 0.1}
# Rounding of one value: half a unit in the last place, relative (8 significand
# bits in bfloat16, 11 in float16), and absolute below float16's normal range.
ROUNDING = {"bfloat16": (2.0 ** -8, 0.0), "float16": (2.0 ** -11, 2.0 ** -25)}


@pytest.fixture(scope="module", params=sorted(NETS))
def model(request):
    """(net, x, float32 output), after an ordinary float32 forward."""
    name, shape = NETS[request.param]
    mx.random.seed(0)  # module-scoped: set up before the per-test seed, whatever ran before
    net = random_network(name, shape)
    x = mx.nd.array(np.random.RandomState(1).uniform(size=shape))
    return net, x, net(x).asnumpy()


def documented(net):
    """The symbol and the user's own parameter arrays, as MXNet documents
    getting them from a hybridized network that has run."""
    sym = net(mx.sym.var("data"))
    params = net.collect_params()
    return (sym, {n: params[n].data() for n in sym.list_arguments() if n != "data"},
            {n: params[n].data() for n in sym.list_auxiliary_states()})


def snapshot(net):
    return {n: (p.data().dtype, p.data().asnumpy()) for n, p in net.collect_params().items()}


def assert_unchanged(net, before):
    after = snapshot(net)
    assert after.keys() == before.keys()
    for name, (dtype, value) in before.items():
        assert after[name][0] == dtype and np.array_equal(after[name][1], value), name


def assert_close(out, ref, tol):
    out = as_numpy(out).astype(np.float32)
    assert np.isfinite(out).all()
    assert np.linalg.norm(out - ref) <= tol * np.linalg.norm(ref)


def run_converted_block(net, x, ref, dtype):
    """Converts the network with convert_hybrid_block and runs the result,
    whose own weights MXNet's kernels then leave in their layouts."""
    block = mxamp.convert_hybrid_block(net, target_dtype=dtype, cast_optional_params=True)
    assert_close(block(x), ref, TOL[dtype])
    return block


def test_the_networks_hold_weights_amp_cast_cannot_read(model):
    """What the tests below rely on, on this CPU: some of the user's weights
    are in a layout MXNet's amp_cast to bfloat16 fails on."""
    net, _, _ = model
    _, args, _ = documented(net)
    failing = []
    for name, array in args.items():
        try:
            mx.nd.amp_cast(array, dtype=mxamp.amp.bfloat16).wait_to_read()
        except mx.base.MXNetError:
            failing.append(name)
    if not failing:
        pytest.skip("MXNet left every weight in a layout amp_cast reads on this CPU")
    assert all(name.endswith("_weight") for name in failing)


@pytest.mark.parametrize("cast_optional_params", [False, True])
@pytest.mark.parametrize("order", ["float32 forward", "converted block's forward"])
def test_convert_model(model, dtype, cast_optional_params, order):
    """Each parameter comes back in the reference's dtype (the reference is
    given plain copies: its lazy casts of blocked arrays fail later) and holds
    the user's value to the dtype's rounding; the model matches float32."""
    net, x, ref = model
    if order != "float32 forward":
        run_converted_block(net, x, ref, dtype)
    before = snapshot(net)
    sym, args, aux = documented(net)
    given = (dict(args), dict(aux))
    options = dict(target_dtype=dtype, cast_optional_params=cast_optional_params)
    converted = mxamp.convert_model(sym, args, aux, **options)
    for now, then in zip((args, aux), given):  # the same arrays in the caller's dicts
        assert now.keys() == then.keys() and all(now[n] is a for n, a in then.items())
    expected = ref_amp.convert_model(sym, {n: a.copy() for n, a in args.items()},
                                     {n: a.copy() for n, a in aux.items()}, **options)
    for given, got, theirs in zip((args, aux), converted[1:], expected[1:]):
        assert {n: np.dtype(a.dtype) for n, a in got.items()} == \
            {n: np.dtype(a.dtype) for n, a in theirs.items()}
        for name, array in got.items():
            value, original = as_numpy(array), given[name].asnumpy()
            rtol, atol = ROUNDING[dtype]
            assert np.allclose(value, original, rtol=rtol, atol=atol), name
    assert_close(run_emulated(*converted, {"data": x})[0], ref, TOL[dtype])
    assert_unchanged(net, before)


def test_convert_symbol_then_module_with_the_users_parameters(model, dtype):
    """convert_symbol for this CPU, bound by a Module with data shapes only
    and given the user's arrays with set_params. Bound without MXNet's graph
    fusion: fused, MXNet folds each BatchNorm into a bfloat16 convolution's
    weights, 8% off float32 on this random network, the same graph as the
    Gluon block's within 3%."""
    net, x, ref = model
    before = snapshot(net)
    sym, args, aux = documented(net)
    converted = mxamp.convert_symbol(sym, target_dtype=dtype, data_names=["data"],
                                     ctx=mx.cpu())
    mod = mx.mod.Module(converted, data_names=["data"], label_names=None, context=mx.cpu())
    with no_graph_fusion():
        mod.bind(data_shapes=[("data", x.shape)], for_training=False)
        mod.set_params(args, aux)
        mod.forward(mx.io.DataBatch([x]), is_train=False)
    assert_close(mod.get_outputs()[0], ref, TOL[dtype])
    assert_unchanged(net, before)


def test_gluon_entry_points_after_the_converted_block_ran(model, dtype):
    """After a converted block has run: the network converts again (both
    Gluon and symbol routes), and the oneDNN backend takes the converted
    block with its own weights in MXNet's layouts (its regions compute in
    bfloat16, apply_backend_block's default, hence bfloat16's tolerance)."""
    net, x, ref = model
    block = run_converted_block(net, x, ref, dtype)
    before = snapshot(net)
    again = mxamp.convert_hybrid_block(net, target_dtype=dtype)
    assert_close(again(x), ref, TOL[dtype])
    converted = mxamp.convert_model(*documented(net), target_dtype=dtype)
    assert_close(run_emulated(*converted, {"data": x})[0], ref, TOL[dtype])
    on_backend = mxamp.gluon.apply_backend_block(block)
    assert_close(on_backend(x), ref, TOL["bfloat16"])
    assert_unchanged(net, before)


@pytest.mark.parametrize("order", ["float32 forward", "converted block's forward"])
def test_quantization_entry_points(model, order):
    """quantize_model on the user's arrays and quantize_net_v2 on the network
    (calibrated on the input itself, min/max)."""
    net, x, ref = model
    if order != "float32 forward":
        run_converted_block(net, x, ref, "bfloat16")
    before = snapshot(net)
    sym, args, aux = documented(net)
    qsym, qargs, qaux = mxamp.quantization.quantize_model(
        sym, args, aux, data_names=("data",), label_names=None, calib_mode="naive",
        calib_data=mx.io.NDArrayIter(x.asnumpy(), batch_size=1))
    exe = qsym.bind(mx.cpu(), {**qargs, "data": x}, aux_states=qaux, grad_req="null")
    assert_close(exe.forward(is_train=False)[0], ref, TOL["int8"])
    block = mxamp.quantization.quantize_net_v2(net, calib_mode="naive", calib_data=[x])
    assert_close(block(x), ref, TOL["int8"])
    assert_unchanged(net, before)
