"""AMP training (mxamp.training): operator patching, loss scaling, registration,
and float16 / bfloat16 training accuracy against float32 on scikit-learn's digits.

MXNet 1.9.1 has no float16 Convolution / FullyConnected kernels on any CPU, and
bfloat16 ones only with AVX512 (oneDNN): the patch keeps an op without a kernel
in float32, so expectations that depend on the CPU are taken from
``mxamp.convert.probe.has_kernel`` and say so."""
import collections
import json
import types

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn, rnn
from sklearn.datasets import load_digits

from mxamp import cpu, training
from mxamp.training import patch
from mxamp.graph import infer_entry_types
from mxamp.training import LossScaler
from mxamp.dtypes import as_numpy, to_numpy
from mxamp.policy import list_lp16_ops

BF16 = np.dtype(to_numpy(12))
FP16 = np.dtype(np.float16)
FP32 = np.dtype(np.float32)
INT32 = np.dtype(np.int32)
# float16 on a CPU: the default low-precision ops have no kernel here, so ops
# that have one (Activation, Pooling, sigmoid) are added; Activation leaves
# the conditional list (its softrelu rule) for that.
FP16_CPU_LISTS = dict(
    target_precision_ops=list_lp16_ops("float16") + ["Activation", "Pooling", "sigmoid"],
    conditional_fp32_ops=[])


# Whether MXNet runs FullyConnected / Convolution in bfloat16 here (AVX-512).
BF16_KERNELS = cpu.mxnet_has_bfloat16()


@pytest.fixture(autouse=True)
def _amp_off():
    """Every test starts and ends with AMP off and nothing registered."""
    training.deinit()
    yield
    training.deinit()
    patch._REGISTERED.clear()


_SUFFIXES = ("", ".op", "._internal", ".contrib", ".linalg", ".sparse", ".image", ".random")


def _snapshot():
    """{"mx.nd.op" ...: the namespace's attributes} (not keyed by __name__:
    loading an extension library renames mx.nd to 'mxnet.ndarray.op')."""
    return {label + suffix: dict(vars(space))
            for label, root in (("mx.nd", mx.nd), ("mx.sym", mx.sym))
            for suffix, space in zip(_SUFFIXES, patch._namespaces(root))}


def _changed(before, after):
    """Names whose object differs (by identity) between two snapshots."""
    return sorted(f"{space}.{name}" for space in before
                  for name in before[space].keys() | after[space].keys()
                  if before[space].get(name, before) is not after[space].get(name, after))


def _casts(sym):
    """Counter of (op, dtype) over the amp_cast / amp_multicast nodes of `sym`."""
    nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
    return collections.Counter((n["op"], n.get("attrs", {}).get("dtype"))
                               for n in nodes if n["op"] in ("amp_cast", "amp_multicast"))


# --- patching and restoring --------------------------------------------------------

NEUTRAL = {"float16": ("Flatten", "Pooling", "amp_cast", "op.Reshape", "contrib.arange_like"),
           "bfloat16": ("relu", "Concat", "sqrt", "tanh", "op.clip")}


@pytest.mark.parametrize("dtype, listed", [
    ("float16", {"FullyConnected", "op.FullyConnected", "elemwise_add", "softmax",
                 "Activation", "contrib.interleaved_matmul_selfatt_qk", "linalg.gemm2",
                 "elemwise_mul"}),
    ("bfloat16", {"FullyConnected", "op.FullyConnected", "elemwise_add", "softmax",
                  "Activation", "Deconvolution", "contrib.quadratic", "linalg.gemm2"}),
])
def test_deinit_restores_every_attribute(dtype, listed):
    """init replaces the functions of listed ops (low precision, widest, float32,
    conditional) in every namespace of mx.nd and mx.sym, and nothing else;
    deinit puts back the very same objects."""
    before = _snapshot()
    training.init(dtype)
    patched = set(_changed(before, _snapshot()))
    for root in ("mx.nd", "mx.sym"):
        assert {f"{root}.{name}" for name in listed} <= patched
        # dtype-neutral ops are left alone (the reference's bfloat16 lists put
        # Flatten, Reshape and Cast, amp_cast's operator, in float32)
        assert not {f"{root}.{name}" for name in NEUTRAL[dtype]} & patched
    assert mx.nd.FullyConnected is mx.nd.op.FullyConnected  # one wrapper per function
    training.deinit()
    assert _changed(before, _snapshot()) == []


