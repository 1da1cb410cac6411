"""mxamp.quantization.calibrate: thresholds against hand-computed values and a
plain reference, ranges and histograms against numpy over all batches
together, the example limit, per-channel weight scales and every error."""
import dataclasses
import logging

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon import nn

from mxamp import gluon
from mxamp.errors import OptionError, OptionTypeError
from mxamp.quantization import calibrate

import nets

SHAPE = (4, 3, 8, 8)
TENSORS = ["data", "conv_output", "bn_output", "relu_output", "fc_output"]


def small_model():
    """Conv -> BatchNorm -> relu -> FullyConnected."""
    x = mx.sym.Convolution(mx.sym.var("data"), kernel=(3, 3), num_filter=4, name="conv")
    x = mx.sym.relu(mx.sym.BatchNorm(x, name="bn"), name="relu")
    return mx.sym.FullyConnected(x, num_hidden=3, name="fc")


def params(sym):
    return nets.random_params(sym, SHAPE)


def batches(n, scales=None, seed=1):
    rng = np.random.RandomState(seed)
    scales = scales or [1.0] * n
    return [mx.nd.array(rng.normal(0, scale, SHAPE)) for scale in scales]


def collector(mode="naive", names=TENSORS, num_bins=calibrate.NUM_BINS):
    sym = small_model()
    return calibrate.Collector(sym, *params(sym), names, ["data"], mode, num_bins)


def outputs_of(batch_list, names=TENSORS):
    """{name: the tensor of small_model over all batches}."""
    sym = small_model()
    return nets.tensors_over(sym, *params(sym), names, batch_list)


# Thresholds

def test_naive_threshold_is_the_larger_magnitude():
    assert calibrate.naive_threshold(-3.0, 2.0) == 3.0
    assert calibrate.naive_threshold(0.0, 2.5) == 2.5
    assert calibrate.naive_threshold(0.0, 0.0) == 0.0
    np.testing.assert_array_equal(calibrate.naive_threshold(np.array([-1.0, -4.0, 0.0]),
                                                            np.array([2.0, 3.0, 0.5])),
                                  [2.0, 4.0, 0.5])


def reference_divergence(hist, start, stop, levels, eps=1e-4):
    """KL(P || Q) of one candidate slice, step by step as MXNet's Python
    ``_get_optimal_threshold`` loop body does it."""
    p = hist[start:stop].astype(np.float64)
    p[0] += hist[:start].sum()
    p[-1] += hist[stop:].sum()
    merged = len(p) // levels
    q = np.zeros(len(p))
    for j in range(levels):
        end = len(p) if j == levels - 1 else (j + 1) * merged
        group = slice(j * merged, end)
        nonzero = np.count_nonzero(p[group])
        if nonzero:
            q[group] = hist[start:stop][group].sum() / nonzero
    q[p == 0] = 0

    def smoothed(x):
        zeros = x == 0
        if zeros.all() or eps * zeros.sum() / (~zeros).sum() >= 1:
            return None
        return x + eps * zeros - eps * zeros.sum() / (~zeros).sum() * ~zeros

    p, q = smoothed(p), smoothed(q)
    if p is None or q is None:
        return np.inf
    p, q = p / p.sum(), q / q.sum()
    return float(np.sum(p * np.log(p / q)))


