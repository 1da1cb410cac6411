"""Policies users shape per call: per-node rules, FOLLOW ops, the fixed point
over parameters stored in low precision, and float32 scopes in model code.

Structural tests give their own lists so that they check one rule each, and
state exact cast counts and which inputs each node reads.
"""
import dataclasses
import logging

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon import nn

import mxamp
from graphs import structure
from mxamp.convert import probe
from mxamp.policy import Category, Rule, ShapesUnknownError
from mxamp.gluon import fp32_scope, keep_fp32

LISTS = {"target_dtype_ops": ["FullyConnected", "Convolution"], "fp32_ops": ["exp"],
         "conditional_fp32_ops": []}


@pytest.fixture(autouse=True)
def _untimed(monkeypatch):
    """The graphs here test lists, rules and scopes, not speed: no operator
    is kept float32 for being slow (tests/convert/test_probe.py tests that)."""
    monkeypatch.setattr(probe, "slowdown", lambda *question, measure=False: None)


def convert(sym, dtype, **kw):
    return mxamp.convert_symbol(sym, target_dtype=dtype, **{**LISTS, **kw})


def fc(x, name):
    return mx.sym.FullyConnected(x, num_hidden=4, name=name)


def conv(x, name, channels=8):
    return mx.sym.Convolution(x, num_filter=channels, kernel=(3, 3), pad=(1, 1), name=name)


def cast(dtype, entry):
    return ("amp_cast", dtype, (entry, 0))


def two_convs():
    return conv(conv(mx.sym.var("data"), "c1"), "c2")


# --- per-node rules -----------------------------------------------------------

@pytest.mark.parametrize("answer", [Category.FP32, "fp32", "FP32"])
def test_rule_fp32_keeps_one_node_in_float32(dtype, answer):
    """A rule answering FP32 (member or name, any case) for c2 only."""
    rule = Rule("Convolution", lambda n: answer if n.name == "c2" else None)
    _, ops, _ = structure(convert(two_convs(), dtype, rules=[rule]))
    assert ops["c1"] == (cast(dtype, "data"), cast(dtype, "c1_weight"), cast(dtype, "c1_bias"))
    assert ops["c2"] == (cast("float32", "c1"), ("c2_weight", 0), ("c2_bias", 0))


def test_rule_low_puts_an_fp32_listed_op_in_low_precision(dtype):
    """exp is in fp32_ops; a rule makes it low precision: its input is cast down
    and the head is cast back to float32."""
    rule = Rule("exp", lambda n: Category.LOW)
    out = convert(mx.sym.exp(mx.sym.var("data"), name="e"), dtype, rules=[rule])
    _, ops, heads = structure(out)
    assert ops["e"] == (cast(dtype, "data"),)
    assert heads == (cast("float32", "e"),)
    assert mxamp.summarize(out) == {f"amp_cast:{dtype}": 1, "amp_cast:float32": 1}


def test_rule_widest_gives_an_op_a_multicast(dtype):
    """elemwise_add made WIDEST by a rule (not by the list): one input of unknown
    dtype (a variable), so its inputs go through one amp_multicast."""
    rule = Rule("elemwise_add", lambda n: "widest")
    sym = mx.sym.elemwise_add(fc(mx.sym.var("data"), "f"), mx.sym.var("b"), name="add")
    out = convert(sym, dtype, widest_dtype_ops=[], rules=[rule])
    assert mxamp.summarize(out) == {f"amp_cast:{dtype}": 3, "amp_cast:float32": 1,
                                    "amp_multicast": 1}


def test_rule_neutral_passes_the_dtype_through(dtype):
    """exp answered NEUTRAL: it reads the low-precision fc output as it is."""
    rule = Rule("exp", lambda n: "neutral")
    out = convert(mx.sym.exp(fc(mx.sym.var("data"), "f"), name="e"), dtype, rules=[rule])
    _, ops, heads = structure(out)
    assert ops["e"] == (("f", 0),)
    assert heads == (cast("float32", "e"),)


