"""mxamp.quantization against mxnet.contrib.quantization on what MXNet's own
quantization tests check: the reference's functions and their signatures,
its lower-level helpers (quantization pass, calibration attributes,
quantized parameters, histograms and entropy thresholds), calib_mode='none',
graphs MXNet has already fused, and a data input that arg_params also hold."""
import inspect
import json
import logging

import mxnet as mx
import mxnet.contrib.quantization as reference
import numpy as np
import pytest

import mxamp.quantization as quantization
from mxamp.errors import OptionError
from mxamp.verify import no_graph_fusion, relative_error

import isa
import nets

FUSION = "MKLDNN_QUANTIZE"
# Helpers of the reference that MXNet's own tests call, though private.
PRIVATE = ("_quantize_symbol", "_quantize_params", "_calibrate_quantized_sym",
           "_smooth_distribution", "_get_optimal_threshold", "_get_optimal_thresholds")


def reference_functions():
    public = [n for n, f in inspect.getmembers(reference)
              if not n.startswith("_") and (inspect.isfunction(f) or inspect.isclass(f))
              and f.__module__ == reference.__name__]
    return sorted(public) + list(PRIVATE)


def test_the_walk_finds_the_references_api():
    assert set(reference_functions()) >= {"quantize_model", "quantize_model_mkldnn",
                                          "quantize_graph", "calib_graph", "combine_histogram",
                                          "quantize_net", "quantize_net_v2"}


@pytest.mark.parametrize("name", reference_functions())
def test_every_reference_function_exists_with_its_parameters(name):
    """The reference's parameters, in its order, with its defaults; then
    only mxamp's own keywords (`progress`, `rest_dtype`), which default to
    the reference's behaviour, as in the conversion API's drop-in test."""
    ours, theirs = (list(inspect.signature(getattr(m, name)).parameters.values())
                    for m in (quantization, reference))
    assert [(p.name, p.default) for p in ours[:len(theirs)]] == \
        [(p.name, p.default) for p in theirs]
    own = [("progress", False), ("rest_dtype", "float32")]
    assert [(p.name, p.default) for p in ours[len(theirs):]] in ([], own, own[1:])


def conv_net():
    """conv-bn-relu, average pooling, dense, softmax (MXNet's tests' shape)."""
    data = mx.sym.var("data")
    x = mx.sym.Convolution(data, kernel=(1, 1), num_filter=8, name="conv")
    x = mx.sym.Activation(mx.sym.BatchNorm(x, name="bn"), act_type="relu", name="relu")
    x = mx.sym.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="avg", name="pool")
    return mx.sym.FullyConnected(x, num_hidden=5, name="fc")


SHAPE = (4, 3, 6, 6)


def params(sym):
    return nets.random_params(sym, SHAPE)


def calib_iter(seed=1):
    data = mx.nd.array(np.random.RandomState(seed).uniform(-1, 1, (8,) + SHAPE[1:]))
    return mx.io.NDArrayIter(data, batch_size=SHAPE[0])


def nodes(sym):
    return {n["name"]: n for n in json.loads(sym.tojson())["nodes"]}


def calibrated(sym):
    """{node: (min_calib_range, max_calib_range)} of the nodes that have them."""
    return {name: (float(a["min_calib_range"]), float(a["max_calib_range"]))
            for name, a in sym.attr_dict().items() if "min_calib_range" in a}


def assert_same_ranges(ours, theirs, rtol=1e-5):
    ranges, their_ranges = calibrated(ours), calibrated(theirs)
    assert sorted(ranges) == sorted(their_ranges)
    for name, found in ranges.items():
        np.testing.assert_allclose(found, their_ranges[name], rtol=rtol, err_msg=name)