def reference_threshold(hist, edges, levels):
    zero = len(hist) // 2
    if not hist[:zero].any():
        levels = 2 * levels + 1
    halves = range(levels // 2, zero + 1)
    divergences = [reference_divergence(hist, zero - h, zero + h + 1, levels) for h in halves]
    return edges[zero + halves[int(np.argmin(divergences))] + 1]


@pytest.mark.parametrize("seed", range(6))
def test_entropy_threshold_is_the_reference_computation(seed):
    rng = np.random.RandomState(seed)
    hist = rng.poisson(3, 41).astype(np.float64)
    hist[rng.rand(41) < 0.3] = 0  # empty bins: the smoothing's case
    hist[40] = 2  # a far outlier worth clipping
    if seed % 2:
        hist[:20] = 0  # non-negative (after ReLU): the u8 case
    edges = np.linspace(-2.0, 2.0, 42)
    assert calibrate.entropy_threshold(hist, edges, 5) == reference_threshold(hist, edges, 5)


def test_entropy_threshold_keeps_mass_that_fits_the_levels():
    """All mass within the central 5 bins: the narrowest slice (5 bins, one
    per level) quantizes without loss, KL 0, and ties go to the smallest."""
    hist = np.zeros(41)
    hist[18:23] = [3, 1, 7, 2, 5]
    edges = np.linspace(-4.1, 4.1, 42)  # bins 0.2 wide, bin 20 centred on 0
    assert calibrate.entropy_threshold(hist, edges, 5) == pytest.approx(0.5)


def test_entropy_threshold_gives_non_negative_tensors_every_level_on_0_t():
    """Nothing below zero: the 5 levels go to [0, T], so 5 filled bins from
    the zero bin on fit without loss (2 * 5 + 1 levels over [-T, T])."""
    hist = np.zeros(41)
    hist[20:25] = [30, 1, 7, 2, 5]
    edges = np.linspace(-4.1, 4.1, 42)
    assert calibrate.entropy_threshold(hist, edges, 5) == pytest.approx(0.2 * 5.5)


def test_entropy_threshold_clips_a_rare_outlier():
    rng = np.random.RandomState(0)
    values = np.concatenate([rng.normal(0, 1, 100000), [40.0]])
    hist, edges = np.histogram(values, 8001, (-40.0, 40.0))
    threshold = calibrate.entropy_threshold(hist, edges)
    assert 3.0 < threshold < 10.0


@pytest.mark.parametrize("relu", [False, True])
def test_entropy_threshold_is_close_to_mxnets_kernel(relu):
    """MXNet 1.9.1's C++ kernel counts two bins unlike its Python original
    (see entropy_threshold): thresholds agree closely, not exactly."""
    values = np.random.RandomState(3).normal(0.2, 1.5, 200000)
    if relu:
        values = np.maximum(values, 0)
    bound = np.abs(values).max()
    hist, edges = np.histogram(values, 8001, (-bound, bound))
    theirs = mx.nd.contrib.calibrate_entropy(mx.nd.array(hist), mx.nd.array(edges),
                                             num_quantized_bins=511 if relu else 255)[0]
    assert calibrate.entropy_threshold(hist, edges) == pytest.approx(theirs.asscalar(), rel=0.05)


def test_entropy_threshold_of_an_empty_or_narrow_histogram_is_its_range():
    edges = np.linspace(-1.0, 1.0, 42)
    assert calibrate.entropy_threshold(np.zeros(41), edges) == 1.0
    hist = np.ones(41)
    assert calibrate.entropy_threshold(hist, edges, 255) == 1.0  # fewer bins than levels


# Collection

def test_ranges_are_numpys_over_all_batches_together():
    batch_list = batches(3, scales=[1.0, 3.0, 0.5])
    tool = collector()
    assert tool.run(batch_list) == 12
    stats = tool.stats()
    expected = outputs_of(batch_list)
    for name in TENSORS:
        assert (stats[name].min, stats[name].max) == (expected[name].min(), expected[name].max())
        assert stats[name].threshold == np.abs(expected[name]).max()
    in_two_runs = collector()
    in_two_runs.run(batch_list[:1])
    assert in_two_runs.run(batch_list[1:]) == 12
    assert in_two_runs.stats() == stats


def test_signed_follows_the_minimum():
    tool = collector()
    tool.run(batches(2))
    stats = tool.stats()
    assert stats["relu_output"].min == 0 and not stats["relu_output"].signed
    assert stats["conv_output"].min < 0 and stats["conv_output"].signed
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats["data"].threshold = 1.0


def test_histograms_are_numpys_over_all_batches_together():
    """The range grows from 1 batch's largest magnitude by factors of 3; the
    re-binned histogram is the one numpy gives over the final range."""
    batch_list = [mx.nd.zeros(SHAPE)] + batches(3, scales=[1.0, 4.0, 30.0])
    tool = collector("entropy", ["data", "relu_output"], num_bins=63)
    tool.run(batch_list)
    together = np.concatenate([b.asnumpy() for b in batch_list])
    hist, edges = tool.histogram("data")
    first = np.abs(batch_list[1].asnumpy()).max()  # the first batch of zeros sets no range
    tripled = round(np.log(edges[-1] / first) / np.log(3))
    assert tripled > 0 and edges[-1] == pytest.approx(first * 3 ** tripled, rel=1e-12)
    assert edges[-1] / 3 < np.abs(together).max() <= edges[-1]
    # Equal here; in general up to values on bin edges (float32 arithmetic).
    np.testing.assert_array_equal(hist, np.histogram(together, 63, (-edges[-1], edges[-1]))[0])
    relu, _ = tool.histogram("relu_output")
    assert not relu[:31].any() and relu.sum() == outputs_of(batch_list)["relu_output"].size


def test_entropy_thresholds_are_those_of_the_histograms():
    tool = collector("entropy")
    tool.run(batches(2))
    for name, found in tool.stats().items():
        hist, edges = tool.histogram(name)
        expected = min(calibrate.entropy_threshold(hist, edges),
                       calibrate.naive_threshold(found.min, found.max))
        assert found.threshold == expected > 0


def test_num_calib_examples_stops_early_and_cuts_the_last_batch():
    consumed = []

    def counted():
        for batch in batches(5):
            consumed.append(batch)
            yield batch
    tool = collector()
    assert tool.run(counted(), num_calib_examples=6) == 6
    assert len(consumed) == 2  # 4 examples, then 2 of the second batch; the third is not read
    first_six = np.concatenate([b.asnumpy() for b in batches(5)])[:6]
    assert tool.stats()["data"].min == first_six.min()
    consumed.clear()
    assert collector().run(counted(), num_calib_examples=8) == 8
    assert len(consumed) == 2


def test_one_executor_serves_batches_of_one_shape(monkeypatch):
    binds = []
    bind = mx.sym.Symbol.simple_bind
    monkeypatch.setattr(mx.sym.Symbol, "simple_bind",
                        lambda *a, **k: binds.append(k.get("data")) or bind(*a, **k))
    collector().run(batches(4), num_calib_examples=14)
    assert binds == [SHAPE, (2,) + SHAPE[1:]]  # the cut last batch needs its own


def test_data_iterators_and_labels_are_accepted():
    batch_list = batches(2)
    together = mx.nd.concat(*batch_list, dim=0)
    calib = mx.io.NDArrayIter(together, mx.nd.zeros(8), batch_size=4)
    tool = collector()
    tool.run(calib)
    assert tool.stats()["data"].max == together.asnumpy().max()


def test_a_loss_layers_label_is_not_needed():
    sym = mx.sym.SoftmaxOutput(small_model(), name="softmax")
    tool = calibrate.Collector(sym, *params(small_model()), ["fc_output", "softmax_output"])
    tool.run(batches(1))
    found = tool.stats()["softmax_output"]
    assert 0 < found.min < found.max < 1 and not found.signed


def test_collect_keys_results_by_a_mapping():
    sym = small_model()
    names = calibrate.tensor_names(sym, ["data"])
    assert names == {"data": "data", "conv_output": "conv", "bn_output": "bn",
                     "relu_output": "relu", "fc_output": "fc"}
    stats = calibrate.collect(sym, *params(sym), names, batches(1), ["data"], "naive")
    assert sorted(stats) == sorted(names.values())
    assert stats["relu"].name == "relu_output"


def test_a_gluon_block_through_model_of():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(4, 3), nn.BatchNorm(), nn.Activation("relu"), nn.Dense(3))
    net.initialize()
    net.hybridize()
    batch = batches(1)[0]
    expected = net(batch).asnumpy()
    sym, arg_params, aux_params, data_names = gluon.model_of(net, "calibrating it")
    last = sym.get_internals().list_outputs()[-1]
    tool = calibrate.Collector(sym, arg_params, aux_params, [last], data_names)
    tool.run([batch])
    found = tool.stats()[last]
    assert (found.min, found.max) == pytest.approx((expected.min(), expected.max()), rel=1e-5)


