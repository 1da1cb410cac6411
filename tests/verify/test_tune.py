"""mxamp.tune on models with numerically fragile nodes, in bfloat16 on this CPU
(and in float16 for the main test).

The model: ``g = exp(tanh(x + bias))`` over 65536 features, summed in groups
of 4 (``local``) and, per fragile node, over all 65536 features (``total``).
MXNet's bfloat16 ``sum`` accumulates in bfloat16, so a sum over many elements
stalls (about 24% low here); every other node, and a sum over 4 elements, is
within about 1% of float32. Tolerance: ``|out - ref| <= 1e-3 + 0.03 * |ref|``.

Only elementwise ops and reductions are converted (explicit lists): they have
bfloat16 kernels on every x86 CPU, so the expected sets do not depend on
whether this CPU has AVX512-BF16 (FullyConnected and Convolution need it).
"""
import logging

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon import nn

import mxamp
from mxamp.policy import Rule
from mxamp.verify import TuneResult, tune

RTOL, ATOL = 0.03, 1e-3
FEATURES = 65536
# broadcast_add is a widest-type op, which the lists cannot name: a rule makes it low.
ADD_LOW = Rule("broadcast_add", lambda node: "LOW")
LISTS = {"target_dtype_ops": ["tanh", "exp", "sum"], "fp32_ops": [],
         "conditional_fp32_ops": [], "widest_dtype_ops": [], "rules": [ADD_LOW]}
FINE = ["net_add", "net_exp", "net_groups", "net_local", "net_tanh"]  # sorted


class Fragile(nn.HybridBlock):
    def __init__(self, n_fragile=1):
        super().__init__(prefix="net_")
        self.n_fragile = n_fragile
        with self.name_scope():
            self.bias = self.params.get("bias", shape=(1, 1), init=mx.init.Constant(0.25))

    def hybrid_forward(self, F, x, bias):
        g = F.exp(F.tanh(F.broadcast_add(x, bias, name="add"), name="tanh"), name="exp")
        local = F.sum(F.reshape(g, (0, -1, 4), name="groups"), axis=2, name="local")
        return [local] + [F.sum(g, axis=1, name=f"total{i}") for i in range(self.n_fragile)]


def fragile_net(n_fragile=1):
    net = Fragile(n_fragile)
    net.initialize()
    net.hybridize()
    return net


def batches(n=2):
    return [mx.nd.random.uniform(-1, 1, shape=(4, FEATURES)) for _ in range(n)]


def within_tolerance(outs, refs):
    return all(np.all(np.abs(o.asnumpy() - r.asnumpy()) <= ATOL + RTOL * np.abs(r.asnumpy()))
               for o, r in zip(outs, refs))


def run_tune(model, inputs, **kwargs):
    return tune(model, inputs, **{"target_dtype": "bfloat16", "rtol": RTOL, "atol": ATOL,
                                  **LISTS, **kwargs})


def exported(net, x):
    net(x)
    _, sym = net._cached_graph
    params = {p.name: p.data() for p in net.collect_params().values()}
    return sym, {n: params[n] for n in sym.list_arguments() if n in params}, {}


def test_the_fragile_node_breaks_a_full_bfloat16_conversion():
    """The premise: converting everything misses the tolerance; keeping only
    the fragile node in float32 meets it."""
    net, xs = fragile_net(), batches()
    refs = [net(x) for x in xs]
    full = mxamp.convert_hybrid_block(net, target_dtype="bfloat16", **LISTS)
    assert within_tolerance(full(xs[0])[:1], refs[0][:1])  # the sum over 4 is fine
    assert not within_tolerance(full(xs[0])[1:], refs[0][1:])
    kept = mxamp.convert_hybrid_block(net, target_dtype="bfloat16",
                                      excluded_sym_names=["net_total0"], **LISTS)
    assert all(within_tolerance(kept(x), r) for x, r in zip(xs, refs))


def test_tune_block_excludes_exactly_the_fragile_node(dtype, caplog):
    """In float16 the long sum overflows (73000 > 65504) instead of stalling."""
    net, xs = fragile_net(), batches()
    with caplog.at_level(logging.INFO, logger="mxamp.tuning"):
        result = run_tune(net, xs, target_dtype=dtype)
    assert isinstance(result, TuneResult)
    assert result.excluded == ["net_total0"]
    assert result.low_nodes == FINE  # everything else stays bfloat16
    assert 0 < result.error <= 1
    assert result.metric_drop is None
    for x in xs + batches(1):  # calibration batches and a fresh one
        assert within_tolerance(result.model(x), net(x))
    assert "6 candidate low-precision nodes" in caplog.text
    assert "1 of 6 candidate nodes kept in float32" in caplog.text


def test_tune_finds_two_fragile_nodes_by_bisection():
    result = run_tune(fragile_net(n_fragile=2), batches())
    assert result.excluded == ["net_total0", "net_total1"]
    assert result.low_nodes == FINE


def test_tune_symbol_model_gives_the_same_answer():
    """A (sym, arg_params, aux_params) model, converted for the calibration
    data's context, with batches given as dicts."""
    net, xs = fragile_net(), batches()
    sym, args, aux = exported(net, xs[0])
    result = run_tune((sym, args, aux), [{"data": x} for x in xs])
    assert result.excluded == ["net_total0"]
    assert result.low_nodes == FINE
    csym, cargs, caux = result.model
    assert mxamp.summarize(csym) == {"amp_cast:bfloat16": 2, "amp_cast:float32": 2}
    exe = csym.bind(mx.cpu(), {**cargs, "data": xs[0]}, aux_states=caux, grad_req="null")
    assert within_tolerance(exe.forward(), net(xs[0]))