def run(sym, arg_params, aux_params, x):
    """`sym` on MXNet's executor (its own INT8 operators) with data `x`."""
    mod = mx.mod.Module(sym, label_names=None, context=mx.cpu())
    with no_graph_fusion():  # as MXNet's tests bind (MXNET_SUBGRAPH_BACKEND=NONE)
        mod.bind(for_training=False, data_shapes=[("data", x.shape)])
    mod.set_params(arg_params, aux_params)
    mod.forward(mx.io.DataBatch([x]), is_train=False)
    return mod.get_outputs()[0].asnumpy()


def test_quantize_symbol_is_mxnets_pass_and_calibration_sets_its_attributes():
    sym = conv_net()
    offline = [n for n in sym.list_arguments() if n != "data"]
    ours, wanted = quantization._quantize_symbol(sym, mx.cpu(), offline_params=offline,
                                                 quantize_mode="full")
    theirs, their_wanted = reference._quantize_symbol(sym, mx.cpu(), offline_params=offline,
                                                      quantize_mode="full")
    assert ours.tojson() == theirs.tojson() and wanted == their_wanted
    assert {"conv_output", "fc_output"} <= set(wanted)
    assert nodes(ours)["quantized_conv"]["op"] == "_contrib_quantized_conv"
    table = {"conv_output": (-3.5, 4.25), "fc_output": (-1.0, 2.0)}
    assert calibrated(quantization._calibrate_quantized_sym(ours, table)) == {
        "requantize_conv": (-3.5, 4.25), "requantize_fc": (-1.0, 2.0)}
    assert quantization._calibrate_quantized_sym(ours, {}) is ours


def test_quantize_params_quantizes_weights_and_biases_only():
    sym = conv_net()
    arg_params, _ = params(sym)
    qsym, _ = quantization._quantize_symbol(sym, mx.cpu(), offline_params=list(arg_params),
                                            quantize_mode="full")
    ours = quantization._quantize_params(qsym, arg_params, {})
    theirs = reference._quantize_params(qsym, arg_params, {})
    assert sorted(ours) == sorted(theirs)
    assert {"conv_weight_quantize", "conv_weight_quantize_min", "fc_bias_quantize_max",
            "bn_gamma"} <= set(ours) and "conv_weight" not in ours
    weight = arg_params["conv_weight"].asnumpy()
    scale = 127 / np.abs(weight).max()
    assert ours["conv_weight_quantize"].dtype == np.int8
    np.testing.assert_array_equal(ours["conv_weight_quantize"].asnumpy(),
                                  np.round(weight * scale).astype(np.int8))
    assert ours["conv_weight_quantize_max"].asscalar() == pytest.approx(np.abs(weight).max())
    assert ours["bn_gamma"] is arg_params["bn_gamma"]


def test_smooth_distribution_moves_eps_to_the_empty_bins():
    smoothed = quantization._smooth_distribution(np.array([0, 0, 1, 0, 0.0]), eps=1e-3)
    np.testing.assert_allclose(smoothed, [1e-3, 1e-3, 1 - 4e-3, 1e-3, 1e-3], rtol=1e-6)
    with pytest.raises(ValueError, match="all zeros"):
        quantization._smooth_distribution(np.zeros(3))


def test_threshold_of_mass_at_the_edge_is_the_edge():
    hist = np.zeros(999)
    hist[-1] = 1000
    record = (hist, np.linspace(-2, 2, 1000), -2.0, 2.0, 2.0)
    for dtype in ("int8", "uint8", "auto"):
        low, high, threshold, _ = quantization._get_optimal_threshold(record, dtype, 5)
        assert (low, high, threshold) == (-2.0, 2.0, pytest.approx(2.0))


@pytest.mark.parametrize("dtype", ["int8", "uint8", "auto"])
def test_thresholds_of_a_uniform_tensor_are_its_largest_magnitude(dtype):
    values = np.random.RandomState(0).uniform(-10.5, 11.3, 20000)
    bound = np.abs(values).max()
    hist, edges = np.histogram(values, bins=8001, range=(-bound, bound))
    table = quantization._get_optimal_thresholds(
        {"t": (hist, edges, values.min(), values.max(), bound)}, dtype)
    assert table["t"][0] == -table["t"][1]
    assert table["t"][1] == pytest.approx(bound, rel=1e-2)


