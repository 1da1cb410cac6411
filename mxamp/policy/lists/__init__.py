"""mxamp's own operator placement, one module per target dtype: the
operators mxnet.contrib.amp's lists omit and the deliberate differences
(policy.defaults.OWN_PLACEMENT). policy.defaults joins them with the
reference's placement into the default lists, in which every registered
operator (backward ops aside) sits in exactly one category;
tests/policy/test_lists.py keeps both true."""
from . import symbol_bf16, symbol_fp16

__all__ = ["symbol_bf16", "symbol_fp16"]