def test_amp_scope_restores_and_keeps_an_outer_init():
    before = _snapshot()
    with pytest.raises(KeyError):
        with training.amp_scope("bfloat16"):
            assert mx.nd.FullyConnected is not before["mx.nd"]["FullyConnected"]
            raise KeyError("the body fails")
    assert _changed(before, _snapshot()) == []
    training.init("bfloat16")
    patched = _snapshot()
    with training.amp_scope("bfloat16"):  # same settings: already on, left on
        pass
    assert _changed(patched, _snapshot()) == []


def test_init_twice():
    training.init("float16")
    patched = _snapshot()
    training.init("float16")
    training.init(np.float16)  # the same target spelled as a numpy type
    assert _changed(patched, _snapshot()) == []
    with pytest.raises(RuntimeError, match="different settings.*'float16'.*deinit"):
        training.init("bfloat16")
    with pytest.raises(RuntimeError, match="different settings.*deinit"):
        training.init("float16", fp32_ops=["softmax"])
    with pytest.raises(RuntimeError, match="different settings.*deinit"):
        training.init("float16", ctx=mx.gpu(0))


def test_init_validates_arguments():
    with pytest.raises(ValueError, match="target_dtype 'float64' is not supported"):
        training.init("float64")
    with pytest.raises(ValueError, match=r"fp32_ops names operators MXNet does not know: "
                                         r"'NoSuchOp'; see"):
        training.init("float16", fp32_ops=["NoSuchOp"])
    with pytest.raises(TypeError, match="target_precision_ops must be a list of str"):
        training.init("float16", target_precision_ops="FullyConnected")
    with pytest.raises(ValueError, match=r"both target_precision_ops and conditional_fp32_ops: "
                                         r"\['Activation'\]"):
        training.init("float16", target_precision_ops=["Activation"])
    with pytest.raises(ValueError, match="cannot train in bfloat16.*Deconvolution"):
        training.init("bfloat16", target_precision_ops=["Deconvolution"], fp32_ops=[])
    with pytest.raises(TypeError, match="ctx must be an mxnet.Context.*got 'cpu'"):
        training.init("bfloat16", ctx="cpu")
    assert patch._active is None


# --- what the wrappers do -------------------------------------------------------------

def test_ndarray_casts_float16():
    """Each category on NDArrays: float16 target on a CPU, where Pooling,
    BatchNorm and take have float16 kernels and FullyConnected has none."""
    x, w, b = mx.nd.ones((2, 4)), mx.nd.ones((3, 4)), mx.nd.zeros((3,))
    with pytest.raises(mx.MXNetError):  # mixed dtypes fail without AMP
        mx.nd.elemwise_add(x.astype(FP16), x)
    training.init("float16", target_precision_ops=["FullyConnected", "Pooling", "BatchNorm",
                                                   "take"])
    image = mx.nd.ones((2, 3, 4, 4))
    low = mx.nd.Pooling(image, kernel=(2, 2), stride=(2, 2), pool_type="max")
    assert low.dtype == FP16
    assert mx.nd.FullyConnected(x, w, b, num_hidden=3).dtype == FP32  # no CPU kernel
    assert mx.nd.elemwise_add(low, image[:, :, :2, :2]).dtype == FP32  # widest
    assert mx.nd.elemwise_add(low, low).dtype == FP16
    assert mx.nd.softmax(low).dtype == FP32  # float32 list
    assert mx.nd.Activation(low, act_type="softrelu").dtype == FP32  # conditional: matches
    assert mx.nd.Activation(low, act_type="relu").dtype == FP16  # conditional: no match
    # integer indices stay int32; the data is cast
    assert mx.nd.take(x, mx.nd.array([1, 0], dtype="int32")).dtype == FP16
    # BatchNorm: data cast, its float32 statistics neither cast nor copied, so
    # the in-place update of the running mean still reaches them
    stats = [mx.nd.ones((3,)), mx.nd.zeros((3,)), mx.nd.zeros((3,)), mx.nd.ones((3,))]
    stats[0].attach_grad()
    with autograd.record():
        normed = mx.nd.BatchNorm(image * 2, *stats)
    normed.backward()  # MXNet updates the running statistics here
    assert normed.dtype == FP16
    np.testing.assert_allclose(stats[2].asnumpy(), [0.2] * 3, rtol=1e-3)  # 0.1 * mean 2
    out = mx.nd.zeros((2, 3, 2, 2), dtype=FP16)
    # out= is written, not cast
    mx.nd.Pooling(image, kernel=(2, 2), stride=(2, 2), pool_type="max", out=out)
    assert out.asnumpy().tolist() == np.ones((2, 3, 2, 2)).tolist()
    keyword = mx.nd.Pooling(data=image, kernel=(2, 2), stride=(2, 2), pool_type="avg")
    assert keyword.dtype == FP16  # inputs given by keyword are cast too


