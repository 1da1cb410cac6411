"""The entry points build one ConversionOptions from their arguments: a bad
option raises the same error, word for word, from each of them and from the
options themselves; equivalent calls build equal options."""
import dataclasses
import inspect

import mxnet as mx
import pytest
from mxnet.gluon import nn

import mxamp
from mxamp.convert import api
from mxamp.convert.options import ConversionOptions
from mxamp.errors import OptionError, OptionTypeError
from mxamp.gluon import model_of


def small_net():
    x = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc")
    return mx.sym.softmax(x, name="sm")


def small_model():
    sym = small_net()
    shapes, _, _ = sym.infer_shape(data=(2, 3))
    args = {n: mx.nd.ones(s) for n, s in zip(sym.list_arguments(), shapes) if n != "data"}
    return sym, args, {}


def small_block():
    net = nn.Dense(4)
    net.initialize()
    net.hybridize()
    net(mx.nd.ones((2, 3)))
    return net


ENTRY_POINTS = {
    "convert_symbol": lambda kwargs: mxamp.convert_symbol(small_net(), **kwargs),
    "convert_model": lambda kwargs: mxamp.convert_model(*small_model(), **kwargs),
    "convert_hybrid_block": lambda kwargs: mxamp.convert_hybrid_block(small_block(), **kwargs),
    "ConversionOptions": lambda kwargs: ConversionOptions(**kwargs),
}
PUBLIC = {"convert_symbol": mxamp.convert_symbol, "convert_model": mxamp.convert_model,
          "convert_hybrid_block": mxamp.convert_hybrid_block,
          "ConversionOptions": ConversionOptions}

# (bad options, the error, its whole message), as the entry points raised them
# before they shared the options object.
BAD = [
    ({"target_dtype": "float64"}, OptionError,
     "target_dtype 'float64' is not supported; allowed: float16, bfloat16"),
    ({"fp32_ops": "exp"}, OptionTypeError, "fp32_ops must be a list of str, got 'exp'"),
    ({"cast_optional_params": "yes"}, OptionTypeError,
     "cast_optional_params must be True or False, got 'yes'"),
    ({"ctx": "cpu"}, OptionTypeError,
     "ctx must be an mxnet.Context (e.g. mx.cpu()) or None, got 'cpu'"),
    ({"backend_compute": "float32"}, OptionError,
     "backend_compute is what a backend's regions compute in: it needs backend='onednn'"),
]


def takes(entry, kwargs):
    return set(kwargs) <= set(inspect.signature(PUBLIC[entry]).parameters)


@pytest.mark.parametrize("entry, kwargs, error, message", [
    (entry, kwargs, error, message) for kwargs, error, message in BAD
    for entry in ENTRY_POINTS if takes(entry, kwargs)])
def test_a_bad_option_raises_the_same_error_from_every_entry_point(entry, kwargs, error,
                                                                    message):
    with pytest.raises(error) as raised:
        ENTRY_POINTS[entry](kwargs)
    assert type(raised.value) is error
    assert str(raised.value) == message


def test_every_bad_option_is_tried_on_several_entry_points():
    assert all(sum(takes(entry, kwargs) for entry in ENTRY_POINTS) >= 3 for kwargs, _, _ in BAD)


class Built(Exception):
    """Stops a conversion once its options reach the conversion proper."""


@pytest.fixture
def built(monkeypatch):
    """The options each conversion hands to the conversion proper, with the
    model's defaults filled in."""
    seen = []

    def record(sym, graph, policy, options, param_dtypes, backend_nodes=frozenset()):
        seen.append(options)
        raise Built

    monkeypatch.setattr(api, "_convert", record)
    return seen


OPTIONS = {"target_dtype": "bfloat16", "fp32_ops": ["exp"], "excluded_sym_names": ["fc"],
           "cast_optional_params": True, "keep_io_types": False, "input_shapes": {"data": (2, 3)}}


def test_equivalent_calls_build_equal_options(built):
    expected = ConversionOptions(**OPTIONS, data_names=["data"], ctx=mx.cpu())
    with pytest.raises(Built):
        mxamp.convert_symbol(small_net(), data_names=["data"], ctx=mx.cpu(), **OPTIONS)
    with pytest.raises(Built):
        mxamp.convert_model(*small_model(), ctx=mx.cpu(), **OPTIONS)
    block = small_block()
    with pytest.raises(Built):
        mxamp.convert_model(*model_of(block, "converting it")[:3], ctx=mx.cpu(), **OPTIONS)
    with pytest.raises(Built):
        mxamp.convert_hybrid_block(block, ctx=mx.cpu(), **OPTIONS)
    assert built == [expected] * 4


def test_a_different_option_builds_different_options(built):
    for cast in (False, True):
        with pytest.raises(Built):
            mxamp.convert_model(*small_model(), cast_optional_params=cast)
    assert built[0] != built[1]
    assert dataclasses.replace(built[0], cast_optional_params=True) == built[1]


def test_each_entry_point_fills_in_its_own_default_data_names(built):
    """convert_symbol: the inputs without a __dtype__; convert_model: those
    without a parameter; convert_hybrid_block: the block's inputs."""
    for call in (lambda: mxamp.convert_symbol(small_net()),
                 lambda: mxamp.convert_model(*small_model()),
                 lambda: mxamp.convert_hybrid_block(small_block(), ctx=mx.cpu())):
        with pytest.raises(Built):
            call()
    assert [o.data_names for o in built] == [["data", "fc_weight", "fc_bias"], ["data"],
                                             ["data"]]


def test_options_are_frozen_and_checked_again_when_replaced():
    options = ConversionOptions(target_dtype="bfloat16")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.ctx = mx.cpu()
    with pytest.raises(OptionTypeError, match="ctx must be an mxnet.Context"):
        dataclasses.replace(options, ctx="cpu")


def test_a_converted_block_keeps_the_options_it_was_converted_with():
    """apply_backend_block converts the float32 graph again with them."""
    result = mxamp.convert_hybrid_block(small_block(), target_dtype="bfloat16",
                                        fp32_ops=["exp"])
    assert result._mxamp_plan[1] == ConversionOptions(
        target_dtype="bfloat16", fp32_ops=["exp"], data_names=["data"], ctx=mx.cpu())


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "onednn", "target_dtype": "float16"}, "runs bfloat16 models"),
    ({"backend": "onednn", "target_dtype": "bfloat16", "ctx": "cpu"}, "ctx must be"),
    ({"backend": "tvm", "target_dtype": "bfloat16"}, "backend must be None or 'onednn'")])
def test_a_bad_option_is_named_before_the_backend_loads(monkeypatch, kwargs, message):
    """Loading the backend may build its library (minutes on a new machine):
    a mistake in the options is named first."""
    def refuse():
        raise AssertionError("the backend was loaded")
    monkeypatch.setattr(mxamp.backends.onednn, "load", refuse)
    with pytest.raises((OptionError, OptionTypeError), match=message):
        ConversionOptions(**kwargs)


def test_good_options_with_a_backend_load_it(monkeypatch):
    loaded = []
    monkeypatch.setattr(mxamp.backends.onednn, "load", lambda: loaded.append(True))
    ConversionOptions(backend="onednn", target_dtype="bfloat16")
    assert loaded == [True]