def test_thresholds_of_a_non_negative_tensor_start_at_zero_when_unsigned():
    values = np.random.RandomState(0).uniform(0, 4, 20000)
    hist, edges = np.histogram(values, bins=8001, range=(-4, 4))
    record = (hist, edges, values.min(), values.max(), 4.0)
    assert quantization._get_optimal_thresholds({"t": record}, "uint8")["t"][0] == 0
    assert quantization._get_optimal_thresholds({"t": record}, "int8")["t"][0] < 0


def test_combine_histogram_keeps_old_counts_in_their_bins():
    rng = np.random.RandomState(0)
    first, second = rng.uniform(-1, 1, 500), rng.uniform(-3, 3, 500)
    hist, edges = np.histogram(first, bins=11, range=(-1, 1))
    old = (hist, edges, first.min(), first.max(), 1.0)
    same = quantization.combine_histogram(old, first, first.min(), first.max(), 1.0)
    np.testing.assert_array_equal(same[0], 2 * hist)
    grown = quantization.combine_histogram(old, second, second.min(), second.max(), 3.0)
    counts, new_edges, low, high, bound = grown
    # 2/11 wide bins: 11 more on each side reach 3.0 (2 * 11 + 11 = 33 bins)
    assert len(counts) == 33 and bound == pytest.approx(3.0) and counts.sum() == 1000
    np.testing.assert_allclose(new_edges[11:23], edges[:12])
    np.testing.assert_array_equal(
        counts, np.histogram(np.concatenate([first, second]), bins=33, range=(-3, 3))[0])
    assert (low, high) == (min(first.min(), second.min()), max(first.max(), second.max()))
    for ours, theirs in zip(grown, reference.combine_histogram(old, second, second.min(),
                                                               second.max(), 3.0)):
        np.testing.assert_allclose(ours, theirs)


# MXNet's INT8 BatchNorm needs calibrated ranges, and its INT8 average pooling
# finds no oneDNN primitive for this graph's u8 input: both stay float32.
EXCLUDED = ["BatchNorm", "Pooling"]


def test_calib_mode_none_gives_mxnets_uncalibrated_graph_that_runs(caplog):
    sym = conv_net()
    arg_params, aux_params = params(sym)
    with caplog.at_level(logging.WARNING, "mxamp"):
        qsym, qargs, qaux = quantization.quantize_model(
            sym, arg_params, aux_params, label_names=(), calib_mode="none",
            excluded_op_names=EXCLUDED, quantized_dtype="uint8", quantize_mode="full")
    assert "calib_mode='none' asks for ranges computed at run time" in caplog.text
    assert "MXNet's unfused INT8 convolution is far from float32 on uint8 input (measured " \
        "on a 1x1 convolution: relative error 0.74 with bias, 1.0 without), and " \
        "convolution(s) conv read uint8; calibrate" in caplog.text
    theirs = reference.quantize_model(sym, arg_params, aux_params, label_names=(),
                                      calib_mode="none", excluded_op_names=EXCLUDED,
                                      quantized_dtype="uint8", quantize_mode="full")
    assert qsym.tojson() == theirs[0].tojson() and calibrated(qsym) == {}
    assert sorted(qargs) == sorted(theirs[1]) and qaux is aux_params
    x = mx.nd.array(np.random.RandomState(3).uniform(0, 1, SHAPE))  # u8 data: non-negative
    # It runs on MXNet's INT8 operators. (Their run-time ranges are far from
    # float32 here, for the reference alike: 0.74 relative error on the conv
    # alone, against 0.003 for mxamp's calibrated backend.)
    assert run(qsym, qargs, qaux, x).shape == (SHAPE[0], 5)


