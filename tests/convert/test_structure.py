"""One conversion rule per test: exact cast placement on small graphs.

Each test passes its own op lists so that it checks the rule, not the defaults.
"""
import json
import logging

import mxnet as mx

import mxamp
from graphs import count_json_calls, nodes_of, structure

LOW = ["FullyConnected", "Convolution"]
FP32 = ["exp", "softmax"]
NO_CONDITIONS = []


def convert(sym, dtype, **kw):
    kw.setdefault("target_dtype_ops", LOW)
    kw.setdefault("fp32_ops", FP32)
    kw.setdefault("conditional_fp32_ops", NO_CONDITIONS)
    return mxamp.convert_symbol(sym, target_dtype=dtype, **kw)


def fc(x, name, n=4):
    return mx.sym.FullyConnected(x, num_hidden=n, name=name)


def inputs_of(sym, name):
    """(op, dtype attr or producer name) for each input of node `name`."""
    graph = nodes_of(sym)
    node = next(n for n in graph["nodes"] if n["name"] == name)
    result = []
    for e in node["inputs"]:
        src = graph["nodes"][e[0]]
        result.append((src["op"], src.get("attrs", {}).get("dtype", src["name"])))
    return result


def test_low_precision_op_casts_every_float_input_and_output_returns_float32(dtype):
    """A target-dtype op gets data, weight and bias cast; the head comes back fp32."""
    out = convert(fc(mx.sym.var("data"), "fc"), dtype)
    assert inputs_of(out, "fc") == [("amp_cast", dtype)] * 3
    assert mxamp.summarize(out) == {f"amp_cast:{dtype}": 3, "amp_cast:float32": 1}
    assert nodes_of(out)["nodes"][nodes_of(out)["heads"][0][0]]["attrs"]["dtype"] == "float32"


def test_fp32_op_after_low_precision_op_gets_one_float32_cast(dtype):
    """An fp32 op reading a low-precision entry gets it cast to float32; the
    graph output is then already float32."""
    out = convert(mx.sym.exp(fc(mx.sym.var("data"), "fc"), name="exp"), dtype)
    assert inputs_of(out, "exp") == [("amp_cast", "float32")]
    assert mxamp.summarize(out) == {f"amp_cast:{dtype}": 3, "amp_cast:float32": 1}


def test_fp32_op_leaves_variables_uncast(dtype):
    """Variables are float32 already: an fp32 op reading one inserts no cast."""
    out = convert(mx.sym.exp(mx.sym.var("data"), name="exp"), dtype)
    assert inputs_of(out, "exp") == [("null", "data")]
    assert mxamp.summarize(out) == {}


def test_one_cast_per_entry_and_dtype(dtype):
    """A value read by three low-precision ops is cast once (the mirror maps)."""
    x = mx.sym.var("data")
    out = convert(mx.sym.Group([fc(x, f"fc{i}") for i in range(3)]), dtype)
    casts, _, _ = structure(out)
    assert casts[("amp_cast", dtype, ("data", 0))] == 1
    assert all(count == 1 for count in casts.values())
    assert mxamp.summarize(out) == {f"amp_cast:{dtype}": 7, "amp_cast:float32": 3}


def test_excluded_name_runs_in_float32(dtype):
    """A node named in excluded_sym_names keeps float32 inputs."""
    x = mx.sym.var("data")
    out = convert(fc(fc(x, "fc1"), "fc2"), dtype, excluded_sym_names=["fc2"])
    assert inputs_of(out, "fc2") == [("amp_cast", "float32"), ("null", "fc2_weight"),
                                     ("null", "fc2_bias")]
    assert inputs_of(out, "fc1") == [("amp_cast", dtype)] * 3


def test_neutral_op_passes_the_dtype_through(dtype):
    """relu between two low-precision ops needs no cast: it runs in low precision."""
    x = mx.sym.relu(fc(mx.sym.var("data"), "fc1"), name="relu")
    out = convert(fc(x, "fc2"), dtype)
    assert inputs_of(out, "relu") == [("FullyConnected", "fc1")]
    assert inputs_of(out, "fc2")[0] == ("relu", "relu")
    assert mxamp.summarize(out) == {f"amp_cast:{dtype}": 5, "amp_cast:float32": 1}