@pytest.mark.cpu
def test_ndarray_casts_bfloat16():
    """bfloat16: FullyConnected runs in bfloat16 where the CPU has the kernel
    (AVX512-BF16), else stays float32; Deconvolution always stays float32."""
    training.init("bfloat16")
    x, w = mx.nd.ones((2, 4)), mx.nd.ones((3, 4))
    fc = mx.nd.FullyConnected(x, w, num_hidden=3, no_bias=True)
    assert fc.dtype == (BF16 if BF16_KERNELS else FP32)
    assert mx.nd.Deconvolution(mx.nd.amp_cast(mx.nd.ones((1, 2, 4, 4)), dtype=BF16),
                               mx.nd.ones((2, 2, 3, 3)), kernel=(3, 3), num_filter=2,
                               no_bias=True).dtype == FP32


def test_symbol_casts_float16():
    """Symbols built under init('float16') for a GPU carry the casts the lists
    ask for; on the CPU FullyConnected is cast to float32 instead."""
    training.init("float16", ctx=mx.gpu(0))  # not probed here: the full lists
    data = mx.sym.var("data")
    fc = mx.sym.FullyConnected(data, num_hidden=4, name="fc")  # weight, bias made inside
    act = mx.sym.Activation(fc, act_type="softrelu", name="act")
    out = mx.sym.softmax(mx.sym.elemwise_add(act, data, name="add"), name="sm")
    assert _casts(out) == {("amp_cast", "float16"): 3, ("amp_cast", "float32"): 2,
                           ("amp_multicast", None): 1}
    nodes = json.loads(out.tojson(remove_amp_cast=False))["nodes"]
    fc_inputs = [nodes[i[0]]["name"] for i in next(n for n in nodes if n["name"] == "fc")["inputs"]]
    assert fc_inputs == ["fc_amp_cast0", "fc_amp_cast1", "fc_amp_cast2"]
    assert out.list_arguments() == ["data", "fc_weight", "fc_bias"]
    _, out_types, _ = out.infer_type(data=np.float32, fc_weight=np.float32, fc_bias=np.float32)
    assert out_types == [np.float32]
    relu = mx.sym.Activation(fc, act_type="relu", name="relu")  # conditional, no match
    assert _casts(relu) == {("amp_cast", "float16"): 3}
    bn = mx.sym.BatchNorm(fc, name="bn", fix_gamma=False)
    assert _casts(bn) == {("amp_cast", "float16"): 3}  # BatchNorm is dtype-neutral
    training.deinit()
    training.init("float16")  # no GPU here: checked on the CPU
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc")
    assert _casts(fc) == {("amp_cast", "float32"): 3}
    # amp_multicast fails in CPU graphs with float16 inputs: float32 casts instead
    add = mx.sym.elemwise_add(mx.sym.var("a"), mx.sym.var("b"))
    assert _casts(add) == {("amp_cast", "float32"): 2}