def two_conv_net():
    """conv, relu, conv: the second convolution reads a requantized output."""
    data = mx.sym.var("data")
    x = mx.sym.Activation(mx.sym.Convolution(data, kernel=(1, 1), num_filter=8, name="conv0"),
                          act_type="relu", name="relu")
    return mx.sym.Convolution(x, kernel=(1, 1), num_filter=4, name="conv1")


@pytest.mark.parametrize("quantized_dtype, reading_int8", [
    ("auto", "conv0, conv1"),  # data quantized signed: no range says it is not negative
    ("int8", "conv0, conv1"),
    ("uint8", "conv1")])  # MXNet requantizes conv0's output to int8
def test_calib_mode_none_refuses_up_front_what_mxnets_int8_convolution_cannot_run(
        quantized_dtype, reading_int8):
    """MXNet's unfused INT8 convolution takes only uint8: the reference's
    graph fails at its first forward pass; mxamp says so when quantizing,
    with the ways out."""
    sym = two_conv_net()
    arg_params, aux_params = params(sym)
    options = dict(label_names=(), calib_mode="none", quantized_dtype=quantized_dtype)
    with pytest.raises(OptionError, match=(
            rf"calib_mode='none' cannot run this model in MXNet's INT8 graph format: .* "
            rf"would read int8 \({reading_int8}\)\. Calibrate instead \(calib_mode='naive' "
            rf"or 'entropy' with calib_data.*quantize_model_mkldnn with calib_mode='none'")):
        quantization.quantize_model(sym, arg_params, aux_params, **options)
    theirs = reference.quantize_model(sym, arg_params, aux_params, **options)
    x = mx.nd.array(np.random.RandomState(3).uniform(-1, 1, SHAPE))
    with pytest.raises(mx.MXNetError, match="mkldnn_quantized_conv op only supports uint8"):
        run(*theirs, x)


@pytest.mark.parametrize("no_bias, error", [(False, 0.74), (True, 1.0)])
def test_uncalibrated_uint8_convolution_is_far_from_float32(no_bias, error):
    """What the WARNING says, measured: MXNet's unfused INT8 convolution with
    run-time ranges on uint8 data (the reference's graph alike)."""
    sym = mx.sym.Convolution(mx.sym.var("data"), kernel=(1, 1), num_filter=8, name="conv",
                             no_bias=no_bias)
    arg_params, aux_params = params(sym)
    qsym, qargs, qaux = reference.quantize_model(sym, arg_params, aux_params, label_names=(),
                                                 calib_mode="none", quantized_dtype="uint8")
    x = mx.nd.array(np.random.RandomState(3).uniform(0, 1, SHAPE))
    found = relative_error(run(qsym, qargs, qaux, x), run(sym, arg_params, aux_params, x))
    assert found == pytest.approx(error, abs=0.01)


@isa.needs("avx2", "mxnet")  # the error against float32 is MXNet's INT8 kernels'
def test_calib_mode_nones_way_out_runs_signed_data():
    """The fused graph the error names takes the signed data."""
    sym = two_conv_net()
    arg_params, aux_params = params(sym)
    ours = quantization.quantize_model_mkldnn(sym, arg_params, aux_params, label_names=(),
                                              calib_mode="none", quantized_dtype="auto")
    x = mx.nd.array(np.random.RandomState(3).uniform(-1, 1, SHAPE))
    error = relative_error(run(*ours, x), run(sym, arg_params, aux_params, x))
    assert error < 5e-2, error


