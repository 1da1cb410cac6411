"""Bias correction: each INT8 layer's bias takes the mean shift that rounding
its weights to int8 gives its outputs, sum((w - q) * mean) per output
channel, from the channel means of its data that calibration gathers
(calibrate.Collector's `means`; the backend's finishing pass corrects the
biases, src/operator/onednn/s8_weights.cc)."""
import logging

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon import nn

import mxamp.quantization as quantization
from mxamp.backends.onednn import mean_axes
from mxamp.graph import Graph
from mxamp.quantization import calibrate
from mxamp.verify import relative_error

from isa import require_onednn3

require_onednn3()

# The weights' levels (127, or 64 without VNNI) change what rounding shifts.
pytestmark = pytest.mark.cpu

SHAPE = (4, 3, 8, 8)


def net_of():
    """A convolution with a bias, a grouped one without, a flattening Dense:
    data of non-zero mean (pixels in [0, 1), then ReLU outputs), where
    rounding the weights shifts the outputs' means."""
    with mx.name.NameManager():
        net = nn.HybridSequential()
        net.add(nn.Conv2D(16, 3, padding=1), nn.Activation("relu"),
                nn.Conv2D(16, 3, padding=1, groups=4, use_bias=False), nn.Activation("relu"),
                nn.Dense(10))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros(SHAPE))
    net[0].bias.set_data(mx.nd.array(np.linspace(-0.5, 0.5, 16)))
    return net


def batches(n=3, seed=1):
    rng = np.random.RandomState(seed)
    return [mx.nd.array(rng.uniform(0, 1, SHAPE)) for _ in range(n)]


def layer_inputs(net, data):
    """Each layer's data over all of `data`, as float32 computes it."""
    x = mx.nd.concat(*data, dim=0)
    a1 = net[1](net[0](x))
    return [x.asnumpy(), a1.asnumpy(), net[3](net[2](a1)).asnumpy()]


def test_biases_take_the_mean_shift_of_the_weights_rounding(caplog):
    net, data = net_of(), batches()
    originals = [net[0].weight.data().asnumpy(), net[2].weight.data().asnumpy(),
                 net[4].weight.data().asnumpy()]
    biases = [net[0].bias.data().asnumpy(), np.zeros(16), net[4].bias.data().asnumpy()]
    with caplog.at_level(logging.INFO, logger="mxamp.backends.onednn"):
        qnet = quantization.quantize_net_v2(net, calib_data=data, calib_mode="naive")
    assert "INT8: 3 layers' biases corrected for the mean shift of their weights' " \
        "rounding" in caplog.text
    params = {n: p.data().asnumpy() for n, p in qnet.collect_params().items()}
    # The packs hold the layers in the graph's order: conv0, conv1, dense0.
    scales4, scales2 = params["_op0_weight_scales_4d"], params["_op0_weight_scales_2d"]
    rounded = [params["_op0_weight_s8_3x3x3"] * scales4[:16],
               params["_op0_weight_s8_4x3x3"] * scales4[16:],
               params["_op0_weight_s8_1024"] * scales2]
    inputs = layer_inputs(net, data)
    means = [x.mean(axis=(0, 2, 3)) for x in inputs]
    errors = [w.astype(np.float64) - q for w, q in zip(originals, rounded)]
    # conv1: 4 groups of 4 input channels; dense0: each of its 1024 inputs
    shifts = [np.einsum("oikl,i->o", errors[0], means[0]),
              np.einsum("gjikl,gi->gj", errors[1].reshape(4, 4, 4, 3, 3),
                        means[1].reshape(4, 4)).ravel(),
              errors[2] @ inputs[2].reshape(len(inputs[2]), -1).mean(axis=0)]
    expected = np.concatenate([b + s for b, s in zip(biases, shifts)])
    np.testing.assert_allclose(params["_op0_bias_folded"], expected, rtol=1e-5, atol=1e-7)
    assert not set(params) & {"conv0_bias", "dense0_bias"}  # the region reads the new ones
    # the shifts are not negligible
    assert all(np.abs(s).max() > 5e-4 for s in shifts), [np.abs(s).max() for s in shifts]


def test_a_folded_batchnorm_bias_is_corrected_too():
    """conv0 -> BatchNorm -> conv1, nothing between: conv0's bias is the
    BatchNorm folded in, then corrected for the folded weights' rounding;
    conv1's data is the BatchNorm's output (its mean looked up before the
    fold makes conv1 read conv0)."""
    with mx.name.NameManager():
        net = nn.HybridSequential()
        net.add(nn.Conv2D(16, 3, padding=1), nn.BatchNorm(),
                nn.Conv2D(8, 3, padding=1, use_bias=False))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros(SHAPE))
    rng = np.random.RandomState(5)
    bn = net[1]
    for param, values in ((bn.gamma, rng.uniform(0.5, 1.5, 16)), (bn.beta, rng.normal(0, 0.1, 16)),
                          (bn.running_mean, rng.normal(0, 0.1, 16)),
                          (bn.running_var, rng.uniform(0.5, 1.5, 16))):
        param.set_data(mx.nd.array(values))
    data = batches()
    qnet = quantization.quantize_net_v2(net, calib_data=data, calib_mode="naive")
    params = {n: p.data().asnumpy() for n, p in qnet.collect_params().items()}
    gamma, beta, mean, var = (p.data().asnumpy() for p in
                              (bn.gamma, bn.beta, bn.running_mean, bn.running_var))
    factor = (gamma.astype(np.float64) / np.sqrt(var + 1e-5)).astype(np.float32)
    folded = net[0].weight.data().asnumpy() * factor[:, None, None, None]
    scales = params["_op0_weight_scales_4d"]
    rounded = [params["_op0_weight_s8_3x3x3"] * scales[:16],
               params["_op0_weight_s8_16x3x3"] * scales[16:]]
    x = mx.nd.concat(*data, dim=0)
    means = [x.asnumpy().mean(axis=(0, 2, 3)), bn(net[0](x)).asnumpy().mean(axis=(0, 2, 3))]
    shifts = [np.einsum("oikl,i->o", w.astype(np.float64) - q, m)
              for w, q, m in zip((folded, net[2].weight.data().asnumpy()), rounded, means)]
    expected = np.concatenate([(net[0].bias.data().asnumpy() - mean) * factor + beta + shifts[0],
                               shifts[1]])
    np.testing.assert_allclose(params["_op0_bias_folded"], expected, rtol=1e-5, atol=1e-6)
    assert np.abs(shifts[1]).max() > 1e-3, shifts[1]