def test_widest_op_with_known_dtypes_uses_plain_casts(dtype):
    """Both inputs' dtypes known (one low, one float32): cast to the widest, float32."""
    x = mx.sym.var("data")
    low = fc(x, "fc")
    high = mx.sym.exp(mx.sym.FullyConnected(x, num_hidden=4, name="fc_b"), name="exp")
    out = convert(mx.sym.elemwise_add(low, high, name="add"), dtype)
    assert inputs_of(out, "add") == [("amp_cast", "float32"), ("exp", "exp")]
    assert "amp_multicast" not in mxamp.summarize(out)


def test_widest_op_with_unknown_dtype_gets_one_multicast(dtype):
    """An input of unknown dtype (a variable) makes the widest op use amp_multicast."""
    out = convert(mx.sym.elemwise_add(fc(mx.sym.var("data"), "fc"), mx.sym.var("b"),
                                      name="add"), dtype)
    assert inputs_of(out, "add") == [("amp_multicast", "add_amp_multicast")] * 2
    assert mxamp.summarize(out)["amp_multicast"] == 1


def test_conditional_fp32_rule_matches_attribute(dtype):
    """Activation is float32 only when act_type matches the rule."""
    rules = [("Activation", "act_type", ["softrelu"])]
    x = fc(mx.sym.var("data"), "fc")
    soft = convert(mx.sym.Activation(x, act_type="softrelu", name="act"), dtype,
                   conditional_fp32_ops=rules)
    relu = convert(mx.sym.Activation(x, act_type="relu", name="act"), dtype,
                   conditional_fp32_ops=rules)
    assert inputs_of(soft, "act") == [("amp_cast", "float32")]
    assert inputs_of(relu, "act") == [("FullyConnected", "fc")]


def test_batchnorm_in_low_precision_keeps_float32_statistics(dtype):
    """Inputs the op itself wants in float32 (gamma, beta, moving stats) are not cast."""
    out = convert(mx.sym.BatchNorm(mx.sym.var("data"), name="bn"), dtype,
                  target_dtype_ops=["BatchNorm"])
    assert inputs_of(out, "bn") == [("amp_cast", dtype), ("null", "bn_gamma"),
                                    ("null", "bn_beta"), ("null", "bn_moving_mean"),
                                    ("null", "bn_moving_var")]


def test_integer_entries_are_never_cast(dtype):
    """Indices declared int32 reach a low-precision op uncast; the float input is cast."""
    idx = mx.sym.var("idx", dtype="int32")
    out = convert(mx.sym.take(mx.sym.var("data"), idx, name="take"), dtype,
                  target_dtype_ops=["take"])
    assert inputs_of(out, "take") == [("amp_cast", dtype), ("null", "idx")]


def test_outputs_already_float32_are_not_cast(dtype):
    """Multiple outputs: only the low-precision head gets a float32 cast."""
    x = mx.sym.var("data")
    out = convert(mx.sym.Group([fc(x, "fc"), mx.sym.exp(x, name="exp")]), dtype)
    heads = [nodes_of(out)["nodes"][h[0]] for h in nodes_of(out)["heads"]]
    assert [h["op"] for h in heads] == ["amp_cast", "exp"]


def test_cast_optional_params_stores_params_in_low_precision(dtype):
    """Params read only by low-precision ops lose their runtime cast; a param
    shared with a float32 consumer keeps float32 and its cast."""
    x = mx.sym.var("data")
    w = mx.sym.var("shared")
    a = mx.sym.FullyConnected(x, weight=w, num_hidden=4, no_bias=True, name="fc")
    b = mx.sym.broadcast_mul(mx.sym.exp(w, name="exp"), mx.sym.ones((1, 1)), name="mul")
    out = convert(mx.sym.Group([fc(x, "fc2"), a, b]), dtype, cast_optional_params=True,
                  data_names=["data"])
    assert inputs_of(out, "fc2")[1:] == [("null", "fc2_weight"), ("null", "fc2_bias")]
    assert inputs_of(out, "fc")[1] == ("amp_cast", dtype)
    attrs = out.attr_dict()
    code = "2" if dtype == "float16" else "12"
    assert attrs["fc2_weight"]["__dtype__"] == code
    assert attrs["shared"]["__dtype__"] == "0"  # read in float32 by exp: stays float32