@isa.needs("avx2", "mxnet")  # the error against float32 is MXNet's INT8 kernels'
@pytest.mark.parametrize("calib_mode", ["naive", "entropy"])
def test_a_graph_mxnet_fused_is_quantized_in_its_format(calib_mode, caplog):
    sym = conv_net()
    arg_params, aux_params = params(sym)
    fused = sym.get_backend_symbol(FUSION)
    assert "_sg_mkldnn_conv" in {n["op"] for n in nodes(fused).values()}
    with caplog.at_level(logging.WARNING, "mxamp"):
        ours = quantization.quantize_model(
            fused, arg_params, aux_params, label_names=(), calib_mode=calib_mode,
            calib_data=calib_iter(), quantized_dtype="auto", quantize_mode="full")
    assert "nodes MXNet's oneDNN fusion made (_sg_mkldnn_*)" in caplog.text
    theirs = reference.quantize_model(
        fused, arg_params, aux_params, label_names=(), calib_mode=calib_mode,
        calib_data=calib_iter(), quantized_dtype="auto", quantize_mode="full")
    assert set(calibrated(ours[0])) == {"data_quantize", "requantize_sg_mkldnn_conv_bn_act_0",
                                        "requantize_sg_mkldnn_fully_connected_0"}
    # Ranges as the reference's: the same batches. Entropy thresholds come from
    # mxamp's histogram (range tripled as needed) and KL search, not MXNet's
    # C++ one (calibrate.py): within 10% here (5% measured).
    assert_same_ranges(ours[0], theirs[0], 1e-5 if calib_mode == "naive" else 1e-1)
    x = mx.nd.array(np.random.RandomState(3).uniform(-1, 1, SHAPE))
    error = relative_error(run(ours[0].get_backend_symbol(FUSION), ours[1], ours[2], x),
                           run(sym, arg_params, aux_params, x))
    assert error < 5e-2, error


@isa.needs("avx2", "mxnet")
def test_quantize_model_mkldnn_is_the_references_fused_flow(caplog):
    sym = conv_net()
    arg_params, aux_params = params(sym)
    with caplog.at_level(logging.WARNING, "mxamp"):
        ours = quantization.quantize_model_mkldnn(
            sym, arg_params, aux_params, label_names=(), calib_mode="naive",
            calib_data=calib_iter(), quantized_dtype="auto", quantize_mode="full")
    assert "quantize_model_mkldnn asks for MXNet's MKL-DNN INT8 graph" in caplog.text
    theirs = reference.quantize_model_mkldnn(
        sym, arg_params, aux_params, label_names=(), calib_mode="naive",
        calib_data=calib_iter(), quantized_dtype="auto", quantize_mode="full")
    assert sorted((n, v["op"]) for n, v in nodes(ours[0]).items()) == \
        sorted((n, v["op"]) for n, v in nodes(theirs[0]).items())
    # The conv's requantize range is folded into the fused INT8 convolution.
    assert set(calibrated(ours[0])) == {"data_quantize", "quantized_sg_mkldnn_conv_bn_act_0"}
    assert_same_ranges(ours[0], theirs[0])
    x = mx.nd.array(np.random.RandomState(3).uniform(-1, 1, SHAPE))
    np.testing.assert_allclose(run(*ours, x), run(*theirs, x), rtol=1e-5, atol=1e-5)


def test_a_data_input_held_in_arg_params_is_calibrated_as_the_reference_does():
    """As MXNet's self-attention test passes it: 'data' in arg_params too,
    with another shape. Calibration binds the batches' shape (it raised a
    TypeError); MXNet's pass then quantizes 'data' offline, as a parameter."""
    sym = conv_net()
    arg_params, aux_params = params(sym)
    arg_params["data"] = mx.nd.full((1,) + SHAPE[1:], 100.0)
    options = dict(label_names=(), calib_mode="naive", quantized_dtype="int8",
                   quantize_mode="full")
    ours = quantization.quantize_model_mkldnn(sym, arg_params, aux_params,
                                              calib_data=calib_iter(), **options)
    theirs = reference.quantize_model_mkldnn(sym, arg_params, aux_params,
                                             calib_data=calib_iter(), **options)
    assert ours[0].tojson() == theirs[0].tojson()
    assert set(calibrated(ours[0])) == {"quantized_sg_mkldnn_conv_bn_act_0"}
    assert_same_ranges(ours[0], theirs[0])
    assert sorted(ours[1]) == sorted(theirs[1])


