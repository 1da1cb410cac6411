"""Bad input gets a clear exception naming the bad value and what is allowed."""

import mxnet as mx
import pytest
from mxnet.base import MXNetError

import mxamp
from mxamp import _lib


def small_net():
    x = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc")
    return mx.sym.softmax(x, name="sm")


def params_of(sym):
    shapes, _, _ = sym.infer_shape(data=(2, 3))
    return {n: mx.nd.ones(s) for n, s in zip(sym.list_arguments(), shapes) if n != "data"}


@pytest.mark.parametrize("bad", ["float64", "int8", "fp16", 3])
def test_invalid_target_dtype(bad):
    with pytest.raises(ValueError, match=r"target_dtype .* not supported; allowed: float16, "
                                         r"bfloat16"):
        mxamp.convert_symbol(small_net(), target_dtype=bad)


def test_overlapping_lists():
    with pytest.raises(ValueError, match=r"both target_dtype_ops and fp32_ops: "
                                         r"\['FullyConnected'\]"):
        mxamp.convert_symbol(small_net(), target_dtype_ops=["FullyConnected"],
                             fp32_ops=["FullyConnected", "exp"])


def test_overlap_through_an_alias():
    """_sparse_FullyConnected is FullyConnected: listing both ways is an overlap."""
    with pytest.raises(ValueError, match="FullyConnected"):
        mxamp.convert_symbol(small_net(), target_dtype_ops=["FullyConnected"],
                             fp32_ops=["_sparse_FullyConnected"])


def test_overlap_with_conditional_rules():
    with pytest.raises(ValueError, match=r"both fp32_ops and conditional_fp32_ops: "
                                         r"\['Activation'\]"):
        mxamp.convert_symbol(small_net(), fp32_ops=["Activation"],
                             conditional_fp32_ops=[("Activation", "act_type", ["softrelu"])])


def test_unknown_op_names():
    with pytest.raises(ValueError, match=r"fp32_ops names operators MXNet does not know: "
                                         r"\['NoSuchOp', 'Zzz'\]"):
        mxamp.convert_symbol(small_net(), fp32_ops=["Zzz", "exp", "NoSuchOp"])


def test_unknown_conditional_op():
    with pytest.raises(ValueError, match="conditional_fp32_ops names operator 'NoSuchOp'"):
        mxamp.convert_symbol(small_net(), conditional_fp32_ops=[("NoSuchOp", "a", ["b"])])


@pytest.mark.parametrize("kwargs, match", [
    ({"excluded_sym_names": "fc"}, "excluded_sym_names must be a list of str"),
    ({"excluded_sym_names": [1]}, "excluded_sym_names must be a list of str"),
    ({"target_dtype_ops": "Convolution"}, "target_dtype_ops must be a list of str"),
    ({"fp32_ops": None, "conditional_fp32_ops": "Activation"},
     "conditional_fp32_ops must be a list"),
    ({"conditional_fp32_ops": [("Activation", "act_type", "softrelu")]},
     r"entries must be \(op: str, attribute: str, values: list of str\)"),
    ({"data_names": "data"}, "data_names must be a list of str"),
    ({"keep_io_types": "no"}, "keep_io_types must be True or False, got 'no'"),
])
def test_wrong_option_types(kwargs, match):
    with pytest.raises(TypeError, match=match):
        mxamp.convert_symbol(small_net(), **kwargs)


def test_not_a_symbol():
    with pytest.raises(TypeError, match="sym must be an mxnet.symbol.Symbol, got str"):
        mxamp.convert_symbol("net.json")


def test_data_names_not_in_graph():
    with pytest.raises(ValueError, match=r"data_names \['image'\] are not inputs"):
        mxamp.convert_symbol(small_net(), data_names=["image"])


def test_already_converted():
    converted = mxamp.convert_symbol(small_net(), target_dtype="bfloat16")
    with pytest.raises(ValueError, match="already converted"):
        mxamp.convert_symbol(converted, target_dtype="bfloat16")