def test_rule_follow_on_one_node(dtype):
    """Two elemwise_adds answered FOLLOW: the one with two low inputs runs low
    with no cast; the one with a float32 (exp) input runs in float32."""
    rule = Rule("elemwise_add", lambda n: Category.FOLLOW)
    x = mx.sym.var("data")
    low = mx.sym.elemwise_add(fc(x, "f1"), fc(x, "f2"), name="low_add")
    high = mx.sym.elemwise_add(fc(x, "f3"), mx.sym.exp(x, name="e"), name="high_add")
    out = convert(mx.sym.Group([low, high]), dtype, rules=[rule])
    _, ops, heads = structure(out)
    assert ops["low_add"] == (("f1", 0), ("f2", 0))
    assert ops["high_add"] == (cast("float32", "f3"), ("e", 0))
    assert heads == (cast("float32", "low_add"), ("high_add", 0))


def test_rule_sees_the_input_shape(dtype):
    """The shape rule from the docs: a convolution whose input has fewer than 4
    channels stays float32 (c1 reads 3-channel data, c2 reads 8 channels)."""
    rule = Rule("Convolution", lambda n: "fp32" if n.input_shapes[0][1] < 4 else None)
    out = convert(two_convs(), dtype, rules=[rule], input_shapes={"data": (1, 3, 8, 8)})
    _, ops, _ = structure(out)
    assert ops["c1"] == (("data", 0), ("c1_weight", 0), ("c1_bias", 0))
    assert ops["c2"][0] == cast(dtype, "c1")


def test_rule_shapes_in_convert_model_come_from_the_parameters():
    """convert_model knows parameter shapes: the weight's in-channel count
    decides, without input_shapes; the data shape stays unknown (None)."""
    seen = {}

    def few_in_channels(node):
        seen[node.name] = node.input_shapes
        return "fp32" if node.input_shapes[1][1] < 4 else None
    sym = two_convs()
    shapes, _, _ = sym.infer_shape(data=(1, 3, 8, 8))
    args = {n: mx.nd.ones(s) for n, s in zip(sym.list_arguments(), shapes) if n != "data"}
    out, _, _ = mxamp.convert_model(sym, args, {}, target_dtype="bfloat16",
                                    rules=[Rule("Convolution", few_in_channels)])
    assert seen["c1"] == (None, (8, 3, 3, 3), (8,))
    _, ops, _ = structure(out)
    assert ops["c1"][0] == ("data", 0)
    assert ops["c2"][0] == cast("bfloat16", "c1")