def test_excluded_names_the_model_lacks_are_ignored_with_a_warning(caplog):
    sym = conv_net()
    arg_params, aux_params = params(sym)
    with caplog.at_level(logging.WARNING, "mxamp"):
        qsym, _, _ = quantization.quantize_model(
            sym, arg_params, aux_params, label_names=(), calib_mode="none",
            excluded_sym_names=["conv1", "fc"], quantized_dtype="uint8", quantize_mode="full")
    assert "excluded_sym_names ['conv1'] are not nodes of the model: ignored" in caplog.text
    assert "quantized_fc" not in nodes(qsym) and "quantized_conv" in nodes(qsym)


@pytest.mark.parametrize("calib_mode", ["naive", "entropy"])
def test_quantize_graph_and_calib_graph_calibrate_from_a_monitor(calib_mode):
    sym = conv_net()
    arg_params, aux_params = params(sym)
    qsym, qargs, _, collector = quantization.quantize_graph(
        sym, arg_params, aux_params, calib_mode=calib_mode, quantized_dtype="int8")
    assert "conv_weight_quantize" in qargs
    assert quantization.quantize_graph(sym, arg_params, aux_params, calib_mode="none")[3] is None
    with no_graph_fusion():  # a fused graph would not show the tensors wanted
        exe = sym.simple_bind(mx.cpu(), data=SHAPE, grad_req="null")
    exe.copy_params_from(arg_params, aux_params)
    exe.set_monitor_callback(collector.collect, monitor_all=True)
    batch = next(iter(calib_iter())).data[0]
    exe.forward(is_train=False, data=batch)
    mx.nd.waitall()
    cqsym, cqargs, _ = quantization.calib_graph(qsym, arg_params, aux_params, collector,
                                                calib_mode=calib_mode, quantized_dtype="int8")
    conv = sym.get_internals()["conv_output"].bind(
        mx.cpu(), {"data": batch, "conv_weight": arg_params["conv_weight"],
                   "conv_bias": arg_params["conv_bias"]}).forward()[0].asnumpy()
    low, high = calibrated(cqsym)["requantize_conv"]
    if calib_mode == "naive":
        assert (low, high) == pytest.approx((conv.min(), conv.max()), rel=1e-5)
    else:  # symmetric, within what was seen
        assert low == -high and 0 < high <= np.abs(conv).max() * (1 + 1e-5)
    assert sorted(cqargs) == sorted(qargs)


def test_what_the_backend_leaves_float32_is_named_in_a_warning(caplog):
    """A lone Concat (MXNet's test_pos_single_concat, unfused) has nothing
    mxamp's INT8 regions start from: it stays float32, and says so."""
    sym = mx.sym.Concat(mx.sym.var("data"), mx.sym.var("data2"), dim=1, name="concat")
    x = [mx.nd.array(np.random.RandomState(0).uniform(-1, 1, SHAPE)) for _ in range(2)]
    with caplog.at_level(logging.WARNING, "mxamp"):
        qsym, _, _ = quantization.quantize_model(
            sym, {}, {}, data_names=("data", "data2"), label_names=(), calib_mode="naive",
            calib_data=[x], quantize_mode="full")
    assert [n["op"] for n in nodes(qsym).values()] == ["null", "null", "Concat"]
    assert "INT8: 1 operators stay float32 outside the oneDNN regions (Concat x1)" \
        in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, "mxamp"):
        quantization.quantize_model(sym, {}, {}, data_names=("data", "data2"),
                                    label_names=(), calib_mode="naive", calib_data=[x],
                                    excluded_sym_names=["concat"])
    assert "stay float32" not in caplog.text  # excluded by the caller: no news