def test_progress_is_logged(caplog):
    with caplog.at_level(logging.INFO, logger="mxamp.quantization.calibrate"):
        collector().run(batches(2))
    assert [r.getMessage() for r in caplog.records] == [
        "calibration (naive): batch 1, 4 examples", "calibration (naive): batch 2, 8 examples"]


def test_an_all_zero_tensor_gets_threshold_one():
    tool = collector("entropy", ["data"], num_bins=63)
    tool.run([mx.nd.zeros(SHAPE)])
    assert tool.stats()["data"] == calibrate.TensorStats("data", 0.0, 0.0, 1.0, False)


# Errors

def test_no_calibration_data():
    with pytest.raises(OptionError, match="no calibration data: pass calib_data"):
        collector().run(None)
    with pytest.raises(OptionError, match="the calibration data gave no batches"):
        collector().run([])
    with pytest.raises(OptionError, match="no calibration batch has run yet"):
        collector().stats()


def test_non_finite_values():
    bad = batches(2)
    bad[1][0, 0, 0, 0] = np.nan
    with pytest.raises(OptionError, match="tensor 'data' holds NaN or infinite values in "
                                          "calibration batch 2"):
        collector().run(bad)


def test_unknown_tensor_names_list_the_allowed_ones():
    with pytest.raises(OptionError) as err:
        collector(names=["data", "conv_out", "fc"])
    outputs = sorted(small_model().get_internals().list_outputs())
    assert str(err.value) == (f"['conv_out', 'fc'] are not tensors of the model; its tensors "
                              f"(internal outputs) are {outputs}")