def _op_dtypes(sym, known):
    """{node name: output dtype code} of the operator nodes of `sym`."""
    nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
    types = infer_entry_types(sym, known)
    return {n["name"]: types[(i, 0)] for i, n in enumerate(nodes)
            if n["op"] not in ("null", "amp_cast", "amp_multicast")}


def test_hybridized_graph_runs_ops_as_conversion_does():
    """A CNN hybridized under init runs every operator in the same dtype as
    mxamp.convert_hybrid_block gives it for the same lists and context."""
    import mxamp
    net = _cnn()
    net.initialize()
    x = mx.nd.ones((2, 1, 8, 8))
    net.hybridize()
    net(x)
    converted = mxamp.convert_hybrid_block(net, "float16", ctx=mx.cpu(), **{
        "target_dtype_ops": FP16_CPU_LISTS["target_precision_ops"], "conditional_fp32_ops": []})
    params = {p.name: 0 for p in net.collect_params().values()}
    expected = _op_dtypes(converted._cached_graph[1], {"data": 0, **params})
    del converted  # a live SymbolBlock keeps init() from starting
    net.hybridize()  # drop the float32 graph
    training.init("float16", **FP16_CPU_LISTS)
    net(x)
    amp_graph = net._cached_graph[1]
    got = _op_dtypes(amp_graph, {"data": 0, **params})
    assert got == expected
    assert sorted(got.values()).count(2) == 6  # 3 Activation, 2 Pooling, Flatten: float16
    # Convolution / FullyConnected: no float16 CPU kernel, cast to float32
    assert _casts(amp_graph) == {("amp_cast", "float16"): 5, ("amp_cast", "float32"): 12}


def test_init_refuses_blocks_with_a_built_graph():
    net = nn.Dense(3, prefix="built_")
    net.initialize()
    net.hybridize()
    net(mx.nd.ones((2, 4)))
    with pytest.raises(RuntimeError, match=r"already built their graph: \['built'\].*"
                                           r"hybridize\(\) on them again"):
        training.init("float16")
    assert patch._active is None
    net.hybridize()  # drops the cached float32 graph
    training.init("float16")
    net(mx.nd.ones((2, 4)))
    assert _casts(net._cached_graph[1]) == {("amp_cast", "float32"): 3}  # the patch reached it


# --- registration -------------------------------------------------------------------

def _user_module():
    module = types.ModuleType("usermod")
    module.dtypes = lambda *arrays: [a.dtype for a in arrays]
    return module


@pytest.mark.parametrize("register, expected", [
    (training.register_lp16_function, [BF16, BF16, INT32]),
    (training.register_fp32_function, [FP32, FP32, INT32]),
    (training.register_widest_function, [FP32, FP32, INT32]),
])
def test_registered_function(register, expected):
    module = _user_module()
    original = module.dtypes
    register(module, "dtypes")
    args = (mx.nd.amp_cast(mx.nd.ones((1,)), dtype=BF16), mx.nd.ones((1,)),
            mx.nd.ones((1,), dtype="int32"))
    assert module.dtypes(*args) == [BF16, FP32, INT32]  # applied at init(), not before
    with training.amp_scope("bfloat16"):
        assert module.dtypes(*args) == expected
    assert module.dtypes is original


def test_registration_errors():
    module = _user_module()
    with pytest.raises(ValueError, match="'usermod' has no function 'nope'"):
        training.register_lp16_function(module, "nope")
    module.number = 3
    with pytest.raises(ValueError, match="has no function 'number'"):
        training.register_fp32_function(module, "number")
    training.register_fp32_function(module, "dtypes")
    training.register_fp32_function(module, "dtypes")  # same again: fine
    with pytest.raises(ValueError, match="already registered as float32"):
        training.register_lp16_function(module, "dtypes")
    training.init("bfloat16")
    with pytest.raises(RuntimeError, match="register functions before mxamp.init"):
        training.register_widest_function(_user_module(), "dtypes")


# --- trainer and loss scaler ------------------------------------------------------------

def _dense_trainer(scaler=None, rescale=1.0, **trainer_kwargs):
    mx.random.seed(1)
    net = nn.Dense(3, in_units=4)
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.1, "rescale_grad": rescale}, **trainer_kwargs)
    if scaler is not None:
        training.init_trainer(trainer, scaler)
    return net, trainer