def test_conversion_is_deterministic_and_leaves_the_input_alone(dtype):
    """The same input gives byte-identical JSON; the input symbol is unchanged."""
    sym = mx.sym.softmax(fc(mx.sym.relu(fc(mx.sym.var("data"), "fc1")), "fc2"), name="sm")
    before = sym.tojson()
    first = convert(sym, dtype).tojson(remove_amp_cast=False)
    assert convert(sym, dtype).tojson(remove_amp_cast=False) == first
    assert sym.tojson() == before


def test_cast_names_are_derived_from_the_graph(dtype):
    """Cast names say what they cast: <entry>_amp_cast_<dtype>."""
    out = convert(fc(mx.sym.var("data"), "fc"), dtype)
    names = sorted(n["name"] for n in nodes_of(out)["nodes"] if n["op"] == "amp_cast")
    assert names == sorted([f"data_amp_cast_{dtype}", f"fc_weight_amp_cast_{dtype}",
                            f"fc_bias_amp_cast_{dtype}", "fc_amp_cast_float32"])


def test_no_pass_attributes_leak_into_the_result(dtype):
    out = convert(fc(mx.sym.var("data"), "fc"), dtype)
    nodes = nodes_of(out)["nodes"]
    assert "__ext_" not in json.dumps(nodes)
    # mxamp's only attribute is the conversion marker, on the input variables
    assert {(n["op"], k) for n in nodes for k in n.get("attrs", {}) if k.startswith("__mxamp")} \
        == {("null", "__mxamp_converted__")}


def test_converted_graph_is_not_serialized_again(dtype, monkeypatch, caplog):
    """The pass's result gets its input attributes in place: no JSON round
    trip after the pass, and the converted graph is serialized only for the
    INFO summary, when that is logged. Every input carries the marker, each
    parameter its dtype."""
    sym = fc(mx.sym.relu(fc(mx.sym.var("data"), "fc1")), "fc2")
    convert(sym, dtype, data_names=["data"])  # the operators' type inference, cached
    calls = count_json_calls(monkeypatch)
    caplog.set_level(logging.WARNING, logger="mxamp")
    out = convert(sym, dtype, data_names=["data"])
    # the float32 graph and its internals (type inference), each read once
    assert calls == {"tojson": 2, "load_json": 0}
    caplog.set_level(logging.INFO, logger="mxamp")
    convert(sym, dtype)
    assert calls == {"tojson": 5, "load_json": 0}
    assert "casts inserted" in caplog.text
    attrs = {n["name"]: n.get("attrs", {}) for n in nodes_of(out)["nodes"] if n["op"] == "null"}
    assert {n: a["__mxamp_converted__"] for n, a in attrs.items()} == dict.fromkeys(attrs, dtype)
    assert {n: a.get("__dtype__") for n, a in attrs.items()} == \
        {**dict.fromkeys(attrs, "0"), "data": None}


CONVERT_IN_A_NEW_PROCESS = """
import sys, mxnet as mx, mxamp
sym = mx.sym.load_json(sys.stdin.read())
out = mxamp.convert_symbol(sym, target_dtype=sys.argv[1], data_names=["data"])
sys.stdout.write(out.tojson(remove_amp_cast=False))
"""


def test_conversion_is_byte_identical_across_processes(dtype):
    """Cast names and order come from the graph, not from hashing or counters."""
    import subprocess
    import sys
    from gluoncv import model_zoo
    net = model_zoo.get_model("mobilenetv2_0.25", pretrained=False)
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 3, 32, 32)))
    sym = net._cached_graph[1]
    here = mxamp.convert_symbol(sym, target_dtype=dtype, data_names=["data"])
    there = subprocess.run([sys.executable, "-c", CONVERT_IN_A_NEW_PROCESS, dtype],
                           input=sym.tojson(), capture_output=True, text=True, check=True)
    assert there.stdout == here.tojson(remove_amp_cast=False)