def test_the_allowed_names_are_trimmed():
    x = mx.sym.var("data")
    for i in range(12):
        x = mx.sym.FullyConnected(x, num_hidden=2, name=f"fc{i:02d}")
    with pytest.raises(OptionError, match=r"are \['data', 'fc00_bias', .*'fc06_bias'\] "
                                          r"\.\.\. \(17 more\)$"):
        calibrate.Collector(x, {}, {}, ["nope"])


def test_batches_that_do_not_fit_the_model():
    with pytest.raises(OptionError) as err:
        collector().run([mx.nd.zeros((4, 5))])
    message = str(err.value)
    assert message.startswith("the model cannot run on calibration batches of shapes "
                              "{'data': (4, 5)}: ")
    assert "\n" not in message and "Stack trace" not in message
    with pytest.raises(OptionError, match=r"a calibration batch holds 1 arrays, the model takes "
                                          r"2 inputs \['a', 'b'\]"):
        both = mx.sym.var("a") + mx.sym.var("b")
        calibrate.Collector(both, {}, {}, ["a"], ["a", "b"]).run(batches(1))


@pytest.mark.parametrize("value, error, message", [
    (0, OptionError, "num_calib_examples must be at least 1, got 0"),
    (-3, OptionError, "num_calib_examples must be at least 1, got -3"),
    ("6", OptionTypeError, "num_calib_examples must be an int or None, got str"),
    (True, OptionTypeError, "num_calib_examples must be an int or None, got bool"),
])
def test_num_calib_examples_must_be_a_positive_int(value, error, message):
    with pytest.raises(error, match=message):
        collector().run(batches(1), num_calib_examples=value)


def test_bad_options():
    with pytest.raises(OptionError, match="calib_mode must be one of 'naive', 'entropy', "
                                          "got 'none'"):
        collector("none")
    with pytest.raises(OptionError, match="num_bins must be an odd multiple of 3, got 8000"):
        collector("entropy", num_bins=8000)
    with pytest.raises(OptionError, match="histograms are collected in mode 'entropy' only"):
        collector().histogram("data")
    with pytest.raises(OptionError, match="no tensors to calibrate"):
        collector(names=[])
    sym = small_model()
    arg_params, aux_params = params(sym)
    with pytest.raises(OptionError, match=r"data_names \['x'\] are not inputs of the model"):
        calibrate.Collector(sym, arg_params, aux_params, ["fc_output"], ["x"])
    del arg_params["fc_weight"], aux_params["bn_moving_var"]
    with pytest.raises(OptionError, match=r"arg_params / aux_params lack \['bn_moving_var', "
                                          r"'fc_weight'\]"):
        calibrate.Collector(sym, arg_params, aux_params, ["fc_output"])


def test_bad_histograms():
    with pytest.raises(OptionError, match="an odd number of bins and its edges"):
        calibrate.entropy_threshold(np.ones(40), np.linspace(-1, 1, 41))
    with pytest.raises(OptionError, match="an odd number of bins and its edges"):
        calibrate.entropy_threshold(np.ones(41), np.linspace(-1, 1, 41))
    with pytest.raises(OptionError, match="num_quantized_bins must be an int >= 2, got 1"):
        calibrate.entropy_threshold(np.ones(41), np.linspace(-1, 1, 42), 1)