def test_the_corrected_model_is_closer_to_float32(monkeypatch):
    """A Dense layer on data of mean 1 and deviation 0.3: most of what
    rounding its weights costs is the mean shift, which the correction takes
    away. The same calibration without it: 1.9x the error (measured; 2.6x
    without VNNI, whose weights take 64 levels)."""
    with mx.name.NameManager():
        net = nn.Dense(32)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    rng = np.random.RandomState(0)
    data, x = ([mx.nd.array(rng.uniform(0.5, 1.5, (n, 256))) for _ in range(k)]
               for n, k in ((16, 4), (64, 1)))
    expected = net(x[0]).asnumpy()

    def error():
        model = quantization.quantize_net_v2(net, calib_data=data, calib_mode="naive")
        return relative_error(model(x[0]).asnumpy(), expected)
    corrected = error()
    monkeypatch.setattr(quantization.api, "data_means", lambda stats: {})
    plain = error()
    assert corrected < 0.7 * plain, (corrected, plain)


def test_tune_int8_corrects_biases_too():
    net, data = net_of(), batches()
    x = batches(1, seed=7)[0]
    tuned = quantization.tune_int8(net, data, lambda model: 0.0, max_drop=1.0)
    assert tuned.excluded == []
    direct = quantization.quantize_net_v2(net, calib_data=data, calib_mode="naive")
    np.testing.assert_array_equal(tuned.model(x).asnumpy(), direct(x).asnumpy())


def fc_model():
    data = mx.sym.var("data")
    out = mx.sym.FullyConnected(data, num_hidden=2, flatten=False, name="fc")
    weight = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    return out, {"fc_weight": mx.nd.array(weight), "fc_bias": mx.nd.zeros(2)}


def test_the_collector_averages_each_channel():
    """Means along the asked axis over every example of every batch, run in
    slices of `rows`; a tensor whose channels change between batches gets
    none."""
    sym, params = fc_model()
    rng = np.random.RandomState(0)
    data = [rng.normal(2, 1, (5, 3, 4)), rng.normal(-1, 1, (3, 3, 4)),
            rng.normal(0, 1, (2, 6, 4))]
    tool = calibrate.Collector(sym, params, {}, ["data", "fc_output"], ["data"], "naive",
                               rows=2, means={"data": -1, "fc_output": 1})
    tool.run([mx.nd.array(d) for d in data[:2]])
    stats = tool.stats()
    seen = np.concatenate(data[:2])
    np.testing.assert_allclose(stats["data"].mean, seen.mean(axis=(0, 1)), rtol=1e-6)
    outputs = seen @ params["fc_weight"].asnumpy().T
    np.testing.assert_allclose(stats["fc_output"].mean, outputs.mean(axis=(0, 2)), rtol=1e-5)
    tool.run([mx.nd.array(data[2])])  # fc_output's axis 1 now has 6 channels
    stats = tool.stats()
    assert stats["fc_output"].mean is None
    np.testing.assert_allclose(stats["data"].mean,
                               np.concatenate([d.reshape(-1, 4) for d in data]).mean(axis=0),
                               rtol=1e-6)


def test_mean_axes_name_each_layers_data_and_its_channels():
    """Channels-first convolutions average axis 1, FullyConnected layers
    with flatten=False the last, flattening ones each value of an example
    (None); casts are
    looked through; a channels-last convolution, data that is not a node's
    output 0 and data whose readers average different axes get no mean."""
    data, other = mx.sym.var("data"), mx.sym.var("other")
    conv = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), name="conv")
    relu = mx.sym.relu(conv, name="relu")
    fc = mx.sym.FullyConnected(mx.sym.amp_cast(relu, dtype="float32", name="cast"),
                               num_hidden=3, name="fc")
    tail = mx.sym.FullyConnected(fc, num_hidden=2, flatten=False, name="tail")
    nhwc = mx.sym.Convolution(other, num_filter=4, kernel=(3, 3), layout="NHWC", name="nhwc")
    halves = mx.sym.split(other, num_outputs=2, axis=1, name="halves")
    second = mx.sym.FullyConnected(halves[1], num_hidden=2, name="second")
    # read by a convolution (axis 1) and a FullyConnected (each value): none
    both = mx.sym.relu(other, name="both")
    apart = [mx.sym.Convolution(both, num_filter=2, kernel=(1, 1), name="apart_conv"),
             mx.sym.FullyConnected(both, num_hidden=2, name="apart_fc")]
    graph = Graph(mx.sym.Group([tail, nhwc, second] + apart))
    assert mean_axes(graph) == {"data": 1, "relu": None, "fc": -1}