def test_tune_keeps_the_callers_exclusions_and_passes_options_through():
    """The caller's exclusion of tanh stays; cast_optional_params reaches the
    converter (the bias, read only by a low-precision add, is stored low)."""
    result = run_tune(fragile_net(), batches(), excluded_sym_names=["net_tanh"],
                      cast_optional_params=True)
    assert result.excluded == ["net_tanh", "net_total0"]
    assert "net_tanh" not in result.low_nodes
    assert result.model.collect_params()["net_bias"].data().dtype != np.float32


def test_tune_gives_rules_the_calibration_shapes():
    """A rule keeping sums over more than 1024 elements in float32 needs the
    data shape, which tune takes from the calibration batches; nothing then
    needs excluding."""
    def long_sum(node):
        return "fp32" if node.attrs.get("axis") == "1" and node.input_shapes[0][1] > 1024 \
            else None
    result = run_tune(fragile_net(), batches(), rules=[ADD_LOW, Rule("sum", long_sum)])
    assert result.excluded == [] and result.evaluations == 1
    assert result.low_nodes == FINE


def test_tune_with_a_metric():
    """Metric: minus the worst relative error of the totals. With at most 1%
    drop allowed, the tuner must keep the fragile node in float32."""
    net, xs = fragile_net(), batches(3)
    totals = [net(x)[1].asnumpy() for x in xs]

    def accuracy(outputs):
        return -max(float(np.max(np.abs(o[1] - t) / np.abs(t))) for o, t in zip(outputs, totals))
    result = tune(net, xs, "bfloat16", metric_fn=accuracy, max_metric_drop=0.01, **LISTS)
    assert 0 <= result.metric_drop <= 0.01
    assert result.excluded == ["net_total0"]
    assert result.low_nodes == FINE


def test_tune_is_deterministic():
    net, xs = fragile_net(n_fragile=2), batches()
    first = run_tune(net, xs, seed=3)
    second = run_tune(net, xs, seed=3)
    assert (first.excluded, first.error, first.evaluations) == \
        (second.excluded, second.error, second.evaluations)
    for a, b in zip(first.model(xs[0]), second.model(xs[0])):
        np.testing.assert_array_equal(a.asnumpy(), b.asnumpy())


def test_tune_without_fragile_nodes_converts_everything_in_one_evaluation():
    result = run_tune(fragile_net(n_fragile=0), batches())
    assert result.excluded == [] and result.evaluations == 1
    assert result.low_nodes == FINE


def test_tune_reports_when_no_conversion_can_pass():
    """A metric that only the float32 reference reaches: even the conversion
    with every low-precision node excluded fails."""
    calls = []

    def only_first_call(outputs):
        calls.append(1)
        return 1.0 if len(calls) == 1 else 0.0
    with pytest.raises(RuntimeError, match="even with all 6 low-precision nodes kept in "
                                           "float32 the outputs miss the tolerance"):
        tune(fragile_net(), batches(), "bfloat16", metric_fn=only_first_call,
             max_metric_drop=0.5, **LISTS)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"rtol": -1}, ValueError, "rtol must be a number >= 0, got -1"),
    ({"rtol": 0, "atol": 0}, ValueError, "rtol and atol are both 0"),
    ({"metric_fn": len}, ValueError, "metric_fn and max_metric_drop go together"),
    ({"metric_fn": 3, "max_metric_drop": 0.1}, TypeError, "metric_fn must be callable"),
    ({"target_dtype": "int8"}, ValueError, "target_dtype 'int8' is not supported"),
])
def test_tune_argument_errors(kwargs, error, match):
    kwargs = {"target_dtype": "bfloat16", **kwargs}
    with pytest.raises(error, match=match):
        tune(fragile_net(), batches(), **kwargs)


def test_tune_input_errors():
    with pytest.raises(ValueError, match="calibration_inputs must be a non-empty list"):
        tune(fragile_net(), [], "bfloat16")
    with pytest.raises(TypeError, match="each calibration batch must be an NDArray"):
        tune(fragile_net(), [np.ones((8, 16))], "bfloat16")
    net = Fragile()
    net.initialize()
    with pytest.raises(RuntimeError, match=r"is not hybridized: call block.hybridize\(\)"):
        tune(net, batches(), "bfloat16")
    with pytest.raises(TypeError, match=r"model must be a gluon HybridBlock or a \(sym, "):
        tune("model.json", batches(), "bfloat16")
    sym, args, aux = exported(fragile_net(), batches(1)[0])
    with pytest.raises(ValueError, match=r"batch \['image'\] does not match the model's "
                                         r"data inputs \['data'\]"):
        tune((sym, args, aux), [{"image": batches(1)[0]}], "bfloat16")
    with pytest.raises(ValueError, match=r"batch 2 does not match the model's data inputs"):
        tune((sym, args, aux), [tuple(batches(2))], "bfloat16")
    with pytest.raises(TypeError, match="arg_params must be a dict"):
        tune((sym, list(args.values()), aux), batches(), "bfloat16")
