"""mxamp.quantization.tune_int8, accuracy-guided INT8: on a trained digits MLP
with one deliberately sensitive layer it keeps exactly that layer in float32
and meets the budget; without one it keeps nothing; bad arguments give clear
errors."""
import mxnet as mx
import numpy as np
import pytest

from isa import needs, require_onednn3
from mxamp.errors import OptionError, OptionTypeError
from mxamp.quantization import quantize_net_v2, tune_int8

import digits

require_onednn3()

pytestmark = needs("avx2")
LAYERS = ["mlp_dense0_fwd", "mlp_dense1_fwd", "mlp_dense2_fwd"]
OUTLIER = 1e4
BUDGET = 0.01


def accuracy(model):
    _, _, x, y = digits.data()
    return float((digits.predictions(model, x) == y).mean())


def calibration():
    x = digits.data()[0]
    return [mx.nd.array(x[i:i + 100]) for i in range(0, 300, 100)]


def with_outlier(net):
    """Scales the first hidden layer's most active unit by OUTLIER and the
    second layer's weights reading it by 1 / OUTLIER: the float32 function is
    the same, but the second layer's input range is set by that one unit, so
    in INT8 every other unit rounds to zero."""
    params = net.collect_params()
    w0, b0, w1 = (params[n] for n in ("mlp_dense0_weight", "mlp_dense0_bias",
                                       "mlp_dense1_weight"))
    x = digits.data()[0].reshape(-1, 256)
    unit = int(np.argmax(np.maximum(x @ w0.data().asnumpy().T + b0.data().asnumpy(), 0)
                         .mean(axis=0)))
    for param, index, factor in ((w0, unit, OUTLIER), (b0, unit, OUTLIER),
                                 (w1, (slice(None), unit), 1 / OUTLIER)):
        value = param.data().asnumpy()
        value[index] *= factor
        param.set_data(mx.nd.array(value))
    return net


@pytest.fixture(scope="module")
def sensitive():
    return with_outlier(digits.trained("mlp"))


def test_sensitive_layer_is_the_one_kept_in_float32(sensitive):
    before = {n: p.data().asnumpy().copy() for n, p in sensitive.collect_params().items()}
    reference = accuracy(sensitive)
    assert reference > 0.9
    # The premise: all of it in INT8 ruins the model.
    full = quantize_net_v2(sensitive, calib_data=calibration(), calib_mode="naive")
    assert accuracy(full) < reference - 0.5

    result = tune_int8(sensitive, calibration(), accuracy, BUDGET)
    assert result.excluded == ["mlp_dense1_fwd"]
    assert result.int8_layers == ["mlp_dense0_fwd", "mlp_dense2_fwd"]
    assert result.metric_drop <= BUDGET
    assert accuracy(result.model) >= reference - BUDGET
    # Full INT8, then bisection and the one-at-a-time retry: a handful of models.
    assert 3 <= result.evaluations <= 6
    for name, param in sensitive.collect_params().items():
        np.testing.assert_array_equal(param.data().asnumpy(), before[name])


def test_symbol_model_and_caller_exclusions(sensitive):
    sym = sensitive._cached_graph[1]
    params = {n: p.data() for n, p in sensitive.collect_params().items()}
    model = (sym, params, {})
    seen = []

    def symbol_accuracy(candidate):
        seen.append(candidate)
        block = mx.gluon.SymbolBlock(candidate[0], [mx.sym.var("data")]) \
            if candidate is not model else sensitive
        if candidate is not model:  # int8 weights: each parameter keeps its saved dtype
            block.collect_params().load_dict({**candidate[1], **candidate[2]},
                                             cast_dtype=True, dtype_source="saved")
        return accuracy(block)

    result = tune_int8(model, calibration(), symbol_accuracy, BUDGET,
                       exclude_layers=["mlp_dense2_fwd"], data_names=["data"])
    assert result.excluded == ["mlp_dense2_fwd", "mlp_dense1_fwd"]
    assert result.int8_layers == ["mlp_dense0_fwd"]
    assert isinstance(result.model, tuple) and len(result.model) == 3
    assert all(isinstance(s, tuple) for s in seen[1:])


def test_nothing_sensitive_nothing_excluded():
    net = digits.trained("mlp")
    result = tune_int8(net, calibration(), accuracy, BUDGET)
    assert result.excluded == []
    assert result.int8_layers == LAYERS
    assert result.evaluations == 1
    assert accuracy(result.model) >= accuracy(net) - BUDGET


def test_unreachable_budget_is_an_error(sensitive):
    def only_float32(model):
        return 1.0 if model is sensitive else 0.0

    with pytest.raises(RuntimeError, match=r"all 3 INT8 layers kept in float32 .* drops by 1 "
                                           r"> max_drop 0\.01"):
        tune_int8(sensitive, calibration(), only_float32, BUDGET)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"eval_fn": "accuracy"}, OptionTypeError, "eval_fn must be callable, got 'accuracy'"),
    ({"max_drop": -0.1}, OptionError, r"max_drop must be a number >= 0, got -0\.1"),
    ({"max_drop": None}, OptionError, "max_drop must be a number >= 0, got None"),
    ({"max_drop": float("nan")}, OptionError, "max_drop must be a number >= 0, got nan"),
    ({"calib_data": []}, OptionError, "calib_data must hold at least one batch"),
    ({"calib_data": None}, OptionError, "calib_data must hold at least one batch"),
    ({"calib_mode": "none"}, OptionError,
     r"calib_mode must be one of 'naive', 'entropy' \(the search .*\), got 'none'"),
    ({"calib_mode": "kl"}, OptionError, "calib_mode must be one of 'naive', 'entropy' .* 'kl'"),
    ({"quantized_dtype": "int4"}, OptionError, "quantized_dtype must be one of"),
    ({"exclude_layers": ["dense9"]}, OptionError, r"exclude_layers names \['dense9'\]"),
    ({"model": "net.json"}, OptionTypeError, "model must be a gluon HybridBlock or a"),
    ({"eval_fn": lambda m: "97%"}, OptionTypeError, "eval_fn must return a number"),
])
def test_bad_arguments(sensitive, kwargs, error, message):
    arguments = {"model": sensitive, "calib_data": calibration(), "eval_fn": accuracy,
                 "max_drop": BUDGET, **kwargs}
    with pytest.raises(error, match=message):
        tune_int8(**arguments)
