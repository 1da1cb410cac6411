"""The decision walk's entry states and its once-per-operator reports."""
import logging

import mxnet as mx
import pytest

import mxamp
from mxamp.convert.decide import _Entry


def test_entry_is_cast_once_per_dtype_and_never_to_its_own():
    entry = _Entry(castable=True)
    entry.own = 0  # float32 itself
    assert not entry.as_type(0) and entry.casts == set()
    assert entry.as_type(2) and entry.as_type(2)  # the pass keeps one cast per dtype
    assert entry.casts == {2} and entry.has(0) and entry.has(2) and not entry.has(12)


def test_integer_entry_is_never_cast():
    entry = _Entry(castable=False)
    assert not entry.as_type(2) and not entry.has(2)


def three_layers():
    x = mx.sym.var("data")
    for i in range(3):
        x = mx.sym.FullyConnected(x, num_hidden=4, name=f"fc{i}")
    return mx.sym.softmax(x, name="out")


def test_missing_kernels_are_reported_once_per_operator_with_counts(caplog):
    """No float16 FullyConnected on a CPU: one WARNING names it with its count."""
    with caplog.at_level(logging.INFO, logger="mxamp"):
        out = mxamp.convert_symbol(three_layers(), target_dtype="float16", ctx=mx.cpu())
    assert mxamp.summarize(out) == {}
    kept = [r for r in caplog.records if "kept in float32" in r.getMessage()]
    assert len(kept) == 1 and kept[0].levelname == "WARNING"
    assert "(no float16 kernel on cpu(0)): FullyConnected x3." in kept[0].getMessage()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_operators_in_no_list_are_reported_once_with_counts(caplog, dtype):
    """fp32_ops=[] replaces the float32 list, so softmax is in none of them."""
    with caplog.at_level(logging.INFO, logger="mxamp"):
        mxamp.convert_symbol(three_layers(), target_dtype=dtype, fp32_ops=[])
    lines = [r.getMessage() for r in caplog.records if "in none of" in r.getMessage()]
    assert lines == [f"operators in none of the {dtype} lists, run in their input's dtype: "
                     "softmax x1"]