def test_float32_models_with_their_own_multicast_are_not_taken_as_converted():
    """GluonCV's box decoders hold amp_multicast in the float32 model."""
    a, b = mx.sym.var("a"), mx.sym.var("data")
    both = mx.sym.amp_multicast(a, b, num_outputs=2, name="mc")
    sym = mx.sym.FullyConnected(mx.sym.elemwise_add(both[0], both[1]), num_hidden=2, name="fc")
    out = mxamp.convert_symbol(sym, target_dtype="bfloat16")
    # the model's own multicast, plus one for elemwise_add (its inputs' dtypes
    # are unknown); FullyConnected's three inputs and the output are cast
    assert mxamp.summarize(out) == {"amp_multicast": 2, "amp_cast:bfloat16": 3,
                                    "amp_cast:float32": 1}


def test_excluded_names_missing_from_graph_warn():
    with pytest.warns(UserWarning, match=r"not found in the graph: \['nope1', 'nope2'\]"):
        mxamp.convert_symbol(small_net(), excluded_sym_names=["fc", "nope2", "nope1"])


def test_params_not_a_dict():
    with pytest.raises(TypeError, match="arg_params must be a dict of str to mxnet.nd.NDArray"):
        mxamp.convert_model(small_net(), [mx.nd.ones(1)], {})


def test_params_missing_for_graph_inputs():
    sym = small_net()
    params = params_of(sym)
    del params["fc_bias"]
    with pytest.raises(ValueError, match=r"no parameter given for the graph inputs "
                                         r"\['fc_bias'\]"):
        mxamp.convert_model(sym, params, {}, data_names=["data"])


def test_aux_params_missing():
    sym = mx.sym.BatchNorm(mx.sym.var("data"), name="bn")
    with pytest.raises(ValueError, match=r"no value for the auxiliary states "
                                         r"\['bn_moving_mean', 'bn_moving_var'\]"):
        mxamp.convert_model(sym, {}, {})


def test_block_not_hybrid():
    with pytest.raises(TypeError, match="block must be a gluon HybridBlock, got Block"):
        mxamp.convert_hybrid_block(mx.gluon.nn.Block())


@pytest.mark.parametrize("hybridize", [False, True])
def test_block_never_hybridized_or_run(hybridize):
    net = mx.gluon.nn.Dense(3)
    net.initialize()
    if hybridize:
        net.hybridize()  # hybridized but never run
    with pytest.raises(RuntimeError, match=r"call block.hybridize\(\) and run one forward pass"):
        mxamp.convert_hybrid_block(net)


@pytest.mark.parametrize("decisions, match", [
    ("3 ll fc", "node 'fc' .* has 3 inputs but its cast decision 'll' has 2 entries"),
    ("3 lxl fc", "node 'fc' has unknown cast code 'x' for input 1"),
    ("3 mlm fc", "node 'fc' mixes multicast with other decisions"),
    ("2 lll fc", "decision for node 'fc' names index 2, which holds 'fc_bias'"),
    ("99 lll fc", "names index 99, which holds no node"),
    ("fc lll", "malformed decision line 'fc lll'"),
])
def test_pass_errors_come_back_as_exceptions_with_the_node_name(decisions, match):
    """Bad decisions reaching the C++ pass raise in Python instead of aborting."""
    _lib.load()
    with pytest.raises(MXNetError, match=match):
        small_net().optimize_for(_lib.PASS_NAME, skip_infer=True, target_dtype="float16",
                                 decisions=decisions, outputs="f")


@pytest.mark.parametrize("options, match", [
    ({"target_dtype": "int8", "outputs": "f", "decisions": ""},
     "target_dtype must be 'float16' or 'bfloat16'"),
    ({"target_dtype": "float16", "decisions": ""}, "option 'outputs'"),
    ({"target_dtype": "float16", "outputs": "f"}, "option 'decisions'"),
    ({"target_dtype": "float16", "outputs": "ff", "decisions": ""},
     "graph has 1 outputs but the output decision 'ff' has 2 entries"),
])
def test_pass_option_errors(options, match):
    _lib.load()
    with pytest.raises(MXNetError, match=match):
        small_net().optimize_for(_lib.PASS_NAME, skip_infer=True, **options)