def _backward(net, trainer, data):
    with autograd.record():
        loss = (net(data) ** 2).sum()
        with training.scale_loss(loss, trainer) as scaled:
            scaled.backward()


def _params(net):
    """Copies of the parameters, in order (weight, bias)."""
    return [p.data().asnumpy().copy() for p in net.collect_params().values()]


def test_overflow_skips_the_step_and_halves_the_scale():
    scaler = LossScaler(init_scale=2.0 ** 10)
    net, trainer = _dense_trainer(scaler)
    data = mx.nd.ones((2, 4))
    _backward(net, trainer, data)
    net.weight.grad()[0, 0] = np.inf  # an overflowed gradient
    before = _params(net)
    trainer.step(2)
    assert scaler.loss_scale == 2.0 ** 9
    for old, new in zip(before, _params(net)):
        np.testing.assert_array_equal(new, old)  # the update was skipped
    _backward(net, trainer, data)
    trainer.step(2)  # clean step: applied
    assert scaler.loss_scale == 2.0 ** 9
    assert not np.array_equal(_params(net)[0], before[0])


def test_scale_grows_after_the_window_within_bounds():
    scaler = LossScaler(init_scale=4.0, scale_window=3, min_scale=2.0, max_scale=8.0)
    net, trainer = _dense_trainer(scaler)
    seen = []
    for _ in range(7):
        _backward(net, trainer, mx.nd.ones((2, 4)))
        trainer.step(2)
        seen.append(scaler.loss_scale)
    assert seen == [4, 4, 8, 8, 8, 8, 8]  # doubles after 3 clean steps, capped at 8
    for _ in range(3):
        _backward(net, trainer, mx.nd.ones((2, 4)))
        net.bias.grad()[1] = np.nan
        trainer.step(2)
        seen.append(scaler.loss_scale)
    assert seen[7:] == [4, 2, 2]  # halves, floored at 2
    with pytest.raises(AttributeError):
        scaler.loss_scale = 1.0


def test_overflow_check_covers_every_chunk():
    """More gradients than one multi_all_finite call takes: an inf in the last
    chunk is still seen."""
    params = gluon.ParameterDict()
    for i in range(450):
        params.get(f"p{i}", shape=(2,))
    params.initialize()
    for p in params.values():
        p.grad()[:] = 1
    scaler = LossScaler()
    assert not scaler.has_overflow(params.values())
    list(params.values())[-1].grad()[1] = -np.inf
    assert scaler.has_overflow(params.values())
    assert scaler.loss_scale == 2.0 ** 15


@pytest.mark.parametrize("rescale", [1.0, 0.5])
def test_unscale_then_clip_matches_float32(rescale):
    """Gradients clipped after unscale equal the float32 run's, and so do the
    updated weights (the trainer's own rescale_grad still applies)."""
    data = mx.nd.array(np.random.RandomState(0).uniform(-2, 2, (5, 4)))
    runs = []
    for scaler in (None, LossScaler(init_scale=2.0 ** 12)):
        net, trainer = _dense_trainer(scaler, rescale)
        if scaler is not None:
            _backward(net, trainer, data)
            assert net.weight.grad().abs().max().asscalar() > 100  # scaled by 2**12
            training.unscale(trainer)
            training.unscale(trainer)  # twice: the second does nothing
        else:
            with autograd.record():
                loss = (net(data) ** 2).sum()
            loss.backward()
        grads = [p.grad() for p in net.collect_params().values()]
        norm = gluon.utils.clip_global_norm(grads, 1.0)
        clipped = [g.asnumpy().copy() for g in grads]
        trainer.step(5)
        runs.append((norm, clipped, _params(net)))
    (norm32, grads32, params32), (norm, grads, params) = runs
    assert norm > 1.0 and norm == pytest.approx(norm32, rel=1e-6)
    for expected, got in zip(grads32 + params32, grads + params):
        np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_default_scalers():
    """float16: dynamic from 2**16; bfloat16: scale 1, nothing checked or skipped."""
    net, trainer = _dense_trainer()
    with pytest.raises(RuntimeError, match="call mxamp.init"):
        training.init_trainer(trainer)
    with training.amp_scope("float16"):
        scaler = training.init_trainer(trainer)
        assert (scaler.loss_scale, scaler.dynamic) == (2.0 ** 16, True)
        assert training.get_loss_scaler(trainer) is scaler
        with pytest.raises(RuntimeError, match="already has a loss scaler"):
            training.init_trainer(trainer)
    net, trainer = _dense_trainer()
    with training.amp_scope("bfloat16"):
        scaler = training.init_trainer(trainer)
    assert (scaler.loss_scale, scaler.dynamic) == (1.0, False)
    _backward(net, trainer, mx.nd.ones((2, 4)))
    net.weight.grad()[0, 0] = np.inf
    before = _params(net)[0]
    trainer.step(2)  # bfloat16: nothing checked, nothing skipped
    assert np.isinf(_params(net)[0][0, 0]) and np.isfinite(before).all()