class Scale(nn.HybridBlock):
    """tanh(x * weight): Gluon layers whose ops have bfloat16 kernels on every
    x86 CPU (Dense and Conv need AVX512-BF16), so conversions run anywhere."""

    def __init__(self, shape, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.weight = self.params.get("weight", shape=shape)

    def hybrid_forward(self, F, x, weight):
        return F.tanh(F.broadcast_mul(x, weight, name="mul"), name="tanh")


GLUON_LISTS = {"target_dtype_ops": ["broadcast_mul", "tanh"], "fp32_ops": [],
               "conditional_fp32_ops": [], "widest_dtype_ops": []}


def check_numerics(converted, net, x):
    out, ref = converted(x).asnumpy(), net(x).asnumpy()
    assert out.dtype == np.float32
    assert np.linalg.norm(out - ref) < 3e-2 * np.linalg.norm(ref)


def test_rule_in_convert_hybrid_block_sees_shapes_and_dtypes():
    """A Gluon block: the rule sees the parameters' shapes and float32 input
    dtypes; the layer with a (1, 3) weight stays float32, the one with a
    (1, 1) weight runs in bfloat16, and the numerics hold."""
    net = nn.HybridSequential(prefix="n_")
    with net.name_scope():
        net.add(Scale((1, 3)), Scale((1, 1)))
    net.initialize(mx.init.Uniform(1))
    net.hybridize()
    x = mx.nd.random.uniform(shape=(2, 3))
    net(x)
    seen = {}

    def scalar_weight(node):
        seen[node.name] = (node.input_dtypes, node.input_shapes)
        return None if node.input_shapes[1] == (1, 1) else "fp32"
    converted = mxamp.convert_hybrid_block(net, target_dtype="bfloat16",
                                           rules=[Rule("broadcast_mul", scalar_weight)],
                                           **GLUON_LISTS)
    _, ops, heads = structure(converted._cached_graph[1])
    assert seen == {"n_scale0_mul": (("float32",) * 2, (None, (1, 3))),
                    "n_scale1_mul": (("float32",) * 2, (None, (1, 1)))}
    assert ops["n_scale0_mul"] == (("data", 0), ("n_scale0_weight", 0))
    assert ops["n_scale0_tanh"] == (cast("bfloat16", "n_scale0_mul"),)
    assert ops["n_scale1_mul"] == (("n_scale0_tanh", 0), cast("bfloat16", "n_scale1_weight"))
    assert heads == (cast("float32", "n_scale1_tanh"),)
    check_numerics(converted, net, x)


def test_rule_sees_integer_input_dtypes():
    seen = []
    rule = Rule("take", lambda n: seen.append(n.input_dtypes))
    sym = mx.sym.take(mx.sym.var("data"), mx.sym.var("idx", dtype="int32"), name="t")
    mxamp.convert_symbol(sym, target_dtype="bfloat16", rules=[rule])
    assert seen == [("float32", "int32")]


def test_rule_on_an_alias_applies_to_the_operator_it_names(dtype):
    """_sparse_FullyConnected is FullyConnected: its rule decides fc nodes."""
    rule = Rule("_sparse_FullyConnected", lambda n: "fp32")
    _, ops, _ = structure(convert(fc(mx.sym.var("data"), "f"), dtype, rules=[rule]))
    assert ops["f"] == (("data", 0), ("f_weight", 0), ("f_bias", 0))


def test_higher_priority_rule_wins_and_none_defers(dtype):
    """Priority 10 answers LOW only for c1 and defers (None) for c2, where the
    priority 0 rule's FP32 applies; list order does not matter."""
    low_c1 = Rule("Convolution", lambda n: "low" if n.name == "c1" else None, priority=10)
    all_fp32 = Rule("Convolution", lambda n: "fp32", priority=0)
    for rules in ([low_c1, all_fp32], [all_fp32, low_c1]):
        _, ops, _ = structure(convert(two_convs(), dtype, rules=rules))
        assert ops["c1"][0] == cast(dtype, "data")
        assert ops["c2"][0] == cast("float32", "c1")


def test_excluded_names_beat_rules(dtype):
    rule = Rule("Convolution", lambda n: "low")
    _, ops, _ = structure(convert(two_convs(), dtype, rules=[rule], excluded_sym_names=["c2"]))
    assert ops["c2"][0] == cast("float32", "c1")


def test_rules_are_per_call(dtype):
    """A call with rules leaves the next call without them unaffected."""
    plain = convert(two_convs(), dtype).tojson(remove_amp_cast=False)
    convert(two_convs(), dtype, rules=[Rule("Convolution", lambda n: "fp32")])
    assert convert(two_convs(), dtype).tojson(remove_amp_cast=False) == plain


def test_node_info_is_read_only():
    def mutate(node):
        node.attrs["num_filter"] = "1"
    with pytest.raises(RuntimeError, match=r"on node 'c1' \(Convolution\) raised TypeError"):
        mxamp.convert_symbol(two_convs(), target_dtype="bfloat16",
                             rules=[Rule("Convolution", mutate)])

    def rename(node):
        node.name = "x"
    with pytest.raises(RuntimeError, match="raised FrozenInstanceError"):
        mxamp.convert_symbol(two_convs(), target_dtype="bfloat16",
                             rules=[Rule("Convolution", rename)])


# --- invalid rules --------------------------------------------------------------

def bad_answer(node):
    return 42


@pytest.mark.parametrize("fn, error, match", [
    (bad_answer, ValueError,
     r"Rule\(op='Convolution', fn=bad_answer, priority=0\) on node 'c1' \(Convolution\) "
     r"returned 42 is not a rule category; allowed: None or LOW, FP32, FOLLOW, WIDEST, "
     r"NEUTRAL"),
    (lambda n: "half", ValueError, r"on node 'c1' \(Convolution\) returned 'half' is not a "
                                   "rule category"),
    (lambda n: Category.CONDITIONAL, ValueError, "returned <Category.CONDITIONAL"),
    (lambda n: np.zeros(2), ValueError, r"returned array\(\[0., 0.\]\) is not a rule category"),
    (lambda n: 1 / 0, RuntimeError, r"fn=<lambda>.* on node 'c1' \(Convolution\) raised "
                                    "ZeroDivisionError: division by zero"),
    (lambda n: n.input_shapes, ShapesUnknownError,
     r"on node 'c1' \(Convolution\): input shapes of node 'c1' are unknown: pass "
     r"input_shapes="),
])
def test_bad_rule_results_name_the_rule_and_the_node(fn, error, match):
    with pytest.raises(error, match=match):
        mxamp.convert_symbol(two_convs(), target_dtype="bfloat16",
                             rules=[Rule("Convolution", fn)])


def test_shapes_unknown_is_a_value_error():
    assert issubclass(ShapesUnknownError, ValueError)


@pytest.mark.parametrize("make, error, match", [
    (lambda: Rule("Convolution", 3), TypeError,
     "Rule for op 'Convolution': fn must be callable, got 3"),
    (lambda: Rule(None, print), TypeError, "Rule op must be an operator name"),
    (lambda: Rule("exp", print, priority="high"), TypeError, "priority must be an int"),
])
def test_malformed_rules(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("rules, error, match", [
    ([Rule("Conv", print)], ValueError,
     r"rules names operators MXNet does not know: 'Conv' \(did you mean 'Concat'\?\)"),
    ([Rule("exp", print, 1), Rule("exp", len, 1)], ValueError,
     r"rules for op 'exp' share a priority: .*fn=print.*fn=len"),
    (Rule("exp", print), TypeError, "rules must be a list of mxamp.Rule"),
    ([("exp", print)], TypeError, "rules must be a list of mxamp.Rule"),
    ({"input_shapes": [1, 2]}, TypeError, "input_shapes must be a dict of input name"),
    ({"input_shapes": {"image": (1, 3, 8, 8)}, "rules": [Rule("exp", print)]}, ValueError,
     r"input_shapes names \['image'\], which are not inputs of the graph"),
    ({"input_shapes": {"data": (1, 5, 8, 8, 8)}, "rules": [Rule("exp", print)]}, ValueError,
     r"the shapes of \['data'\] do not fit the graph: .*Error in operator c1"),
])
def test_invalid_rule_lists(rules, error, match):
    kwargs = rules if isinstance(rules, dict) else {"rules": rules}
    with pytest.raises(error, match=match):
        mxamp.convert_symbol(two_convs(), target_dtype="bfloat16", **kwargs)


def test_rule_records_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Rule("exp", print).priority = 3


# --- FOLLOW vs WIDEST ---------------------------------------------------------------

def follow_vs_widest_graph(low=fc):
    """Four adds over one low-precision fc output:
    both_low: fc + fc2 (both inputs low);  with_fp32: fc + exp (a float32 input);
    with_var: fc + b (a variable, dtype not produced by the graph);
    with_data: data + fc (data is float32 and also cast to low for fc; fc is also
    cast to float32 for with_fp32)."""
    x = mx.sym.var("data")
    f, f2 = low(x, "fc"), low(x, "fc2")
    return mx.sym.Group([
        mx.sym.broadcast_add(f, f2, name="both_low"),
        mx.sym.broadcast_add(f, mx.sym.exp(x, name="e"), name="with_fp32"),
        mx.sym.broadcast_add(f, mx.sym.var("b"), name="with_var"),
        mx.sym.broadcast_add(x, f, name="with_data")])


def test_follow_and_widest_on_the_same_graph(dtype):
    """WIDEST decides by the widest dtype available, using an amp_multicast when
    a dtype is unknown and reusing a low-precision cast made for another node;
    FOLLOW decides statically from each input's own dtype: low only when all
    are low, otherwise float32, and it never casts an input down."""
    widest = convert(follow_vs_widest_graph(), dtype, widest_dtype_ops=["broadcast_add"])
    follow = convert(follow_vs_widest_graph(), dtype, widest_dtype_ops=[],
                     follow_ops=["broadcast_add"])
    _, w_ops, _ = structure(widest)
    _, f_ops, f_heads = structure(follow)
    for ops in (w_ops, f_ops):
        assert ops["both_low"] == (("fc", 0), ("fc2", 0))
        assert ops["with_fp32"] == (cast("float32", "fc"), ("e", 0))
    multicast = ("amp_multicast", (("fc", 0), ("b", 0)))
    assert w_ops["with_var"] == (("amp_multicast", 0, multicast[1]),
                                 ("amp_multicast", 1, multicast[1]))
    assert f_ops["with_var"] == (cast("float32", "fc"), ("b", 0))
    # WIDEST reuses the casts it finds: fc's float32 cast makes it float32 here.
    assert w_ops["with_data"] == (cast("float32", "data"), cast("float32", "fc"))
    assert f_ops["with_data"] == (("data", 0), cast("float32", "fc"))
    assert mxamp.summarize(widest) == {f"amp_cast:{dtype}": 5, "amp_cast:float32": 4,
                                       "amp_multicast": 1}
    # FOLLOW: one float32 cast of fc shared by three adds; both_low's head cast.
    assert mxamp.summarize(follow) == {f"amp_cast:{dtype}": 5, "amp_cast:float32": 2}
    assert f_heads == (cast("float32", "both_low"), ("with_fp32", 0), ("with_var", 0),
                       ("with_data", 0))


def test_widest_reuses_a_low_cast_follow_reads_the_entry_itself(dtype):
    """data + fc alone: data has a low-precision cast (made for fc), so WIDEST
    adds in low precision from that cast; FOLLOW sees data itself is float32
    and adds in float32, casting fc up instead."""
    x = mx.sym.var("data")
    sym = mx.sym.broadcast_add(x, fc(x, "fc"), name="add")
    _, w_ops, _ = structure(convert(sym, dtype, widest_dtype_ops=["broadcast_add"]))
    _, f_ops, _ = structure(convert(sym, dtype, widest_dtype_ops=[],
                                    follow_ops=["broadcast_add"]))
    assert w_ops["add"] == (cast(dtype, "data"), ("fc", 0))
    assert f_ops["add"] == (("data", 0), cast("float32", "fc"))


def test_follow_chain_follows_its_first_link(dtype):
    """A chain of FOLLOW ops after a low op stays low with no casts; after a
    float32 op it stays float32 with no casts."""
    def chain(x, p):
        return mx.sym.sqrt(mx.sym.abs(mx.sym.square(x, name=p + "sq"), name=p + "ab"),
                           name=p + "sr")
    x = mx.sym.var("data")
    sym = mx.sym.Group([chain(fc(x, "f"), "low_"), chain(mx.sym.exp(x, name="e"), "hi_")])
    out = convert(sym, dtype, follow_ops=["square", "abs", "sqrt"])
    _, ops, heads = structure(out)
    assert [ops[f"low_{n}"] for n in ("sq", "ab", "sr")] == [
        (("f", 0),), (("low_sq", 0),), (("low_ab", 0),)]
    assert [ops[f"hi_{n}"] for n in ("sq", "ab", "sr")] == [
        (("e", 0),), (("hi_sq", 0),), (("hi_ab", 0),)]
    assert heads == (cast("float32", "low_sr"), ("hi_sr", 0))
    assert mxamp.summarize(out) == {f"amp_cast:{dtype}": 3, "amp_cast:float32": 1}


def test_follow_ops_default_is_empty_and_take_ops_out_of_default_lists():
    """follow_ops=[] changes nothing; follow_ops moves a default-widest op."""
    sym = follow_vs_widest_graph()
    assert mxamp.convert_symbol(sym, target_dtype="bfloat16", follow_ops=[]).tojson(
        remove_amp_cast=False) == mxamp.convert_symbol(sym, target_dtype="bfloat16").tojson(
        remove_amp_cast=False)
    out = mxamp.convert_symbol(sym, target_dtype="bfloat16", follow_ops=["broadcast_add"])
    assert "amp_multicast" not in mxamp.summarize(out)


def test_follow_ops_may_not_overlap_a_list_given_explicitly():
    with pytest.raises(ValueError, match=r"both follow_ops and widest_dtype_ops: "
                                         r"\['broadcast_add'\]"):
        mxamp.convert_symbol(follow_vs_widest_graph(), follow_ops=["broadcast_add"],
                             widest_dtype_ops=["broadcast_add"])
    with pytest.raises(ValueError, match=r"follow_ops names operators MXNet does not know: "
                                         r"'nope'; see"):
        mxamp.convert_symbol(follow_vs_widest_graph(), follow_ops=["nope"])


def test_follow_runs_and_matches_float32():
    """bfloat16 with broadcast_add as FOLLOW runs and stays close to float32
    (relative L2 error below 3e-2, bfloat16's tolerance in test_api). The low
    op is tanh, which has a bfloat16 kernel on every x86 CPU."""
    sym = follow_vs_widest_graph(lambda x, name: mx.sym.tanh(x, name=name))
    args = {n: mx.nd.random.uniform(-1, 1, shape=(2, 4)) for n in sym.list_arguments()}
    ref = [o.asnumpy() for o in sym.bind(mx.cpu(), args, grad_req="null").forward()]
    out = mxamp.convert_symbol(sym, target_dtype="bfloat16", target_dtype_ops=["tanh"],
                               follow_ops=["broadcast_add"])
    assert mxamp.summarize(out) == {"amp_cast:bfloat16": 1, "amp_cast:float32": 2}
    got = [o.asnumpy() for o in out.bind(mx.cpu(), args, grad_req="null").forward()]
    for g, r in zip(got, ref):
        assert g.dtype == np.float32
        assert np.linalg.norm(g - r) < 3e-2 * np.linalg.norm(r)


# --- fixed point: parameters stored low <-> FOLLOW consumers -------------------------

def scaled(first):
    """y1 = fc(x) * w (w a shared parameter); y2 = exp(x) * w; both muls FOLLOW."""
    x, w = mx.sym.var("data"), mx.sym.var("w", shape=(1, 4))
    y1 = mx.sym.broadcast_mul(fc(x, "f"), w, name="y1")
    y2 = mx.sym.broadcast_mul(mx.sym.exp(x, name="e"), w, name="y2")
    return mx.sym.Group([y1, y2] if first == "y1" else [y2, y1])


def convert_scaled(sym, dtype):
    return convert(sym, dtype, follow_ops=["broadcast_mul"], cast_optional_params=True,
                   data_names=["data"])


def test_parameter_read_by_follow_ops_is_stored_low_when_all_run_low(dtype):
    """Alone, y1 (low fc output times w) runs low and w is stored in low
    precision: no cast at all on w."""
    x, w = mx.sym.var("data"), mx.sym.var("w", shape=(1, 4))
    out = convert_scaled(mx.sym.broadcast_mul(fc(x, "f"), w, name="y1"), dtype)
    _, ops, _ = structure(out)
    assert ops["y1"] == (("f", 0), ("w", 0))
    assert out.attr_dict()["w"]["__dtype__"] == str(mxamp.dtypes.DTYPE_CODES[dtype])


@pytest.mark.parametrize("first", ["y1", "y2"])
def test_fixed_point_over_a_shared_parameter_is_order_independent(dtype, first):
    """y2 needs w in float32 (exp is float32), so w stays float32, so y1 cannot
    run low either: its fc input is cast up. Same result in both visit orders."""
    out = convert_scaled(scaled(first), dtype)
    _, ops, _ = structure(out)
    assert ops["y1"] == (cast("float32", "f"), ("w", 0))
    assert ops["y2"] == (("e", 0), ("w", 0))
    assert out.attr_dict()["w"]["__dtype__"] == "0"  # stays float32
    # data cast down for fc (fc's weight and bias are stored low), fc cast up for y1
    assert mxamp.summarize(out) == {f"amp_cast:{dtype}": 1, "amp_cast:float32": 1}


def chained(order):
    """y1 = fc(x) * w1, y2 = exp(x) * w1, z = y1 * w2 (all muls FOLLOW).
    Refuting w1 (y2 reads it in float32) turns y1 float32, which refutes w2
    only on the next walk: three walks reach the fixed point."""
    x, w1, w2 = (mx.sym.var(n, shape=(1, 4)) for n in ("data", "w1", "w2"))
    y1 = mx.sym.broadcast_mul(fc(x, "f"), w1, name="y1")
    outputs = {"y2": mx.sym.broadcast_mul(mx.sym.exp(x, name="e"), w1, name="y2"),
               "z": mx.sym.broadcast_mul(y1, w2, name="z")}
    return mx.sym.Group([outputs[n] for n in order])


@pytest.mark.parametrize("order", [("y2", "z"), ("z", "y2")])
def test_fixed_point_iterates_until_nothing_changes(dtype, order, caplog):
    with caplog.at_level(logging.DEBUG, logger="mxamp.convert.decide"):
        out = convert_scaled(chained(order), dtype)
    assert "walk 1: parameters ['w1'] are not read in low precision" in caplog.text
    assert "walk 2: parameters ['w2'] are not read in low precision" in caplog.text
    assert "fixed point after 3 walk(s)" in caplog.text
    _, ops, heads = structure(out)
    assert ops["y1"] == (cast("float32", "f"), ("w1", 0))
    assert ops["y2"] == (("e", 0), ("w1", 0))
    assert ops["z"] == (("y1", 0), ("w2", 0))
    assert set(heads) == {("y2", 0), ("z", 0)}
    attrs = out.attr_dict()
    assert attrs["f_weight"]["__dtype__"] == str(mxamp.dtypes.DTYPE_CODES[dtype])
    assert all(attrs[w]["__dtype__"] == "0" for w in ("w1", "w2"))  # read in float32


def test_fixed_point_keeps_a_consistent_chain_low(dtype, caplog):
    """Without the float32 reader y2, w1 and w2 are both stored low and the
    whole chain runs low with no cast: one walk confirms the assumption."""
    x, w1, w2 = (mx.sym.var(n, shape=(1, 4)) for n in ("data", "w1", "w2"))
    z = mx.sym.broadcast_mul(mx.sym.broadcast_mul(fc(x, "f"), w1, name="y1"), w2, name="z")
    with caplog.at_level(logging.DEBUG, logger="mxamp.convert.decide"):
        out = convert_scaled(z, dtype)
    assert "fixed point after 1 walk(s)" in caplog.text
    _, ops, heads = structure(out)
    assert ops["y1"] == (("f", 0), ("w1", 0))
    assert ops["z"] == (("y1", 0), ("w2", 0))
    assert heads == (cast("float32", "z"),)
    assert mxamp.summarize(out) == {f"amp_cast:{dtype}": 1, "amp_cast:float32": 1}


# --- float32 scopes in model code --------------------------------------------------------

class Scoped(nn.HybridBlock):
    def __init__(self):
        super().__init__(prefix="net_")
        with self.name_scope():
            self.body = Scale((1, 3))
            with fp32_scope():
                self.head = nn.HybridSequential()
                self.head.add(Scale((1, 3)), nn.HybridLambda("exp"))

    def hybrid_forward(self, F, x):
        return self.head(F.relu(self.body(x)))


def test_fp32_scope_keeps_the_blocks_created_inside_in_float32():
    """The head (a Sequential whose children were created in the scope, outside
    its own name_scope) runs in float32; the body stays bfloat16."""
    net = Scoped()
    assert mx.gluon.Block.__init__.__qualname__ == "Block.__init__"  # scope closed
    net.initialize(mx.init.Uniform(1))
    net.hybridize()
    x = mx.nd.random.uniform(shape=(2, 3))
    net(x)
    converted = mxamp.convert_hybrid_block(net, target_dtype="bfloat16",
                                           **{**GLUON_LISTS, "target_dtype_ops": [
                                               "broadcast_mul", "tanh", "exp"]})
    _, ops, heads = structure(converted._cached_graph[1])
    assert ops["net_scale0_mul"] == (cast("bfloat16", "data"),
                                     cast("bfloat16", "net_scale0_weight"))
    assert ops["net_relu0"] == (("net_scale0_tanh", 0),)
    assert ops["net_scale1_mul"] == (cast("float32", "net_relu0"), ("net_scale1_weight", 0))
    assert ops["net_scale1_tanh"] == (("net_scale1_mul", 0),)
    assert ops["net_hybridlambda0_exp0"] == (("net_scale1_tanh", 0),)
    assert heads == (("net_hybridlambda0_exp0", 0),)
    assert mxamp.summarize(converted._cached_graph[1]) == {"amp_cast:bfloat16": 2,
                                                           "amp_cast:float32": 1}
    check_numerics(converted, net, x)


def test_keep_fp32_marks_an_existing_block_and_adds_to_user_exclusions():
    net = nn.HybridSequential(prefix="s_")
    with net.name_scope():
        net.add(Scale((1, 3)), Scale((1, 3)), Scale((1, 3)))
    keep_fp32(net[2])
    net.initialize(mx.init.Uniform(1))
    net.hybridize()
    x = mx.nd.random.uniform(shape=(2, 3))
    net(x)
    converted = mxamp.convert_hybrid_block(net, target_dtype="bfloat16",
                                           excluded_sym_names=["s_scale0_mul"], **GLUON_LISTS)
    _, ops, _ = structure(converted._cached_graph[1])
    assert ops["s_scale0_mul"] == (("data", 0), ("s_scale0_weight", 0))
    assert ops["s_scale0_tanh"] == (cast("bfloat16", "s_scale0_mul"),)
    assert ops["s_scale1_mul"] == (("s_scale0_tanh", 0), cast("bfloat16", "s_scale1_weight"))
    assert ops["s_scale2_mul"] == (cast("float32", "s_scale1_tanh"), ("s_scale2_weight", 0))
    assert ops["s_scale2_tanh"] == (("s_scale2_mul", 0),)
    check_numerics(converted, net, x)


def test_scope_marks_only_blocks_built_inside_it_and_only_in_its_thread():
    import threading
    outside = nn.Dense(2)
    with fp32_scope():
        inside = nn.Dense(2)
        other = []
        thread = threading.Thread(target=lambda: other.append(nn.Dense(2)))
        thread.start()
        thread.join()
    after = nn.Dense(2)
    assert getattr(inside, "_mxamp_fp32", False)
    assert not any(getattr(b, "_mxamp_fp32", False) for b in (outside, after, other[0]))


def test_keep_fp32_rejects_non_blocks():
    with pytest.raises(TypeError, match="keep_fp32 takes a gluon Block, got str"):
        keep_fp32("dense0")