def test_trainer_errors():
    with pytest.raises(TypeError, match=r"takes a mxnet.gluon.Trainer, got "
                                        r"mxnet.optimizer.optimizer.SGD \(wrap it"):
        training.init_trainer(mx.optimizer.SGD(), LossScaler())
    with pytest.raises(TypeError, match="scale_loss takes a mxnet.gluon.Trainer, got builtins.str"):
        with training.scale_loss(mx.nd.ones((1,)), "trainer"):
            pass
    net, trainer = _dense_trainer()
    with pytest.raises(RuntimeError, match="no loss scaler; call mxamp.init_trainer"):
        training.unscale(trainer)
    with pytest.raises(TypeError, match="loss_scaler must be an mxamp LossScaler"):
        training.init_trainer(trainer, 2.0 ** 16)
    _, on_kvstore = _dense_trainer(update_on_kvstore=True)
    with pytest.raises(ValueError, match="update_on_kvstore=False"):
        training.init_trainer(on_kvstore, LossScaler())
    with pytest.raises(ValueError, match="min_scale <= init_scale <= max_scale"):
        LossScaler(init_scale=0.5)
    with pytest.raises(ValueError, match="scale_window must be a positive int, got 0"):
        LossScaler(scale_window=0)
    with pytest.raises(ValueError, match="init_scale must be a positive finite number, got inf"):
        LossScaler(init_scale=float("inf"))


def test_scale_loss_list_and_outside_record():
    net, trainer = _dense_trainer(LossScaler(init_scale=8.0))
    data = mx.nd.ones((2, 4))
    with autograd.record():
        losses = [net(data).sum(), (net(data) * 2).sum()]
    with training.scale_loss(losses, trainer) as scaled:  # after record(): still works
        assert [s.asscalar() for s in scaled] == pytest.approx(
            [8 * l.asscalar() for l in losses])
        autograd.backward(scaled)
    expected = 3 * 8 * data.sum(axis=0).asnumpy()  # d/dW of sum(Wx) + 2 sum(Wx), scaled
    np.testing.assert_allclose(net.weight.grad().asnumpy()[0], expected, rtol=1e-6)


# --- training on digits -----------------------------------------------------------------

def _cnn():
    net = nn.HybridSequential(prefix="cnn_")
    with net.name_scope():
        # Shapes given, so parameters are drawn at initialize(), not at the
        # first forward, which probes kernels (drawing random inputs).
        net.add(nn.Conv2D(8, 3, padding=1, activation="relu", in_channels=1), nn.MaxPool2D(2),
                nn.Conv2D(16, 3, padding=1, activation="relu", in_channels=8), nn.MaxPool2D(2),
                nn.Flatten(), nn.Dense(64, activation="relu", in_units=64),
                nn.Dense(10, in_units=64))
    return net


class _LSTMNet(gluon.HybridBlock):
    """Rows of the 8x8 digit as 8 time steps through an unrolled LSTM cell
    (its gates are Activation ops, which have float16 CPU kernels)."""

    def __init__(self):
        super().__init__(prefix="lstm_")
        with self.name_scope():
            self.cell = rnn.LSTMCell(32, input_size=8)
            self.out = nn.Dense(10, in_units=32)

    def hybrid_forward(self, F, x):
        outputs, _ = self.cell.unroll(8, x, layout="NTC", merge_outputs=False)
        return self.out(outputs[-1])


@pytest.fixture(scope="module")
def digits():
    data = load_digits()
    order = np.random.RandomState(0).permutation(len(data.target))
    x = (data.data[order] / 16.0).astype(np.float32)
    y = data.target[order].astype(np.float32)
    return x[:1400], y[:1400], x[1400:], y[1400:]


def _train(make, shape, digits, amp=None):
    """Test accuracy, the graph's casts, and the steps the loss scaler skipped."""
    x_train, y_train, x_test, y_test = digits
    if amp:
        training.init(amp, **(FP16_CPU_LISTS if amp == "float16" else {}))
    net = make()
    # Seeded here: building layers under AMP can probe kernels, which draws
    # random inputs; parameters must be drawn the same in every run.
    mx.random.seed(0)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01})
    scaler = training.init_trainer(trainer) if amp else None
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    xs, ys = mx.nd.array(x_train.reshape(shape)), mx.nd.array(y_train)
    skipped = 0
    for epoch in range(8):
        trainer.set_learning_rate(0.01 * 0.8 ** epoch)
        for i in range(0, len(xs), 50):
            with autograd.record():
                loss = loss_fn(net(xs[i:i + 50]), ys[i:i + 50])
                if amp:
                    with training.scale_loss(loss, trainer) as scaled:
                        scaled.backward()
                else:
                    loss.backward()
            scale = scaler.loss_scale if amp else None
            trainer.step(loss.shape[0])
            skipped += amp is not None and scaler.loss_scale < scale
    out = net(mx.nd.array(x_test.reshape(shape)))
    casts = _casts(net._cached_graph[1])
    training.deinit()
    accuracy = float((as_numpy(out.argmax(axis=1)) == y_test).mean())
    return accuracy, casts, skipped


@pytest.fixture(scope="module")
def fp32_accuracy(digits):
    return {name: _train(make, shape, digits)[0] for name, make, shape in _NETS}


_NETS = [("cnn", _cnn, (-1, 1, 8, 8)), ("lstm", _LSTMNet, (-1, 8, 8))]


@pytest.mark.parametrize("name, make, shape", _NETS, ids=[n[0] for n in _NETS])
def test_float16_training_matches_float32(name, make, shape, digits, fp32_accuracy):
    """float16 on the CPU: activations and pooling (forward and backward) in
    float16 with dynamic loss scaling; within 1 accuracy point of float32."""
    accuracy, casts, skipped = _train(make, shape, digits, "float16")
    # CNN: 3 Activation + 2 Pooling; LSTM, per step: the sigmoid of the input,
    # forget and output gates and the Activation(tanh) of the cell state
    assert casts[("amp_cast", "float16")] == {"cnn": 5, "lstm": 8 * 4}[name]
    assert fp32_accuracy[name] > 0.9
    assert abs(accuracy - fp32_accuracy[name]) <= 0.01, (fp32_accuracy[name], accuracy, skipped)


@pytest.mark.cpu
@pytest.mark.parametrize("name, make, shape", _NETS, ids=[n[0] for n in _NETS])
def test_bfloat16_training_matches_float32(name, make, shape, digits, fp32_accuracy):
    """bfloat16: Convolution / FullyConnected in bfloat16 where this CPU has the
    kernels (else they stay float32); within 1 accuracy point of float32."""
    accuracy, casts, skipped = _train(make, shape, digits, "bfloat16")
    low = BF16_KERNELS
    n_nodes = {"cnn": 4, "lstm": 8 * 2 + 1}[name]  # each with data, weight and bias
    assert casts[("amp_cast", "bfloat16")] == (3 * n_nodes if low else 0)
    assert casts[("amp_cast", "float32")] >= (0 if low else 3 * n_nodes)
    assert skipped == 0
    assert abs(accuracy - fp32_accuracy[name]) <= 0.01, (fp32_accuracy[name], accuracy)
